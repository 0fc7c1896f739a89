package train

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/curriculum"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/reward"
	"github.com/ortrain/ortrain/internal/rollout"
	"github.com/ortrain/ortrain/internal/worker"
)

// Shape letters used below: K unique prompts per round, G completions per
// prompt, B rows per micro-batch, S micro-batches per round, GA micro-steps
// per optimizer step, mu passes over each round.

// Policy is the trainer's view of the worker: log-probs, gradient
// accumulation, optimizer steps, checkpoints. Tests use pure-Go fakes.
type trainPolicy interface {
	Logprobs(ctx context.Context, rows []grpo.Row, temperature float64, ref bool) ([][]float32, error)
	ForwardBackward(ctx context.Context, mb grpo.MicroBatch, cfg grpo.LossConfig) (worker.LossStats, error)
	OptimizerStep(ctx context.Context, lr float64) (gradNorm float64, err error)
	// writeCheckpoint writes the weights and optimizer state of step into dir.
	writeCheckpoint(ctx context.Context, dir string, step int) error
	// DiscardGradients zeroes what the micro-steps of an unfinished step
	// accumulated.
	DiscardGradients(ctx context.Context) error
}

// Rollouts runs episodes (rollout.Runner).
type rolloutRunner interface {
	RunAll(ctx context.Context, tasks []rollout.Task, onDone func(*rollout.Trajectory)) []*rollout.Trajectory
}

// WeightSyncer makes generation use the newest weights (engine.Generator).
type weightSyncer interface {
	SyncWeights(ctx context.Context, step int) error
}

// LoopConfig is what the loop needs beyond its collaborators.
type stepLoopConfig struct {
	Shape           roundShape
	Loss            grpo.LossConfig
	Scale           grpo.ScaleRewards
	Aggregation     grpo.RewardAggregation
	MaskTruncated   bool
	UseSamplerLogps bool // pass sampler log-probs for IS correction (vLLM, async)
	// MaxOffPolicySteps is async.max_off_policy_steps: 0 runs the
	// synchronous loop; N >= 1 generates rounds ahead (loop_async.go).
	MaxOffPolicySteps int
	// RescoreSamplerLogps: the engine's sampler scores each round again in
	// one deterministic pass (loop_async.go).
	RescoreSamplerLogps bool
	MaxSteps            int
	Schedule            func(step int) float64
	SaveSteps           int
	LoggingSteps        int
	MaxFailureFrac      float64
	// Deadlines of the worker's phases: one micro-batch's forward and
	// backward, one log-prob pass, one optimizer step (0: none).
	StepTimeout, LogprobTimeout, OptimizerTimeout time.Duration
	// PackTokens is worker.pack_tokens (the padding saved is reported).
	PackTokens int
	// Rewards scores every rollout (the env's rewards alone by default).
	Rewards *reward.Set
	// DynamicSampling drops groups without a reward spread and refills
	// the round, at most MaxExtraRounds times (round_fill.go).
	DynamicSampling bool
	MaxExtraRounds  int
	// MaxFailedToolSteps stops the run after this many consecutive steps in
	// which every tool call failed (0: never).
	MaxFailedToolSteps int
	Seed               int64
	// SharedEngine: the ranks of a data-parallel run sample from the same
	// replicas, which rank 0 updates (dist.go, syncWeights).
	SharedEngine bool
	// Trajectories: the run logs every rollout (logging.log_completions),
	// so every rank keeps the records of its rollouts for rank 0.
	Trajectories bool
	EnvNames     []string
	Splits       []string
	Secrets      []map[string]string
}

// Shape is the batch relations of grpo-reference.md §1.1 for P = 1.
type roundShape struct {
	K, G, B, S, GA, Iterations int
}

// needOldLogprobs: the ratio differs from 1 only when a micro-step runs
// after the weights changed within the round, or when the sampler is
// another engine whose log-probs are corrected (grpo-reference.md §1.3).
func (s roundShape) needOldLogprobs(useSampler bool) bool {
	return s.GA%(s.S*s.Iterations) != 0 || useSampler
}

// Loop is the training loop: it owns the step counter and wires sampler,
// rollouts, grpo, the policy and the generator together.
type stepLoop struct {
	cfg      stepLoopConfig
	sampler  *curriculum.Sampler
	rollouts rolloutRunner
	policy   trainPolicy
	gen      weightSyncer
	log      zerolog.Logger
	// dist is the data-parallel process group (nil: one rank).
	dist collectives

	step      int // optimizer steps taken
	microStep int // micro-steps taken
	round     []grpo.MicroBatch
	numTokens int // cumulative prompt + sampled tokens (TRL num_tokens)

	// done is the loop as of the last completed optimizer step: what a
	// checkpoint holds, and what a failed or interrupted step rolls back to.
	done snapshot
	// failedToolRounds counts consecutive rounds in which every tool call failed.
	failedToolRounds int
	// drift stops a synchronous run whose sampler left the policy (drift.go).
	drift samplerDrift
	// pending holds the trajectories of the step in progress; they reach
	// OnTrajectory only once the step completes, so the log never holds
	// rollouts that were not trained on.
	pending []func()

	// Async runs only: the rounds generated or being generated ahead of
	// training, in order; the goroutine generating (nil when idle); the
	// staleness of the round in use.
	queue          []*roundSlot
	inflight       []*generation
	roundStaleness *staleness
	// launched is the policy version whose rounds were launched last.
	launched int
	// footprintLogged: the policy's memory was logged after a step.
	footprintLogged bool
	// identicalWarned: the run has warned about identical groups (rounds
	// may be produced beside a step, so it is atomic).
	identicalWarned atomic.Bool

	// Hooks for the CLI: metrics sink, trajectory sink, progress.
	OnMetrics     func(StepMetrics)
	OnTrajectory  func(step int, record []byte) // one trajectories.jsonl line (JSON, no newline)
	OnRolloutDone func(*rollout.Trajectory)
	Checkpoint    func(ctx context.Context, step int) error
}

// NewLoop wires the loop.
func newStepLoop(cfg stepLoopConfig, sampler *curriculum.Sampler, r rolloutRunner, p trainPolicy, g weightSyncer, log zerolog.Logger) *stepLoop {
	if cfg.Rewards == nil {
		// The env's rewards alone: the default list always compiles.
		cfg.Rewards, _ = reward.Compile(nil, reward.Options{Aggregation: cfg.Aggregation})
	}
	l := &stepLoop{
		cfg: cfg, sampler: sampler, rollouts: r, policy: p, gen: g, log: log, launched: -1,
	}
	// Step 0 is a boundary too: a failed first step rolls back to it.
	l.done = snapshot{state: State{Sampler: sampler.State()}}
	return l
}

// Step returns the number of optimizer steps taken.
func (l *stepLoop) Step() int { return l.step }

// State is what a checkpoint needs to resume the loop exactly (with the
// partly consumed round, saved beside it).
type State struct {
	Step      int                     `json:"step"`
	MicroStep int                     `json:"micro_step"`
	NumTokens int                     `json:"num_tokens"`
	Sampler   curriculum.SamplerState `json:"sampler"`
	// RoundStaleness is the staleness of the round in use (async runs).
	RoundStaleness *staleness `json:"round_staleness,omitempty"`
	// WorldSize is how many ranks trained (the global batch is ranks ×
	// per-device batch); 0 in checkpoints from before it was recorded.
	WorldSize int `json:"world_size,omitempty"`
}

// snapshot is the loop at an optimizer-step boundary.
type snapshot struct {
	state State
	// round is the generation round later steps still train on (nil when
	// the last step consumed it).
	round []grpo.MicroBatch
	// ahead are the rounds drawn for later steps (async runs); some may
	// still be generating (AheadRounds waits for them).
	ahead []*roundSlot
}

// State returns the state of the last completed step.
func (l *stepLoop) State() State { return l.done.state }

// PendingRound is the round the next steps train on before generating a
// new one; a checkpoint saves it so resume trains on the same samples.
func (l *stepLoop) PendingRound() []grpo.MicroBatch { return l.done.round }

// commit marks the current position as the last completed step.
func (l *stepLoop) commit() {
	st := State{Step: l.step, MicroStep: l.microStep, NumTokens: l.numTokens, Sampler: l.sampler.State(), WorldSize: 1}
	if l.dist != nil {
		st.WorldSize = l.dist.WorldSize()
	}
	var round []grpo.MicroBatch
	if l.round != nil && l.microStep%(l.cfg.Shape.S*l.cfg.Shape.Iterations) != 0 {
		round = l.round
		if l.roundStaleness != nil {
			rs := *l.roundStaleness
			st.RoundStaleness = &rs
		}
	}
	l.done = snapshot{state: st, round: round, ahead: slices.Clone(l.queue)}
	for _, write := range l.pending {
		write()
	}
	l.pending = nil
}

// rollback returns to the last completed step after a step failed or was
// interrupted part-way: position, sampler and round as they were, the
// unfinished step's rollouts dropped and its gradients zeroed.
func (l *stepLoop) rollback() error {
	st := l.done.state
	if err := l.sampler.Restore(st.Sampler); err != nil {
		return err
	}
	l.step, l.microStep, l.numTokens, l.round = st.Step, st.MicroStep, st.NumTokens, l.done.round
	l.pending = nil
	if l.async() {
		// The rounds launched after the boundary are drawn again; older
		// ones (a second sampler copy's) keep generating.
		l.cancelGeneration(st.Step)
		l.restoreAhead(st, l.done.ahead)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return l.policy.DiscardGradients(ctx)
}

// Restore resumes from a checkpoint's state, the round it saved and (async
// runs) the rounds it generated ahead.
func (l *stepLoop) Restore(st State, round []grpo.MicroBatch, ahead []*genRound) error {
	if err := l.sampler.Restore(st.Sampler); err != nil {
		return err
	}
	l.step, l.microStep, l.numTokens = st.Step, st.MicroStep, st.NumTokens
	l.round = round
	slots := make([]*roundSlot, len(ahead))
	for i, gr := range ahead {
		slots[i] = doneSlot(gr)
	}
	l.done = snapshot{state: st, round: round, ahead: slots}
	l.restoreAhead(st, slots)
	return nil
}

// restoreAhead sets the async queue to the rounds drawn before the
// boundary; the next step launches the rounds of its version again.
func (l *stepLoop) restoreAhead(st State, ahead []*roundSlot) {
	l.queue = slices.Clone(ahead)
	l.launched = st.Step - 1
	l.roundStaleness = nil
	if st.RoundStaleness != nil {
		rs := *st.RoundStaleness
		l.roundStaleness = &rs
	}
}

// OptimizerError is a failed optimizer step: the weights may be partly
// updated, so no checkpoint is written from them.
type OptimizerError struct {
	Step int
	Err  error
}

func (e *OptimizerError) Error() string { return fmt.Sprintf("step %d: optimizer: %v", e.Step, e.Err) }
func (e *OptimizerError) Unwrap() error { return e.Err }

// ErrTooManyFailures stops a run whose rollouts fail for infrastructure reasons.
var ErrTooManyFailures = errors.New("too many failed rollouts")

// Run trains until MaxSteps or ctx is cancelled. On cancellation it returns
// ctx's error after the last completed step; the caller checkpoints.
func (l *stepLoop) Run(ctx context.Context) error {
	if l.async() {
		// Rounds drawn after the last completed step are dropped (their
		// rollouts close their sessions before Run returns); older ones
		// finish for the checkpoint (AheadRounds), and Close stops them.
		defer func() { l.cancelGeneration(l.step) }()
		if err := l.startAsync(ctx); err != nil {
			return err
		}
	}
	for l.step < l.cfg.MaxSteps {
		if err := ctx.Err(); err != nil {
			return err
		}
		m, err := l.TrainStep(ctx)
		if err != nil {
			return err
		}
		if l.OnMetrics != nil && (l.step%l.cfg.LoggingSteps == 0 || l.step == l.cfg.MaxSteps) {
			l.OnMetrics(m)
		}
		if l.Checkpoint != nil && l.cfg.SaveSteps > 0 && l.step%l.cfg.SaveSteps == 0 && l.step < l.cfg.MaxSteps {
			if err := l.Checkpoint(ctx, l.step); err != nil {
				return fmt.Errorf("checkpoint at step %d: %w", l.step, err)
			}
		}
	}
	return nil
}

// TrainStep is one optimizer step: GA micro-steps, each on the next
// micro-batch of the current round (a new round is generated when the
// previous one has been consumed mu times), then the optimizer and a weight
// sync. It is all or nothing: a step that fails or is interrupted before the
// optimizer ran leaves the loop at the previous step boundary.
func (l *stepLoop) TrainStep(ctx context.Context) (_ StepMetrics, err error) {
	first := l.step
	defer func() {
		if err != nil && l.step == first {
			if rerr := l.rollback(); rerr != nil {
				err = errors.Join(err, fmt.Errorf("roll back step %d: %w", l.step+1, rerr))
			}
		}
	}()
	start := time.Now()
	m := StepMetrics{Extra: map[string]float64{}, Async: l.async()}
	if l.async() && l.launched < l.step {
		// The rounds of the sampler's version: at the start of a run, and
		// after a failed step cancelled them.
		l.launchRounds(ctx)
	}
	if l.async() && l.roundStaleness != nil && l.round != nil && l.microStep%(l.cfg.Shape.S*l.cfg.Shape.Iterations) != 0 {
		// A round used since an earlier step: its samples, nothing dropped now.
		m.Staleness = staleness{Sum: l.roundStaleness.Sum, Count: l.roundStaleness.Count, Max: l.roundStaleness.Max}
	}
	lr := l.cfg.Schedule(l.step)
	out, err := runOptimizerStep(ctx, l.policy, l, reducerOf(l.dist), l.phases(), l.step+1, lr, &m)
	if err != nil {
		return m, err
	}
	if wp, ok := l.policy.(*workerPolicy); ok && !l.footprintLogged {
		// Gradients and the AdamW state exist once a step has run.
		logFootprint(ctx, l.log, wp.m, "after the first step")
		l.footprintLogged = true
	}
	l.step++
	l.commit()
	if mean, ok := m.Extra["sampling/sampling_logp_difference/mean"]; ok && !l.async() {
		// Off-policy samples of an async run differ by design.
		if err := l.drift.observe(l.step, mean); err != nil {
			return m, err
		}
	}
	if err := l.publishStep(ctx, &m); err != nil {
		return m, err
	}
	m.Step, m.LearningRate, m.GradNorm, m.NumTokens = l.step, lr, out.GradNorm, l.numTokens
	// The epoch of the rounds trained on (an async run has drawn further).
	m.Epoch = l.done.state.Sampler.Epochs[0]
	m.reduceLoss(out.Stats, l.cfg.Loss)
	if l.dist != nil {
		// A global micro-batch's loss is the mean of its P slices' losses.
		m.Loss /= float64(l.dist.WorldSize())
		m.WorldSize = l.dist.WorldSize()
	}
	m.StepTime = time.Since(start)
	return m, nil
}

// publishStep brings generation to the step's weights once it completed:
// the weight sync (after an async run's older rounds are done), its probe
// and router metrics, and the next async rounds.
func (l *stepLoop) publishStep(ctx context.Context, m *StepMetrics) error {
	syncCtx := ctx
	if l.async() {
		// The step is complete: an interrupt must not leave it unlogged
		// nor the sampler on older weights than the checkpoint's rounds
		// assume (the copy takes a fraction of the step).
		syncCtx = context.WithoutCancel(ctx)
		// The copy that takes this step's weights held those of step
		// step-D: its rounds must be done.
		if err := l.awaitGeneration(syncCtx, m, l.step-l.pipelineDepth()); err != nil {
			return err
		}
	}
	t0 := time.Now()
	if err := l.syncWeights(syncCtx); err != nil {
		return fmt.Errorf("step %d: sync weights: %w", l.step, err)
	}
	m.SyncTime = time.Since(t0)
	if s, ok := l.gen.(interface{ LastSync() engine.SyncStats }); ok {
		if st := s.LastSync(); st.Probed && st.Step == l.step {
			m.Extra["engine/sync_probe_logp_difference"] = st.ProbeDiff
		}
	}
	if r, ok := l.gen.(interface{ RouterStats() engine.RouterStats }); ok {
		addRouterStats(m.Extra, r.RouterStats())
	}
	if l.async() {
		// The sampler holds this step's weights: the rounds of this
		// version start, beside the next step's training.
		l.launchRounds(ctx)
	}
	return nil
}

// addRouterStats reports how the replica router spread this rank's
// requests: sessions moved off a failed replica (since the start) and the
// busiest replica's share of the requests.
func addRouterStats(extra map[string]float64, st engine.RouterStats) {
	var total, most int64
	for _, n := range st.Requests {
		total += n
		most = max(most, n)
	}
	extra["router/moved_sessions"] = float64(st.Moved)
	if total > 0 && len(st.Requests) > 1 {
		extra["router/max_replica_share"] = float64(most) / float64(total)
	}
}

// NextMicroBatch is the batch source of a run (step.go): the next
// micro-batch of the current round; a new round is generated, or taken from
// the async queue, once the current one has been consumed mu times.
func (l *stepLoop) NextMicroBatch(ctx context.Context, m *StepMetrics) (grpo.MicroBatch, error) {
	if l.round == nil || l.microStep%(l.cfg.Shape.S*l.cfg.Shape.Iterations) == 0 {
		next := l.generateRound
		if l.async() {
			next = l.nextAsyncRound
		}
		if err := next(ctx, m); err != nil {
			return grpo.MicroBatch{}, err
		}
	}
	mb := l.round[l.microStep%l.cfg.Shape.S]
	l.microStep++
	return mb, nil
}

// phases are the step settings runOptimizerStep needs.
func (l *stepLoop) phases() stepPhases {
	return stepPhases{GA: l.cfg.Shape.GA, Loss: l.cfg.Loss, StepTimeout: l.cfg.StepTimeout, OptimizerTimeout: l.cfg.OptimizerTimeout,
		PackTokens: l.cfg.PackTokens}
}

// withDeadline runs f under its own deadline (none when d is 0); a worker
// call past it returns an error instead of hanging the run.
func withDeadline(ctx context.Context, d time.Duration, f func(context.Context) error) error {
	if d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	return f(ctx)
}

// generateRound runs K*G rollouts, scores them, and prepares S micro-batches.
func (l *stepLoop) generateRound(ctx context.Context, m *StepMetrics) error {
	gr, err := l.produceRound(ctx, l.drawRound(l.step+1))
	if err != nil {
		return err
	}
	return l.useRound(ctx, gr, m)
}

// useRound makes gr the round the next micro-steps train on: over-stale
// groups dropped (async), old and reference log-probs, the shuffled
// micro-batches, its metrics, and its trajectories queued for the log.
func (l *stepLoop) useRound(ctx context.Context, gr *genRound, m *StepMetrics) error {
	// The step fills in the rows' log-probs on a copy: a failed step's
	// rollback (and its checkpoint) keeps gr as it was generated.
	if err := l.checkToolFailures(gr.Stats.Tools); err != nil {
		return err
	}
	rows := slices.Clone(gr.Rows)
	if !l.cfg.UseSamplerLogps {
		// No IS correction: the loss must not see the sampler's log-probs.
		for i := range rows {
			rows[i].SamplerLogprobs = nil
		}
	}
	if l.async() {
		st := dropStale(rows, gr.Versions, gr.Groups, l.cfg.Shape.G, l.step, l.cfg.MaxOffPolicySteps)
		m.Staleness = m.Staleness.add(st)
		l.roundStaleness = &st
	}
	if l.dist == nil {
		if err := l.addReferenceLogprobs(ctx, rows, m); err != nil {
			return err
		}
	}
	mbs, err := grpo.SplitRound(rows, l.cfg.Shape.S, l.cfg.Shape.B, l.cfg.Shape.GA, seeds(l.cfg.Seed).roundShuffle(gr.Round))
	if err != nil {
		return err
	}
	if l.dist != nil {
		// Each rank scores only the rows it trains on.
		if err := l.addReferenceLogprobsDist(ctx, mbs, m); err != nil {
			return err
		}
	}
	l.round = mbs
	l.numTokens += gr.Stats.Round.PromptTokens + gr.Stats.Round.SampledTokens
	m.addRound(gr.Stats)
	// In round order on the trainer's goroutine, so the pass rates, and
	// the draws that read them, are the same in every run of the seed.
	l.sampler.Observe(gr.Outcomes)
	if l.sampler.Curriculum().Enabled {
		maps.Copy(m.Extra, l.sampler.Metrics())
	}
	if l.OnTrajectory != nil {
		step := l.step + 1
		for _, rec := range gr.Records {
			l.pending = append(l.pending, func() { l.OnTrajectory(step, rec) })
		}
	}
	return nil
}

// drawRound draws the next round's tasks, first trained on by step
// firstStep, with (dynamic sampling) the sampler that tops it up.
func (l *stepLoop) drawRound(firstStep int) roundJob {
	job := roundJob{Refs: l.sampler.Next(), Version: l.step, FirstStep: firstStep, Skipped: l.sampler.TakeSkipped()}
	job.Round = int64(l.sampler.Round())
	if l.cfg.DynamicSampling {
		job.Refill = l.sampler.Refill(int(job.Round))
	}
	return job
}

// addReferenceLogprobs fills old log-probs when the ratio can differ from 1,
// and reference log-probs when beta > 0.
func (l *stepLoop) addReferenceLogprobs(ctx context.Context, rows []grpo.Row, m *StepMetrics) error {
	t0 := time.Now()
	defer func() { m.TrainTime += time.Since(t0) }()
	if l.cfg.Shape.needOldLogprobs(l.cfg.UseSamplerLogps) {
		var old [][]float32
		err := withDeadline(ctx, l.cfg.LogprobTimeout, func(c context.Context) (err error) {
			old, err = l.policy.Logprobs(c, rows, l.cfg.Loss.Temperature, false)
			return err
		})
		if err != nil {
			return fmt.Errorf("old log-probs: %w", err)
		}
		for i := range rows {
			rows[i].OldLogprobs = old[i]
		}
	}
	if l.cfg.Loss.Beta > 0 {
		var ref [][]float32
		err := withDeadline(ctx, l.cfg.LogprobTimeout, func(c context.Context) (err error) {
			ref, err = l.policy.Logprobs(c, rows, l.cfg.Loss.Temperature, true)
			return err
		})
		if err != nil {
			return fmt.Errorf("reference log-probs: %w", err)
		}
		for i := range rows {
			rows[i].RefLogprobs = ref[i]
		}
	}
	if !l.cfg.UseSamplerLogps {
		return nil
	}
	if l.dist == nil {
		// A rank of several reports these over the gathered round
		// (addReferenceLogprobsDist).
		addSamplingMetrics(rows, l.cfg.Loss, m)
	}
	return nil
}

// addSamplingMetrics reports how far the sampler's log-probs are from the
// trainer's (sampling/*, the IS correction's inputs) over rows.
func addSamplingMetrics(rows []grpo.Row, cfg grpo.LossConfig, m *StepMetrics) {
	for k, v := range grpo.SamplingMetrics(rows, cfg) {
		m.Extra[k] = v
	}
}
