package train

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/ortrain/ortrain/internal/grpo"
)

// Async runs (async.max_off_policy_steps N >= 1) generate rounds ahead of
// training on a fixed schedule, so a run is reproducible, also across an
// interrupt and --resume:
//
//   - start(r), the optimizer steps done when round r is first trained on,
//     is floor(r*S*mu / GA); round r is generated with the weights of step
//     max(0, start(r)-N) (its policy version), so its staleness when used
//     is min(N, start(r)).
//   - Rounds are generated one after another on the sampler's own weights
//     (engine.kind builtin: copies of the policy; vLLM: the replicas),
//     which hold D versions (the pipeline depth: async.sampler_copies for
//     the builtin copies, 1 for replicas). After optimizer step u the
//     trainer waits for the rounds of version u-D (their copy is the one
//     to reuse), syncs that copy to version u and starts the rounds of
//     version u. So a copy never changes during a round, and with D = 2 a
//     round of version u-1 may still run past step u.
//   - A checkpoint of step u stores the rounds drawn before it (versions
//     below u: ahead.gob), waiting for those still generating; a resumed
//     run generates the rest from the checkpoint's weights, as the
//     uninterrupted run did. An interrupt cancels the rounds of version u
//     and lets the older ones finish for that checkpoint.
//   - When a round is first used, a group holding a sample more than N
//     versions older than the trainer is dropped (loss mask and advantage
//     zeroed, counted in async/dropped_samples): the schedule never makes
//     one, but a round saved by a run with a larger N can. The rest is
//     reweighted by the sampler's log-probs (grpo.vllm_importance_sampling_*).

// roundSlot is one round being generated ahead of training.
type roundSlot struct {
	done chan struct{} // closed when gr or err is set
	gr   *genRound
	err  error
}

// doneSlot wraps a round that is already generated (restored from a checkpoint).
func doneSlot(gr *genRound) *roundSlot {
	s := &roundSlot{done: make(chan struct{}), gr: gr}
	close(s.done)
	return s
}

// generation is the goroutine generating the rounds of one policy version.
type generation struct {
	version int
	cancel  context.CancelFunc
	done    chan struct{}
}

// staleness summarises the policy-version gap of the samples a step trains on.
type staleness struct {
	Sum     int `json:"sum"`
	Count   int `json:"count"`
	Max     int `json:"max"`
	Dropped int `json:"dropped"`
}

func (s staleness) add(o staleness) staleness {
	return staleness{Sum: s.Sum + o.Sum, Count: s.Count + o.Count, Max: max(s.Max, o.Max), Dropped: s.Dropped + o.Dropped}
}

// dropStale masks every group that holds a sample generated more than
// maxOff versions before now: a group's advantages are relative to each
// other, so a group is kept or dropped whole, by its oldest sample. Row i
// is in group groups[i], or i/g when groups is nil (no forks: a round's
// groups are g consecutive rows). It returns the round's staleness and
// how many rows it dropped.
func dropStale(rows []grpo.Row, versions, groups []int, g, now, maxOff int) staleness {
	group := func(i int) int {
		if groups != nil {
			return groups[i]
		}
		return i / g
	}
	oldest := map[int]int{}
	for i := range rows {
		k := group(i)
		if v, ok := oldest[k]; !ok || versions[i] < v {
			oldest[k] = versions[i]
		}
	}
	var st staleness
	for i := range rows {
		age := now - versions[i]
		st.Sum += age
		st.Count++
		st.Max = max(st.Max, age)
		if now-oldest[group(i)] > maxOff {
			rows[i].LossMask = make([]uint8, len(rows[i].LossMask))
			rows[i].Advantage = 0
			st.Dropped++
		}
	}
	return st
}

func (l *stepLoop) async() bool { return l.cfg.MaxOffPolicySteps > 0 }

// roundStart is start(r): the optimizer steps done when round r (0-based)
// is first trained on.
func (l *stepLoop) roundStart(r int) int {
	sh := l.cfg.Shape
	return r * sh.S * sh.Iterations / sh.GA
}

// pipelineDepth is how many policy versions the sampler holds at once.
func (l *stepLoop) pipelineDepth() int {
	if d, ok := l.gen.(interface{ PipelineDepth() int }); ok {
		return max(1, d.PipelineDepth())
	}
	return 1
}

// launchRounds starts generating, in one goroutine and in order, every
// round not yet drawn whose policy version is the current step and that a
// step will train on. The sampler must hold the current weights. The
// rounds run under a context the run's cancellation does not reach: an
// interrupt cancels only the current version's rounds (cancelGeneration),
// older ones finish for the checkpoint.
func (l *stepLoop) launchRounds(ctx context.Context) {
	l.launched = l.step
	var jobs []roundJob
	for {
		r := l.sampler.Round()
		start := l.roundStart(r)
		if start >= l.cfg.MaxSteps || start-l.cfg.MaxOffPolicySteps > l.step {
			break
		}
		jobs = append(jobs, l.drawRound(start+1))
	}
	if len(jobs) == 0 {
		return
	}
	slots := make([]*roundSlot, len(jobs))
	for i := range slots {
		slots[i] = &roundSlot{done: make(chan struct{})}
	}
	l.queue = append(l.queue, slots...)
	gctx, cancel := context.WithCancel(withSamplerVersion(context.WithoutCancel(ctx), l.step))
	g := &generation{version: l.step, cancel: cancel, done: make(chan struct{})}
	l.inflight = append(l.inflight, g)
	go func() {
		defer close(g.done)
		for i, job := range jobs {
			slots[i].gr, slots[i].err = l.produceRound(gctx, job)
			if slots[i].err != nil {
				slots[i].err = fmt.Errorf("generate round %d: %w", job.Round, slots[i].err)
				for _, s := range slots[i:] {
					if s != slots[i] {
						s.err = slots[i].err
					}
					close(s.done)
				}
				return
			}
			close(slots[i].done)
		}
	}()
}

// nextAsyncRound makes the oldest generated round the current one,
// waiting for it if it is still being generated.
func (l *stepLoop) nextAsyncRound(ctx context.Context, m *StepMetrics) error {
	if len(l.queue) == 0 {
		return fmt.Errorf("step %d: no round is generated or scheduled (max_steps %d)", l.step+1, l.cfg.MaxSteps)
	}
	slot := l.queue[0]
	t0 := time.Now()
	select {
	case <-slot.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	m.WaitTime += time.Since(t0)
	if slot.err != nil {
		return slot.err
	}
	l.queue = l.queue[1:]
	return l.useRound(ctx, slot.gr, m)
}

// awaitGeneration waits until the rounds of versions up to v are done:
// the sampler copy they run on is about to take newer weights.
func (l *stepLoop) awaitGeneration(ctx context.Context, m *StepMetrics, v int) error {
	t0 := time.Now()
	defer func() { m.WaitTime += time.Since(t0) }()
	var left []*generation
	for _, g := range l.inflight {
		if g.version > v {
			left = append(left, g)
			continue
		}
		select {
		case <-g.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	l.inflight = left
	return nil
}

// cancelGeneration cancels the rounds of versions from v on and waits for
// their rollouts to close their sessions; older rounds keep running.
func (l *stepLoop) cancelGeneration(from int) {
	var left []*generation
	for _, g := range l.inflight {
		if g.version < from {
			left = append(left, g)
			continue
		}
		g.cancel()
		<-g.done
	}
	l.inflight = left
}

// Close cancels every round still generating and waits for them.
func (l *stepLoop) Close() { l.cancelGeneration(math.MinInt) }

// AheadRounds are the rounds drawn before the last completed step and not
// trained on yet (async runs), waiting for those still generating; a
// checkpoint saves them so resume trains on the same samples. A round whose
// generation failed is left out (a resumed run generates it again, from
// the checkpoint's weights).
func (l *stepLoop) AheadRounds(ctx context.Context) ([]*genRound, error) {
	var out []*genRound
	for _, s := range l.done.ahead {
		select {
		case <-s.done:
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the rounds generated ahead: %w", ctx.Err())
		}
		if s.err != nil {
			l.log.Warn().Err(s.err).Msg("a round generated ahead failed; the checkpoint leaves it out and a resumed run generates it again with the checkpoint's weights")
			continue
		}
		out = append(out, s.gr)
	}
	return out, nil
}

// startAsync prepares an async run's first step: the sampler gets the
// trainer's weights (a resumed run's replicas hold the base model).
func (l *stepLoop) startAsync(ctx context.Context) error {
	if l.step > 0 {
		if err := l.gen.SyncWeights(ctx, l.step); err != nil {
			return fmt.Errorf("step %d: sync weights before resuming: %w", l.step, err)
		}
	}
	return nil
}

// samplerScorer is an engine that can score rows with the weights that
// sampled them: the builtin engine's copy of the policy.
type samplerScorer interface {
	SamplerLogprobs(ctx context.Context, rows []grpo.Row, temperature float64) ([][]float32, error)
}

// rescoreSamplerLogprobs replaces the log-probs recorded while sampling by
// the sampler's log-probs of the finished round in one pass, where the
// engine can (samplerScorer) and sampling truncates nothing (then both are
// the same distribution; with top_k, top_p or min_p the recorded, processed
// ones are kept). Sampling batches whatever requests arrive
// together, so the recorded values vary with timing in the last bits; the
// IS correction must not, or a run would not repeat exactly.
func (l *stepLoop) rescoreSamplerLogprobs(ctx context.Context, gr *genRound) error {
	sc, ok := l.gen.(samplerScorer)
	if !ok || !l.cfg.UseSamplerLogps || !l.cfg.RescoreSamplerLogps {
		return nil
	}
	t0 := time.Now()
	var lps [][]float32
	err := withDeadline(ctx, l.cfg.LogprobTimeout, func(c context.Context) (err error) {
		lps, err = sc.SamplerLogprobs(c, gr.Rows, l.cfg.Loss.Temperature)
		return err
	})
	if err != nil {
		return fmt.Errorf("sampler log-probs: %w", err)
	}
	for i := range gr.Rows {
		gr.Rows[i].SamplerLogprobs = lps[i]
	}
	gr.Stats.RolloutTime += time.Since(t0)
	return nil
}
