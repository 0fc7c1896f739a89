package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/rollout"
	"github.com/ortrain/ortrain/internal/tfevents"
	"github.com/ortrain/ortrain/internal/vllm"
	"github.com/ortrain/ortrain/internal/worker"
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
}

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
func Run(ctx context.Context, cfg *config.Config, ro RunOptions) (*Result, error) {
	plan, err := planRun(cfg, ro)
	if err != nil {
		return nil, err
	}
	st, err := buildStack(ctx, cfg, stackOptions{
		resumeDir: plan.resumeDir, reference: plan.loss.Beta > 0, getenv: ro.Getenv, logger: ro.Logger,
		engine: func(ctx context.Context, modelDir string, p *workerPolicy) (engine.Generator, error) {
			return startEngine(ctx, cfg, modelDir, p, ro)
		},
	})
	if err != nil {
		return nil, err
	}
	defer st.close()
	loop, err := newRunLoop(cfg, plan, st, ro.Logger)
	if err != nil {
		return nil, err
	}
	if ro.Overwrite {
		if err := clearEarlierRun(cfg.OutputDir); err != nil {
			return nil, err
		}
	}
	rd, err := openRunDir(cfg, st.modelDir, st.envs, ro, st.lib, loop.Step())
	if err != nil {
		return nil, err
	}
	defer rd.close()
	res := &Result{RunDir: cfg.OutputDir}
	wireHooks(loop, rd, res, st.policy, cfg, ro)
	if ro.OnStart != nil {
		ro.OnStart(loop.cfg.MaxSteps, loop.Step())
	}
	runErr := loop.Run(ctx)
	return finishRun(ctx, cfg, ro, loop, st.policy, res, runErr)
}

// runPlan is what a run decides before it loads anything.
type runPlan struct {
	shape      config.BatchShape
	loss       grpo.LossConfig
	resumeDir  string // "" for a fresh run
	resumeStep int
	changes    []config.Change // accepted by --resume-with-changes
}

// planRun validates the batch and loss settings and prepares output_dir:
// it refuses to mix a new run into an earlier one and finds the checkpoint
// to resume from.
func planRun(cfg *config.Config, ro RunOptions) (runPlan, error) {
	p, err := planRunChecks(cfg, ro)
	if err != nil {
		return p, err
	}
	if err := os.MkdirAll(cfg.OutputDir, 0o755); err != nil {
		return p, fmt.Errorf("create output_dir: %w", err)
	}
	if p.changes != nil {
		if err := recordResumeChanges(cfg.OutputDir, p.resumeStep, p.changes); err != nil {
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
	if err := checkFreshRunDir(cfg.OutputDir, ro); err != nil {
		return p, err
	}
	if !ro.Resume {
		return p, nil
	}
	if p.resumeDir, p.resumeStep, err = LatestCheckpoint(cfg.OutputDir); err != nil {
		return p, fmt.Errorf("--resume: %w", err)
	}
	saved, err := config.LoadFile(filepath.Join(cfg.OutputDir, "config.yaml"))
	if err != nil {
		return p, fmt.Errorf("--resume: read the run's config.yaml: %w", err)
	}
	if ch := config.ResumeChanges(saved, cfg); len(ch) > 0 {
		if !ro.ResumeWithChanges {
			return p, &config.ResumeChangedError{Changes: ch}
		}
		p.changes = ch
	}
	return p, nil
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
func newRunLoop(cfg *config.Config, plan runPlan, st *stack, log zerolog.Logger) (*stepLoop, error) {
	shape := plan.shape
	etasks := make([]envTasks, len(st.envs))
	for i, e := range st.envs {
		etasks[i] = envTasks{Indices: e.Indices, Weight: e.Config.Weight}
	}
	sampler, err := newTaskSampler(etasks, shape.PromptsPerRound(), shape.G, cfg.Seed, cfg.GRPO.ShuffleDataset)
	if err != nil {
		return nil, err
	}
	loopCfg, err := loopConfig(cfg, shape, plan.loss, st.envs, sampler)
	if err != nil {
		return nil, err
	}
	loopCfg.Rewards = st.rewards
	loop := newStepLoop(loopCfg, sampler, st.runner, st.policy, st.gen, log)
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
	if err := loop.Restore(state, round); err != nil {
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
	if loop.Step() > 0 && loop.Step() != res.savedStep && !errors.As(runErr, &optErr) {
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
	case ctx.Err() != nil:
		return res, fmt.Errorf("%w at step %d (checkpoint: %s): %v", ErrInterrupted, loop.Step(), res.Checkpoint, runErr)
	case res.Checkpoint != "":
		return res, fmt.Errorf("%w (step %d, the last completed one, is saved in %s; continue with --resume)", runErr, res.savedStep, res.Checkpoint)
	}
	return res, runErr
}

// startEngine builds the generation backend: the builtin worker (batched),
// or vLLM replicas launched on engine.vllm_gpus (or reached at
// engine.vllm_urls) that receive the policy's weights after every step.
func startEngine(ctx context.Context, cfg *config.Config, modelDir string, policy *workerPolicy, ro RunOptions) (engine.Generator, error) {
	log := ro.Logger.With().Str("component", "engine").Logger()
	if cfg.Engine.Kind != "vllm" {
		return newBuiltinEngine(cfg, policy, log), nil
	}
	export := policy.m.SaveHF
	if cfg.GRPO.LoRA.Enabled {
		export = policy.m.SavePEFT
	}
	v, err := engine.NewVLLM(ctx, vllmOptions(cfg, modelDir, export, ro, log))
	if err != nil {
		return nil, fmt.Errorf("start vLLM engine: %w", err)
	}
	return v, nil
}

// vllmOptions is the vLLM setup of engine.kind vllm: replicas of modelDir
// (or the servers at engine.vllm_urls) that get the trainer's weights
// through export, full weights or, with grpo.lora, adapters. Replica logs
// and (unless engine.vllm_sync_dir) the synced weights live in output_dir.
func vllmOptions(cfg *config.Config, modelDir string, export engine.WeightExporter, ro RunOptions, log zerolog.Logger) engine.VLLMOptions {
	e := cfg.Engine
	opts := engine.VLLMOptions{
		URLs: e.VLLMURLs,
		Launch: vllm.LaunchConfig{Command: e.VLLMCommand, Self: ro.Executable, Model: modelDir, TensorParallelSize: e.VLLMTensorParSize,
			GPUMemoryUtilization: e.VLLMGPUMemoryUtilization, MaxModelLen: e.VLLMMaxModelLen, ExtraArgs: e.VLLMExtraArgs, Environ: ro.Environ},
		GPUs: vllm.GPUPlan{GPUs: e.VLLMGPUs, Replicas: e.VLLMReplicas, TensorParallelSize: e.VLLMTensorParSize,
			TrainerGPUs: cfg.Worker.GPUs, Colocate: e.VLLMColocate},
		BasePort: e.VLLMPort, LogDir: filepath.Join(cfg.OutputDir, "vllm-logs"), StartupTimeout: e.VLLMStartupTimeout,
		MaxRestarts: e.VLLMMaxRestarts,
		SyncMode:    engine.SyncFull, SyncDir: e.VLLMSyncDir, Export: export, SyncTimeout: e.VLLMSyncTimeout,
		Timeout: e.GenerateTimeout, Logger: log,
	}
	if opts.SyncDir == "" {
		opts.SyncDir = filepath.Join(cfg.OutputDir, "weight-sync")
	}
	if cfg.GRPO.LoRA.Enabled {
		opts.SyncMode = engine.SyncLoRA
		// MaxLoras 2: the adapter in use and the one being loaded.
		opts.Launch.LoRA = &vllm.LoRALaunch{MaxRank: vllm.LoRARank(cfg.GRPO.LoRA.Rank), MaxLoras: 2}
	}
	return opts
}

// ErrRunDirInUse: output_dir holds an earlier run and neither --resume nor
// --overwrite was given.
var ErrRunDirInUse = errors.New("output_dir holds an earlier run")

// runFiles are what a run writes; an earlier run is detected by them.
var runFiles = []string{"metrics.jsonl", "trajectories.jsonl", "checkpoints", "manifest.json", "config.yaml"}

// earlierRun lists the files of an earlier run in dir.
func earlierRun(dir string) []string {
	var found []string
	for _, f := range runFiles {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			found = append(found, f)
		}
	}
	return found
}

// checkFreshRunDir refuses to mix a new run into an earlier one's files
// (it deletes nothing: see clearEarlierRun).
func checkFreshRunDir(dir string, ro RunOptions) error {
	if ro.Resume || ro.Overwrite {
		return nil
	}
	if found := earlierRun(dir); len(found) > 0 {
		return fmt.Errorf("%w: %s has %v; pass --resume to continue it, --overwrite to start over, or another --output-dir", ErrRunDirInUse, dir, found)
	}
	return nil
}

// clearEarlierRun deletes an earlier run's files for --overwrite. It runs
// only once the new run has passed its startup checks and is about to
// write, so a run that cannot start leaves the earlier one intact.
func clearEarlierRun(dir string) error {
	for _, f := range earlierRun(dir) {
		if err := os.RemoveAll(filepath.Join(dir, f)); err != nil {
			return fmt.Errorf("--overwrite: %w", err)
		}
	}
	return nil
}

// newBuiltinEngine batches concurrent rollouts' requests into the worker.
func newBuiltinEngine(cfg *config.Config, policy *workerPolicy, log zerolog.Logger) *engine.Builtin {
	return engine.NewBuiltin(engine.WorkerSampler{Model: policy.m}, engine.BuiltinOptions{
		MaxBatch: cfg.Engine.MaxBatchSize, Linger: 5 * time.Millisecond, Timeout: cfg.Engine.GenerateTimeout, Logger: log,
	})
}

// newRunner builds the rollout runner over the connected envs.
func newRunner(cfg *config.Config, envList []*runEnv, gen engine.Generator, chatSpec rollout.ChatSpec, log zerolog.Logger) (*rollout.Runner, error) {
	openers := make([]rollout.Opener, len(envList))
	for i, e := range envList {
		openers[i] = e.Conn
	}
	return rollout.NewRunner(openers, gen, chatSpec, rolloutOptions(cfg, log))
}

func rolloutOptions(cfg *config.Config, log zerolog.Logger) rollout.Options {
	g := cfg.GRPO
	return rollout.Options{
		SystemPrompt:        cfg.Chat.SystemPrompt,
		Sampling:            engine.SamplingParams{Temperature: g.Temperature, TopP: g.TopP, TopK: g.TopK, MinP: g.MinP},
		MaxCompletionTokens: g.MaxCompletionLength,
		MaxToolIterations:   g.MaxToolCallingIterations,
		FinalAnswerTool:     cfg.Chat.FinalAnswerTool,
		MaxConcurrency:      cfg.Rollout.MaxConcurrency,
		EpisodeTimeout:      cfg.Rollout.EpisodeTimeout,
		CallTimeout:         cfg.Rollout.CallTimeout,
		MaxRetries:          cfg.Rollout.MaxRetries,
		RetryBackoff:        cfg.Rollout.RetryBackoff,
		EnvDownTimeout:      cfg.Rollout.EnvDownTimeout,
		EnvChat:             envChats(cfg),
		LogPrompts:          cfg.Logging.LogPrompts,
		Seed:                cfg.Seed,
		Logger:              log.With().Str("component", "rollout").Logger(),
	}
}

// envChats are the env entries' own chat settings (nil where an entry
// overrides nothing).
func envChats(cfg *config.Config) []*rollout.EnvChat {
	out := make([]*rollout.EnvChat, len(cfg.Envs))
	for i, e := range cfg.Envs {
		c := e.Chat
		if c.SystemPrompt == nil && c.FinalAnswerTool == nil && c.RenderTools == nil && c.TemplateKwargs == nil {
			continue
		}
		ec := cfg.EnvChat(i)
		out[i] = &rollout.EnvChat{SystemPrompt: ec.SystemPrompt, FinalAnswerTool: ec.FinalAnswerTool, HideTools: !ec.RenderTools, Kwargs: ec.TemplateKwargs}
	}
	return out
}

// loopConfig derives the step budget and LR schedule.
func loopConfig(cfg *config.Config, shape config.BatchShape, lossCfg grpo.LossConfig, envList []*runEnv, s *taskSampler) (stepLoopConfig, error) {
	g := cfg.GRPO
	scale, err := grpo.ParseScaleRewards(g.ScaleRewards)
	if err != nil {
		return stepLoopConfig{}, err
	}
	agg, err := grpo.ParseRewardAggregation(g.RewardAggregation)
	if err != nil {
		return stepLoopConfig{}, err
	}
	maxSteps := g.MaxSteps
	if maxSteps == 0 {
		rounds := float64(s.RoundsPerEpoch()) * g.NumTrainEpochs
		maxSteps = int(math.Floor(rounds * float64(shape.S*shape.Iterations) / float64(shape.GA)))
		if maxSteps < 1 {
			return stepLoopConfig{}, &config.FieldError{Field: "grpo.num_train_epochs", Value: g.NumTrainEpochs,
				Allowed: fmt.Sprintf("enough epochs for one optimizer step (the envs have %d tasks, a round takes %d), or set max_steps", s.RoundsPerEpoch()*shape.PromptsPerRound(), shape.PromptsPerRound())}
		}
	}
	warmup := g.WarmupSteps
	if g.WarmupRatio > 0 {
		warmup = int(math.Ceil(g.WarmupRatio * float64(maxSteps)))
	}
	sched := worker.LRSchedule{Kind: g.LRSchedulerType, Peak: g.LearningRate, WarmupSteps: warmup, TotalSteps: maxSteps}
	if err := sched.Validate(); err != nil {
		return stepLoopConfig{}, err
	}
	lc := stepLoopConfig{
		Shape: roundShape{K: shape.PromptsPerRound(), G: shape.G, B: shape.B, S: shape.S, GA: shape.GA, Iterations: shape.Iterations},
		Loss:  lossCfg, Scale: scale, Aggregation: agg, MaskTruncated: g.MaskTruncatedCompletions,
		MaxSteps: maxSteps, Schedule: sched.At, SaveSteps: g.SaveSteps, LoggingSteps: g.LoggingSteps,
		MaxFailureFrac: cfg.Rollout.MaxFailureFraction, Seed: cfg.Seed,
		StepTimeout: cfg.Worker.StepTimeout, LogprobTimeout: cfg.Worker.LogprobTimeout, OptimizerTimeout: cfg.Worker.OptimizerTimeout,
		MaxFailedToolSteps: cfg.Rollout.MaxFailedToolSteps,
		// Sampler log-probs from another engine reweight the loss (TIS/MIS).
		UseSamplerLogps: cfg.Engine.Kind == "vllm" && g.VLLMISCorrection,
	}
	for _, e := range envList {
		lc.EnvNames = append(lc.EnvNames, e.Key)
		lc.Splits = append(lc.Splits, e.Config.Split)
		lc.Secrets = append(lc.Secrets, e.Config.Secrets)
	}
	return lc, nil
}

// loadPolicy opens the worker library and loads the model (from the
// checkpoint when resuming) with the optimizer settings of cfg.
func loadPolicy(ctx context.Context, cfg *config.Config, modelDir, resumeDir string, reference bool, getenv func(string) string, log zerolog.Logger) (*worker.Library, *workerPolicy, error) {
	path, _, err := worker.FindLibrary(cfg.Worker.Library, getenv)
	if err != nil {
		return nil, nil, err
	}
	lib, err := worker.Open(path)
	if err != nil {
		return nil, nil, err
	}
	g := cfg.GRPO
	opts := worker.ModelOptions{
		Dir: modelDir, Device: cfg.Worker.Device, DType: cfg.Worker.DType, Threads: cfg.Worker.Threads, Seed: cfg.Seed,
		Reference: reference, GradientCheckpointing: g.GradientCheckpointing,
		Optim: worker.AdamWOptions{Beta1: g.AdamBeta1, Beta2: g.AdamBeta2, Eps: g.AdamEpsilon, WeightDecay: g.WeightDecay, MaxGradNorm: g.MaxGradNorm},
	}
	if opts.Threads == 0 {
		opts.Threads = runtime.NumCPU()
	}
	if g.LoRA.Enabled {
		opts.LoRA = &worker.LoRAOptions{Rank: g.LoRA.Rank, Alpha: g.LoRA.Alpha, Dropout: g.LoRA.Dropout, TargetModules: g.LoRA.TargetModules, ModulesToSave: g.LoRA.ModulesToSave}
	}
	if resumeDir != "" {
		opts.Dir = checkpointModelDir(resumeDir, modelDir, g.LoRA.Enabled)
	}
	log.Info().Str("library", path).Str("model", opts.Dir).Str("device", opts.Device).Str("dtype", opts.DType).Int("threads", opts.Threads).Msg("loading policy")
	m, err := lib.LoadModel(ctx, opts)
	if err != nil {
		lib.Close()
		return nil, nil, err
	}
	p := &workerPolicy{m: m, lora: g.LoRA.Enabled}
	if resumeDir != "" {
		if err := p.restore(ctx, resumeDir); err != nil {
			m.Close()
			lib.Close()
			return nil, nil, fmt.Errorf("--resume from %s: %w", resumeDir, err)
		}
	}
	return lib, p, nil
}

// saveCheckpoint writes the last completed step: weights, optimizer, loop
// state and the round later steps still train on.
func saveCheckpoint(ctx context.Context, dir string, loop *stepLoop, p trainPolicy) (string, error) {
	st := loop.State()
	return writeCheckpoint(dir, st.Step, st, func(tmp string) error {
		if err := p.writeCheckpoint(ctx, tmp); err != nil {
			return err
		}
		return writeRound(tmp, loop.PendingRound())
	})
}

// runDir holds the run directory's open files.
type runDir struct {
	metrics, trajectories *jsonlWriter
	// tb writes every metric as TensorBoard scalars (logging.tensorboard).
	tb *tfevents.Writer
}

func (r *runDir) close() {
	r.metrics.Close()
	if r.trajectories != nil {
		r.trajectories.Close()
	}
	if r.tb != nil {
		r.tb.Close()
	}
}

// writeMetrics appends one step to metrics.jsonl and, with TensorBoard on,
// to RUN_DIR/tb under Hugging Face Trainer's tag names (train/reward, …).
func (r *runDir) writeMetrics(step int, m map[string]float64) error {
	err := r.metrics.Write(m)
	if r.tb != nil {
		if terr := r.tb.AddScalars(step, time.Now(), tfevents.TrainerTags(m)); terr != nil {
			err = errors.Join(err, fmt.Errorf("tensorboard: %w", terr))
		} else if terr := r.tb.Flush(); terr != nil {
			err = errors.Join(err, fmt.Errorf("tensorboard: %w", terr))
		}
	}
	return err
}

// openRunDir writes config.yaml and manifest.json and opens the JSONL logs
// (appending, so a resumed run continues them).
// On resume both logs are first cut back to the checkpoint's step, so a
// reader sees every step once (a killed run may have logged steps past it).
func openRunDir(cfg *config.Config, modelDir string, envList []*runEnv, ro RunOptions, lib *worker.Library, step int) (*runDir, error) {
	y, err := cfg.YAML()
	if err != nil {
		return nil, fmt.Errorf("render config: %w", err)
	}
	if err := writeFileAtomic(filepath.Join(cfg.OutputDir, "config.yaml"), y); err != nil {
		return nil, err
	}
	hash, err := model.Hash(modelDir)
	if err != nil {
		return nil, fmt.Errorf("hash model %s: %w", modelDir, err)
	}
	info := lib.Info()
	man := manifest{
		OrtrainVersion: ro.Version, LibtorchVersion: info.LibtorchVersion, WorkerVersion: fmt.Sprint(info.ABIVersion),
		Model: modelDir, ModelHash: hash, Seed: cfg.Seed, StartedAt: time.Now().UTC().Format(time.RFC3339),
	}
	for _, e := range envList {
		man.Envs = append(man.Envs, manifestEnv{Key: e.Key, Target: e.Config.Target, Name: e.Name, Protocol: string(e.Conn.Protocol()),
			Split: e.Config.Split, Indices: e.Indices, Secrets: e.Config.SecretNames()})
	}
	if err := writeJSONAtomic(filepath.Join(cfg.OutputDir, "manifest.json"), man); err != nil {
		return nil, err
	}
	rd := &runDir{}
	metrics, trajectories := filepath.Join(cfg.OutputDir, "metrics.jsonl"), filepath.Join(cfg.OutputDir, "trajectories.jsonl")
	if ro.Resume {
		for _, path := range []string{metrics, trajectories} {
			if err := truncateJSONL(path, step); err != nil {
				return nil, fmt.Errorf("--resume: %w", err)
			}
		}
	}
	if rd.metrics, err = openJSONL(metrics); err != nil {
		return nil, err
	}
	if cfg.Logging.TensorBoard {
		// A resumed run adds a new event file; TensorBoard reads them all.
		if rd.tb, err = tfevents.Create(filepath.Join(cfg.OutputDir, "tb")); err != nil {
			rd.metrics.Close()
			return nil, err
		}
	}
	if cfg.Logging.LogCompletions {
		if rd.trajectories, err = openJSONL(trajectories); err != nil {
			rd.close()
			return nil, err
		}
	}
	return rd, nil
}

// wireHooks connects the loop to the run directory and the caller.
func wireHooks(loop *stepLoop, rd *runDir, res *Result, p trainPolicy, cfg *config.Config, ro RunOptions) {
	loop.OnRolloutDone = ro.OnRollout
	loop.OnMetrics = func(m StepMetrics) {
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
		loop.OnTrajectory = func(step int, t *rollout.Trajectory, reward, adv float64) {
			if err := rd.trajectories.Write(newTrajectoryRecord(step, t, reward, adv)); err != nil {
				ro.Logger.Error().Err(err).Msg("write trajectories.jsonl")
			}
		}
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

// CheckedEnv is one env --dry-run reached.
type CheckedEnv struct {
	Name, Target, Split string
	Tasks               int
}

// CheckReport is what Check found.
type CheckReport struct {
	ModelDir string
	Envs     []CheckedEnv
	Device   string
}

// Check loads what a run would load — the model, its tokenizer and chat
// template, every env and the tools the config names, the worker with the
// model, vLLM when engine.kind is vllm — and checks output_dir as the run
// would (for --dry-run). It creates nothing: a model the preset would
// create is made in a temporary directory. report is called after each
// part that passed.
func Check(ctx context.Context, cfg *config.Config, ro RunOptions, report func(part, detail string)) error {
	if _, err := planRunChecks(cfg, ro); err != nil {
		return err
	}
	report("output", cfg.OutputDir)
	set, err := compileRewards(cfg)
	if err != nil {
		return err
	}
	report("rewards", strings.Join(set.Names(), ", "))
	probe := *cfg
	if _, err := os.Stat(cfg.Model); cfg.InitModelPreset != "" && errors.Is(err, os.ErrNotExist) {
		tmp, err := os.MkdirTemp("", "ortrain-dry-run-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		probe.Model = filepath.Join(tmp, "model")
	}
	dir, err := PrepareModel(&probe, ro.Getenv, zerolog.Nop())
	if err != nil {
		return err
	}
	if probe.Model != cfg.Model {
		report("model", fmt.Sprintf("%s (would be created from init_model_preset %s)", cfg.Model, cfg.InitModelPreset))
	} else {
		report("model", dir)
	}
	if _, err := LoadChat(dir, cfg.Chat); err != nil {
		return err
	}
	report("tokenizer", "and chat template")
	envList, err := connectEnvs(ctx, cfg.Envs, ro.Getenv, ro.Logger)
	if err != nil {
		return err
	}
	defer closeEnvs(envList)
	if err := checkFinalAnswerTools(ctx, cfg, envList); err != nil {
		return err
	}
	for _, e := range envList {
		report("env", fmt.Sprintf("%s (%s over %s, split %s, %d tasks)", e.Key, e.Config.Target, e.Conn.Protocol(), e.Config.Split, len(e.Indices)))
	}
	if err := checkVLLM(cfg, ro); err != nil {
		return err
	}
	lib, p, err := loadPolicy(ctx, &probe, dir, "", false, ro.Getenv, zerolog.Nop())
	if err != nil {
		return err
	}
	p.m.Close()
	if err := lib.Close(); err != nil {
		return err
	}
	report("worker", "loaded the model on "+cfg.Worker.Device)
	return nil
}

// checkVLLM: with engine.kind vllm and no vllm_urls, the command that
// launches replicas must exist.
func checkVLLM(cfg *config.Config, ro RunOptions) error {
	e := cfg.Engine
	if e.Kind != "vllm" || len(e.VLLMURLs) > 0 {
		return nil
	}
	cmd := e.VLLMCommand
	if len(cmd) == 0 {
		cmd = []string{"vllm"}
	}
	if cmd[0] == "ortrain" || cmd[0] == ro.Executable {
		return nil
	}
	if _, err := exec.LookPath(cmd[0]); err != nil {
		return &config.FieldError{Field: "engine.vllm_command", Value: strings.Join(cmd, " "),
			Allowed: fmt.Sprintf("a command on PATH (%v): install vLLM (pip install vllm), give engine.vllm_urls, or use [ortrain, serve-engine]", err)}
	}
	return nil
}
