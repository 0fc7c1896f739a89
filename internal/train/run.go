package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/curriculum"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/envtarget"
	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/launch"
	"github.com/ortrain/ortrain/internal/rollout"
	"github.com/ortrain/ortrain/internal/runlock"
)

// RunOptions are what a run needs beyond its config.
type RunOptions struct {
	Logger  zerolog.Logger
	Getenv  func(string) string
	Version string
	// Resume continues from the run directory's latest complete checkpoint.
	Resume bool
	// Overwrite starts afresh in an output_dir that holds an earlier run,
	// deleting its metrics, trajectories and checkpoints.
	Overwrite bool
	// ResumeWithChanges accepts a resume whose config changes the batch or
	// the model, and records the change in the run directory.
	ResumeWithChanges bool
	// OnStart reports the total number of optimizer steps and the first
	// step (after a resume), for progress bars.
	OnStart   func(total, first int)
	OnMetrics func(StepMetrics)
	// OnRollout is called as each rollout finishes.
	OnRollout func(*rollout.Trajectory)
	// Executable and Environ are used to launch vLLM replicas (engine.kind vllm).
	Executable string
	Environ    []string
	// World is this process's place in a data-parallel run (launch.FromEnv);
	// the zero value is one process. Rank 0 alone writes the run directory.
	World launch.World
}

// rank0 reports whether this process writes the run directory: the only
// process, or rank 0 of several.
func (ro RunOptions) rank0() bool { return ro.World.Rank == 0 }

// ErrInterrupted reports that the run stopped on a signal after saving a checkpoint.
var ErrInterrupted = errors.New("training interrupted")

// Result summarises a finished (or interrupted) run.
type Result struct {
	RunDir     string
	Steps      int
	Checkpoint string
	First      StepMetrics
	Last       StepMetrics

	savedStep int // the step res.Checkpoint holds
}

// Run trains with cfg until max_steps, or until ctx is cancelled: then it
// stops new rollouts, closes their sessions, saves a checkpoint and returns
// an error wrapping ErrInterrupted.
func Run(ctx context.Context, cfg *config.Config, ro RunOptions) (res *Result, err error) {
	plan, err := planRun(cfg, ro)
	if err != nil {
		return nil, err
	}
	defer plan.lock.Release()
	started := false
	defer func() {
		if err != nil && !started {
			removeCreatedDirs(plan.createdDirs)
		}
	}()
	st, err := buildStack(ctx, cfg, stackOptions{
		resumeDir: plan.resumeDir, reference: plan.loss.Beta > 0, getenv: ro.Getenv, logger: ro.Logger, world: ro.World,
		engine: runEngine(cfg, ro),
	})
	if err != nil {
		return nil, err
	}
	defer st.close()
	loop, err := newRunLoop(cfg, plan, st, ro.World, ro.Logger)
	if err != nil {
		return nil, err
	}
	defer loop.Close()
	if ro.Resume && loop.Step() >= loop.cfg.MaxSteps {
		// A finished run resumed: nothing to train, so nothing is written
		// (config.yaml, manifest.json and the logs stay as the run left them).
		ro.Logger.Info().Int("step", loop.Step()).Int("max_steps", loop.cfg.MaxSteps).
			Msg("the run is already finished; nothing to do (raise --max-steps to train further)")
		return &Result{RunDir: cfg.OutputDir, Steps: loop.Step(), Checkpoint: plan.resumeDir, savedStep: loop.Step()}, nil
	}
	if ro.Overwrite && ro.rank0() {
		if err := clearEarlierRun(cfg.OutputDir, ro.World.Distributed()); err != nil {
			return nil, err
		}
	}
	rd := &runDir{}
	if ro.rank0() {
		if rd, err = openRunDir(cfg, st.modelDir, st.envs, ro, st.lib, loop.Step()); err != nil {
			return nil, err
		}
	}
	defer rd.close()
	started = true
	res = &Result{RunDir: cfg.OutputDir}
	wireHooks(loop, rd, res, st.policy, cfg, ro, st.envs)
	if ro.OnStart != nil {
		ro.OnStart(loop.cfg.MaxSteps, loop.Step())
	}
	runErr := loop.Run(ctx)
	return finishRun(ctx, cfg, ro, loop, st.policy, res, runErr)
}

// runEngine starts a run's generation backend: this rank's share of a
// data-parallel run's, or one process's.
func runEngine(cfg *config.Config, ro RunOptions) func(context.Context, string, *workerPolicy, *stack) (engine.Generator, error) {
	return func(ctx context.Context, modelDir string, p *workerPolicy, st *stack) (engine.Generator, error) {
		if ro.World.Distributed() {
			return startRankEngine(ctx, cfg, modelDir, p, ro, st)
		}
		noteShardAlone(cfg, ro)
		return startEngine(ctx, cfg, modelDir, p, ro)
	}
}

// runPlan is what a run decides before it loads anything.
type runPlan struct {
	shape      config.BatchShape
	loss       grpo.LossConfig
	resumeDir  string // "" for a fresh run
	resumeStep int
	changes    []config.Change // accepted by --resume-with-changes
	// createdDirs are the directories planRun created for output_dir,
	// deepest first: a start that fails removes them again while empty.
	createdDirs []string
	// lock is rank 0's hold on output_dir (runlock), released when Run ends.
	lock *runlock.Lock
}

// planRun validates the batch and loss settings and prepares output_dir:
// it refuses to mix a new run into an earlier one and finds the checkpoint
// to resume from.
func planRun(cfg *config.Config, ro RunOptions) (runPlan, error) {
	p, err := planRunChecks(cfg, ro)
	if err != nil {
		return p, err
	}
	p.createdDirs = missingDirs(cfg.OutputDir)
	if err := os.MkdirAll(cfg.OutputDir, 0o755); err != nil {
		return p, fmt.Errorf("create output_dir: %w", err)
	}
	if !ro.rank0() {
		return p, nil
	}
	// One live writer per run directory, from here (before --overwrite
	// deletes anything) until the run ends; the kernel drops it on any death.
	if p.lock, err = runlock.Acquire(cfg.OutputDir, "run"); err != nil {
		return p, err
	}
	if p.changes != nil {
		if err := recordResumeChanges(cfg.OutputDir, p.resumeStep, p.changes); err != nil {
			_ = p.lock.Release()
			return p, err
		}
	}
	return p, nil
}

// planRunChecks is planRun without side effects (--dry-run runs it too):
// batch and loss settings, output_dir free or resumable, and on --resume a
// checkpoint to continue from and no change to what shapes the batch or
// the model unless --resume-with-changes.
func planRunChecks(cfg *config.Config, ro RunOptions) (runPlan, error) {
	var p runPlan
	if len(cfg.Envs) == 0 {
		return p, &config.FieldError{Field: "envs", Value: "[]", Allowed: "at least one environment (a URL, Owner/Env or builtin:NAME)"}
	}
	var err error
	if p.shape, err = cfg.GRPO.BatchShape(); err != nil {
		return p, err
	}
	if p.loss, err = cfg.GRPO.LossConfig(); err != nil {
		return p, err
	}
	// Reward expressions are type-checked before anything is created.
	if _, err := compileRewards(cfg); err != nil {
		return p, err
	}
	if err := checkDistributed(cfg, ro.World); err != nil {
		return p, err
	}
	// The other ranks leave output_dir to rank 0, which may be writing
	// it already: they read only the checkpoint they resume from.
	if ro.rank0() {
		if err := checkFreshRunDir(cfg.OutputDir, ro); err != nil {
			return p, err
		}
	}
	if !ro.Resume {
		return p, nil
	}
	if p.resumeDir, p.resumeStep, err = LatestCheckpoint(cfg.OutputDir); err != nil {
		return p, fmt.Errorf("--resume: %w", err)
	}
	if !ro.rank0() {
		return p, nil
	}
	saved, err := config.LoadFile(filepath.Join(cfg.OutputDir, "config.yaml"))
	if err != nil {
		return p, fmt.Errorf("--resume: read the run's config.yaml: %w", err)
	}
	ch := config.ResumeChanges(saved, cfg)
	if c, changed, err := ranksChange(p.resumeDir, cfg, ro.World.WorldSize); err != nil {
		return p, err
	} else if changed {
		ch = append(ch, c)
	}
	if len(ch) > 0 {
		if !ro.ResumeWithChanges {
			return p, &config.ResumeChangedError{Changes: ch}
		}
		p.changes = ch
	}
	return p, nil
}

// ranksChange compares the ranks that trained the checkpoint with this
// run's: the global batch is ranks × per_device_train_batch_size, so
// resuming a 2-rank run on 1 rank would halve it without a word.
func ranksChange(resumeDir string, cfg *config.Config, worldSize int) (config.Change, bool, error) {
	var state State
	if err := ReadJSON(filepath.Join(resumeDir, "trainer_state.json"), &state); err != nil {
		return config.Change{}, false, fmt.Errorf("--resume: %w", err)
	}
	now := max(1, worldSize)
	if state.WorldSize == 0 || state.WorldSize == now {
		return config.Change{}, false, nil // unrecorded (older checkpoints), or the same
	}
	b := cfg.GRPO.PerDeviceTrainBatchSize
	text := func(ranks int) string {
		return fmt.Sprintf("%d (global batch %d × %d = %d rows per micro-step)", ranks, ranks, b, ranks*b)
	}
	return config.Change{Field: "ranks", Old: text(state.WorldSize), New: text(now)}, true, nil
}

// recordResumeChanges appends what --resume-with-changes changed to the run
// directory's resume-changes.jsonl, so the run's history stays readable.
func recordResumeChanges(dir string, step int, changes []config.Change) error {
	w, err := openJSONL(filepath.Join(dir, "resume-changes.jsonl"))
	if err != nil {
		return err
	}
	defer w.Close()
	return w.Write(map[string]any{"time": time.Now().UTC().Format(time.RFC3339), "resumed_at_step": step, "changes": changes})
}

// newRunLoop builds the task sampler and the loop over the stack, restored
// from the checkpoint when resuming.
func newRunLoop(cfg *config.Config, plan runPlan, st *stack, w launch.World, log zerolog.Logger) (*stepLoop, error) {
	shape := plan.shape
	if w.Distributed() {
		// The loop works on the global round: P ranks of B rows each
		// train on every micro-batch (dist.go).
		shape.B *= w.WorldSize
		shape.NGen *= w.WorldSize
	}
	etasks := make([]curriculum.EnvTasks, len(st.envs))
	for i, e := range st.envs {
		etasks[i] = curriculum.EnvTasks{Indices: e.Indices, Weight: e.Config.Weight}
	}
	sampler, err := curriculum.NewSampler(etasks, shape.PromptsPerRound(), shape.G, cfg.Seed, cfg.GRPO.ShuffleDataset)
	if err != nil {
		return nil, err
	}
	sampler.SetCurriculum(cfg.Curriculum.Curriculum())
	loopCfg, err := loopConfig(cfg, shape, plan.loss, st.envs, sampler)
	if err != nil {
		return nil, err
	}
	loopCfg.Rewards = st.rewards
	loop := newStepLoop(loopCfg, sampler, st.runner, st.policy, st.gen, log)
	if st.group != nil {
		log.Info().Int("rank", w.Rank).Int("world_size", w.WorldSize).Str("backend", st.group.Backend()).
			Str("launcher", w.Source).Msg("joined the process group")
		loop.dist = st.group
	}
	logFootprint(context.Background(), log, st.policy.m, "start")
	if plan.resumeDir == "" {
		return loop, nil
	}
	var state State
	if err := ReadJSON(filepath.Join(plan.resumeDir, "trainer_state.json"), &state); err != nil {
		return nil, fmt.Errorf("--resume: %w", err)
	}
	round, err := readRound(plan.resumeDir)
	if err != nil {
		return nil, fmt.Errorf("--resume: %w", err)
	}
	ahead, err := readAhead(plan.resumeDir)
	if err != nil {
		return nil, fmt.Errorf("--resume: %w", err)
	}
	if err := loop.Restore(state, round, ahead); err != nil {
		return nil, fmt.Errorf("--resume from %s: %w", plan.resumeDir, err)
	}
	log.Info().Str("checkpoint", plan.resumeDir).Int("step", state.Step).Msg("resumed")
	return loop, nil
}

// finishRun writes the checkpoint of the last completed step — after the
// last step, an interrupt, or a fatal error alike — with a fresh, bounded
// context (the run's may be cancelled), unless that step is saved already
// or the optimizer failed mid-update.
func finishRun(ctx context.Context, cfg *config.Config, ro RunOptions, loop *stepLoop, p trainPolicy, res *Result, runErr error) (*Result, error) {
	res.Steps = loop.Step()
	var optErr *OptimizerError
	unsaved := loop.Step() > 0 && loop.Step() != res.savedStep && !errors.As(runErr, &optErr)
	if wp, ok := p.(*workerPolicy); ok && unsaved && !ro.rank0() && wp.shards != nil {
		// This rank's optimizer slice, for rank 0's checkpoint.
		saveCtx, cancel := context.WithTimeout(context.Background(), cfg.Worker.SaveTimeout)
		err := wp.saveShard(saveCtx, loop.Step())
		cancel()
		if err != nil {
			runErr = errors.Join(runErr, fmt.Errorf("optimizer slice of step %d: %w", loop.Step(), err))
		}
	}
	if ro.rank0() && unsaved {
		saveCtx, cancel := context.WithTimeout(context.Background(), cfg.Worker.SaveTimeout)
		path, err := saveCheckpoint(saveCtx, cfg.OutputDir, loop, p)
		cancel()
		switch {
		case err != nil && runErr == nil:
			return res, fmt.Errorf("final checkpoint: %w", err)
		case err != nil:
			runErr = errors.Join(runErr, fmt.Errorf("checkpoint of step %d: %w", loop.Step(), err))
		default:
			res.Checkpoint, res.savedStep = path, loop.Step()
		}
	}
	switch {
	case runErr == nil:
		return res, nil
	case ctx.Err() != nil && errors.Is(runErr, context.Canceled) && !errors.Is(runErr, ErrTooManyFailures):
		// The interrupt itself: "context canceled" says nothing more.
		return res, fmt.Errorf("%w at step %d (%s)", ErrInterrupted, loop.Step(), savedNote(ro, res, loop.Step()))
	case ctx.Err() != nil:
		return res, fmt.Errorf("%w at step %d (%s): %v", ErrInterrupted, loop.Step(), savedNote(ro, res, loop.Step()), runErr)
	case res.Checkpoint != "":
		return res, fmt.Errorf("%w (step %d, the last completed one, is saved in %s; continue with --resume)", runErr, res.savedStep, res.Checkpoint)
	}
	return res, runErr
}

// savedNote says where an interrupted run's last completed step is saved,
// or that nothing was, never an empty path.
func savedNote(ro RunOptions, res *Result, step int) string {
	switch {
	case res.Checkpoint != "":
		return "checkpoint: " + res.Checkpoint
	case step == 0:
		return "no step had completed: nothing was saved"
	case !ro.rank0():
		return "rank 0 saves the checkpoint"
	}
	return "nothing was saved" // the save failed; the error says why
}

// saveCheckpoint writes the last completed step: weights, optimizer, loop
// state and the round later steps still train on.
func saveCheckpoint(ctx context.Context, dir string, loop *stepLoop, p trainPolicy) (string, error) {
	st := loop.State()
	path, err := writeCheckpoint(dir, st.Step, st, func(tmp string) error {
		if err := p.writeCheckpoint(ctx, tmp, st.Step); err != nil {
			return err
		}
		ahead, err := loop.AheadRounds(ctx)
		if err != nil {
			return err
		}
		if err := writeAhead(tmp, ahead); err != nil {
			return err
		}
		return writeRound(tmp, loop.PendingRound())
	})
	if err != nil {
		return "", err
	}
	if len(st.Sampler.Tasks) > 0 {
		snap := curriculum.Snapshot{Step: st.Step, Envs: loop.cfg.EnvNames, Splits: loop.cfg.Splits, Config: loop.sampler.Curriculum(), Tasks: st.Sampler.Tasks}
		if err := writeJSONAtomic(filepath.Join(dir, curriculum.SnapshotFile), snap); err != nil {
			return "", err
		}
	}
	if wp, ok := p.(*workerPolicy); ok {
		// Best effort: the checkpoint is saved, and the next run's rank 0
		// clears whatever slices stay.
		_ = wp.checkpointPublished(st.Step)
	}
	return path, nil
}

// wireHooks connects the loop to the run directory and the caller.
func wireHooks(loop *stepLoop, rd *runDir, res *Result, p trainPolicy, cfg *config.Config, ro RunOptions, envList []*runEnv) {
	loop.OnRolloutDone = ro.OnRollout
	waits := newCapacityWaits(envList)
	loop.OnMetrics = func(m StepMetrics) {
		waits.addTo(&m)
		if res.First.Step == 0 {
			res.First = m
		}
		res.Last = m
		if err := rd.writeMetrics(m.Step, m.Map()); err != nil {
			ro.Logger.Error().Err(err).Msg("write metrics.jsonl")
		}
		if ro.OnMetrics != nil {
			ro.OnMetrics(m)
		}
	}
	if rd.trajectories != nil {
		loop.OnTrajectory = func(_ int, record []byte) {
			if err := rd.trajectories.Write(json.RawMessage(record)); err != nil {
				ro.Logger.Error().Err(err).Msg("write trajectories.jsonl")
			}
		}
	}
	if !ro.rank0() {
		// Rank 0 alone writes checkpoints; every rank resumes from them.
		// A sharded optimizer's slices come from every rank.
		if wp, ok := p.(*workerPolicy); ok && wp.shards != nil {
			loop.Checkpoint = func(ctx context.Context, step int) error {
				ctx, cancel := context.WithTimeout(ctx, cfg.Worker.SaveTimeout)
				defer cancel()
				err := wp.saveShard(ctx, step)
				if err == nil {
					res.savedStep = step
				}
				return err
			}
		}
		return
	}
	loop.Checkpoint = func(ctx context.Context, step int) error {
		ctx, cancel := context.WithTimeout(ctx, cfg.Worker.SaveTimeout)
		defer cancel()
		path, err := saveCheckpoint(ctx, cfg.OutputDir, loop, p)
		if err == nil {
			res.Checkpoint, res.savedStep = path, step
			ro.Logger.Info().Str("path", path).Int("step", step).Msg("checkpoint saved")
		}
		return err
	}
}

// missingDirs lists dir and those of its parents that do not exist yet,
// deepest first.
func missingDirs(dir string) []string {
	var out []string
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			return out
		}
		out = append(out, d)
		if filepath.Dir(d) == d {
			return out
		}
	}
}

// removeCreatedDirs removes what missingDirs listed, deepest first, as long
// as each is empty: a run that fails to start leaves no empty output_dir
// behind, and never deletes what someone else put there meanwhile.
func removeCreatedDirs(dirs []string) {
	if len(dirs) > 0 {
		// The lock file of a run that never started, in a directory it made.
		_ = os.Remove(filepath.Join(dirs[0], runlock.FileName))
	}
	for _, d := range dirs {
		if os.Remove(d) != nil {
			return
		}
	}
}

// capacityWaits turns the envs' running totals of capacity refusals (a
// session retried because the server was full) into per-step metrics,
// env/<key>/capacity_waits, so a run held back by its envs' capacity says
// so in its metrics and not only in a log line.
type capacityWaits struct {
	envs []*runEnv
	last []int64
}

func newCapacityWaits(envs []*runEnv) *capacityWaits {
	return &capacityWaits{envs: envs, last: make([]int64, len(envs))}
}

func (c *capacityWaits) addTo(m *StepMetrics) {
	for i, e := range c.envs {
		w, ok := e.Conn.(envtarget.CapacityWaiter)
		if !ok {
			continue
		}
		total := w.CapacityWaits()
		if m.Extra == nil {
			m.Extra = map[string]float64{}
		}
		m.Extra["env/"+e.Key+"/capacity_waits"] = float64(total - c.last[i])
		c.last[i] = total
	}
}
