package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ortrain/ortrain/configs"
	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/launch"
	"github.com/ortrain/ortrain/internal/train"
)

// RunOptions holds the run command's flags and dependencies.
type RunOptions struct {
	IO     *IOStreams
	Logger zerolog.Logger
	Getenv func(string) string

	Executable func() (string, error)
	Environ    func() []string
	// Argv0 names the binary in the commands the summary suggests.
	Argv0 string
	// EnvProtocol and EnvTokenEnv pin --env's protocol and name the
	// variable holding its bearer token (with --env only).
	EnvProtocol, EnvTokenEnv string
	// InterruptAfter (hidden --interrupt-after STEP[+DELAY]) sends this
	// process a real SIGINT DELAY after step STEP is logged (at the latest
	// when step STEP+1 is): fault injection
	// for the resume tests, timed by the run's own progress rather than by a
	// test reading its log, which a busy machine can leave steps behind.
	InterruptAfter string

	ConfigFile string
	Resume     bool
	// ResumeOrStart resumes when output_dir has a complete checkpoint and
	// starts afresh otherwise (--resume-or-start).
	ResumeOrStart bool
	Overwrite     bool
	// ResumeWithChanges accepts a resume whose settings change the batch or
	// the model (recorded in the run directory).
	ResumeWithChanges bool
	PrintConfig       bool
	DryRun            bool
	// Smoke runs the config for real on CPU with a tiny model of its
	// family (smoke.Run) and prints a verdict instead of training.
	Smoke                           bool
	SmokeDir, SmokeJSON, SmokeJUnit string
	// NProcPerNode > 1 starts that many ranks of a data-parallel run on
	// this machine as supervised children (runRanks).
	NProcPerNode int
	// args rebuilds this command line for the ranks.
	args func() []string
	// printWeights: the command prints its checkpoint's weights (sft:
	// what `run --model` takes), not the checkpoint directory (run), with
	// several local ranks as with one.
	printWeights bool
	// Flags maps config keys to the flags that override them.
	Flags map[string]*pflag.Flag
	// Sets are --set KEY=VALUE assignments of any config key.
	Sets []string
}

// configFlags are the run/eval flags that set config keys, each with the
// key it overrides. Everything else lives in the YAML file or ORTRAIN_* vars.
var configFlags = []struct {
	key, name, usage string
	kind             string
}{
	{"model", "model", "model directory or Hugging Face repo id (from the local HF cache)", "string"},
	{"output_dir", "output-dir", "run directory (config, manifest, metrics, trajectories, checkpoints)", "string"},
	{"seed", "seed", "random seed", "int"},
	{"grpo.max_steps", "max-steps", "optimizer steps to train (0: num_train_epochs decides)", "int"},
	{"grpo.learning_rate", "learning-rate", "peak learning rate", "float"},
	{"grpo.num_generations", "num-generations", "completions per prompt (group size G)", "int"},
	{"grpo.per_device_train_batch_size", "per-device-train-batch-size", "completions per micro-batch (B)", "int"},
	{"grpo.loss_type", "loss-type", "loss: dapo, grpo, bnpo, dr_grpo, cispo, sapo, luspo, vespo", "string"},
	{"grpo.max_completion_length", "max-completion-length", "token budget after the prompt (all turns)", "int"},
	{"grpo.temperature", "temperature", "sampling temperature", "float"},
	{"worker.device", "device", "trainer device: auto (CUDA when the worker has it and sees a GPU, else CPU), cpu, cuda or cuda:N", "string"},
	{"engine.kind", "engine", "generation backend: builtin or vllm", "string"},
	{"async.max_off_policy_steps", "max-off-policy-steps", "generate rounds this many steps ahead of training (0: synchronous)", "int"},
}

// addConfigFlags registers configFlags (but the names in except) on fs
// and records them in flags.
func addConfigFlags(fs *pflag.FlagSet, flags map[string]*pflag.Flag, except ...string) {
	for _, f := range configFlags {
		if slices.Contains(except, f.name) {
			continue
		}
		// Every kind is taken as text: the config parses it by the key's
		// type, so "--max-steps 1.5" is refused in words, not strconv's.
		// --help still shows the type a user types (--max-steps int).
		fs.Var(&textFlag{kind: f.kind}, f.name, f.usage)
		fl := fs.Lookup(f.name)
		fl.DefValue = config.DefaultText(f.key) // --help's "(default …)"; flagLayer reads only changed flags
		flags[f.key] = fl
	}
}

// addSetFlag registers --set KEY=VALUE, the one form that sets any config
// key from the command line.
func addSetFlag(fs *pflag.FlagSet, sets *[]string) {
	fs.StringArrayVar(sets, "set", nil, "set any config key, KEY=VALUE (repeatable; e.g. --set grpo.beta=0.04 --set engine.vllm_urls='[\"http://h:8000\"]'); above ORTRAIN_* variables, below the named flags")
}

// textFlag holds a flag's text as given; kind is what --help shows.
type textFlag struct{ kind, value string }

func (f *textFlag) String() string     { return f.value }
func (f *textFlag) Set(v string) error { f.value = v; return nil }
func (f *textFlag) Type() string       { return f.kind }

func newRunCmd(deps *Deps, runF func(context.Context, *RunOptions) error) *cobra.Command {
	opts := &RunOptions{IO: deps.IO, Getenv: deps.Getenv, Executable: deps.Executable, Environ: deps.Environ, Argv0: deps.Argv0, Flags: map[string]*pflag.Flag{}}
	var env string
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Train a policy with GRPO against ORS environments",
		Long: `Train a policy with GRPO against one or more ORS environments.

Each optimizer step samples prompts (each repeated num_generations times),
runs one ORS session per rollout — the policy calls the environment's tools
turn by turn — turns the rewards into group advantages, and takes a gradient
step in the libtorch worker. Everything lands in output_dir: config.yaml,
manifest.json, metrics.jsonl (TRL's metric names), trajectories.jsonl and
checkpoints/step-N (complete or absent).

Without --config, the embedded quickstart runs: a tiny random model learns the
built-in letters env on CPU in ` + quickstartTime + `.

Settings resolve as: embedded defaults < --config YAML < ORTRAIN_* environment
variables (grpo.learning_rate is ORTRAIN_GRPO_LEARNING_RATE) < flags. The
defaults the flags show are what a --config file that omits the key gets;
without --config the quickstart's settings apply (--print-config shows all).

SIGINT/SIGTERM stop new rollouts, close every session, save a checkpoint and
exit with code 2; --resume continues from the latest complete checkpoint.

Data parallelism: --nproc-per-node N starts N ranks here; under torchrun,
a Kubeflow PyTorchJob or srun, each process reads its rank from RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT (or SLURM_PROCID, SLURM_NTASKS and
SLURM_JOB_NODELIST). Every rank rolls out whole groups of its slice of the
round and trains on per_device_train_batch_size rows of each micro-batch;
gradients are averaged over ranks, and rank 0 alone writes output_dir.`,
		Example: `  # the quickstart (CPU, built-in env, tiny model)
  ortrain run

  # a config file, a few steps more, and resume after an interrupt
  ortrain run --config configs/quickstart.yaml --max-steps 60
  ortrain run --config configs/quickstart.yaml --resume

  # a hosted env (needs OPENREWARD_API_KEY) with a cached model
  ortrain run --env Eigent/SETA --model Qwen/Qwen3-4B --config configs/seta.yaml

  # two data-parallel ranks on this machine (c10d: Gloo on CPU, NCCL on GPU)
  ortrain run --config configs/quickstart.yaml --nproc-per-node 2

  # check everything without training, or show the resolved config
  ortrain run --config my.yaml --dry-run
  ortrain run --config my.yaml --print-config

  # CI: the config for real on CPU in a minute (a tiny model of its family,
  # its own tokenizer, template, envs and rewards), the verdict as JUnit XML
  ortrain run --config my.yaml --smoke --smoke-junit smoke.xml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Logger = deps.Logger
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return runRun(cmd.Context(), opts, env)
		},
	}
	fs := cmd.Flags()
	fs.StringVarP(&opts.ConfigFile, "config", "c", "", "YAML config file (default: the embedded quickstart)")
	fs.StringVar(&env, "env", "", "train on this env only: a URL, Owner/Env, or builtin:NAME (replaces the config's envs)")
	addEnvTargetFlags(fs, &opts.EnvProtocol, &opts.EnvTokenEnv)
	fs.BoolVar(&opts.Resume, "resume", false, "continue from the latest complete checkpoint in output_dir")
	fs.BoolVar(&opts.ResumeOrStart, "resume-or-start", false, "continue from output_dir's latest complete checkpoint if it has one, else start afresh there, clearing what an attempt that saved nothing left (for jobs a scheduler may preempt and requeue)")
	fs.BoolVar(&opts.ResumeWithChanges, "resume-with-changes", false, "with --resume: accept changed batch, model or env settings (recorded in output_dir/resume-changes.jsonl)")
	fs.BoolVar(&opts.Overwrite, "overwrite", false, "start afresh in an output_dir holding an earlier run (deletes its logs and checkpoints)")
	fs.BoolVar(&opts.PrintConfig, "print-config", false, "print the resolved config as YAML and exit")
	fs.BoolVar(&opts.DryRun, "dry-run", false, "validate config, model, worker and env connectivity, then exit")
	addSmokeFlags(fs, opts)
	fs.StringVar(&opts.InterruptAfter, "interrupt-after", "", "fault injection: SIGINT this run DELAY after step STEP (STEP[+DELAY], e.g. 3+120ms)")
	_ = fs.MarkHidden("interrupt-after")
	fs.IntVar(&opts.NProcPerNode, "nproc-per-node", 1, "data-parallel ranks to start on this machine (each trains on per_device_train_batch_size rows of every micro-batch; RANK/WORLD_SIZE or srun set ranks across machines)")
	opts.args = func() []string { return rankArgs(cmd) }
	addConfigFlags(fs, opts.Flags)
	addSetFlag(fs, &opts.Sets)
	cmd.Long += "\n\n" + envVarHelp()
	return cmd
}

// loadRunConfig resolves the config of run and eval.
//
// The embedded quickstart is tuned for its own env: a random byte-level
// model, a final-answer tool, tools left out of the prompt. So --env with
// another target and no --config takes TRL's defaults instead, and needs
// --model; and init_model_preset creates a model only at the path the
// config that names it gives, never at a --model or ORTRAIN_MODEL path (a
// random model must not shadow a Hugging Face name).
func loadRunConfig(opts *RunOptions, env string) (*config.Config, error) {
	src := configSource(opts)
	modelGiven := src.Flags["model"] != nil || (opts.Getenv != nil && opts.Getenv(config.EnvVarFor("model")) != "")
	if opts.ConfigFile == "" {
		src.Data = configs.Quickstart()
		if env != "" && env != quickstartEnv() {
			if !modelGiven {
				return nil, usageErrorf("--env %s needs --model: without --config the embedded quickstart's tiny random model only learns its own env (%s); "+
					"pass a model (e.g. --model Qwen/Qwen3-4B) to train with TRL's defaults, or a recipe such as configs/seta.yaml for Eigent/SETA (ortrain run --config configs/seta.yaml)",
					env, quickstartEnv())
			}
			src.Data = nil
		}
	}
	cfg, err := config.Resolve(src)
	if err != nil {
		return nil, &UsageError{Err: err}
	}
	presetGiven := opts.Getenv != nil && opts.Getenv(config.EnvVarFor("init_model_preset")) != ""
	if modelGiven && !presetGiven {
		cfg.InitModelPreset = ""
	}
	if env != "" {
		cfg.Envs = []config.EnvConfig{{Target: env, Split: "train", Weight: 1, Protocol: opts.EnvProtocol, TokenEnv: opts.EnvTokenEnv}}
	} else if opts.EnvProtocol != "" || opts.EnvTokenEnv != "" {
		return nil, usageErrorf("--protocol and --token-env go with --env; for the config's envs set envs[].protocol and envs[].token_env")
	}
	return cfg, nil
}

// configSource is the config layers the command's flags give: --config,
// the ORTRAIN_* environment and the flags that were set.
func configSource(opts *RunOptions) config.Source {
	src := config.Source{File: opts.ConfigFile, Getenv: opts.Getenv, Flags: map[string]*pflag.Flag{}}
	if opts.Environ != nil {
		src.Environ = opts.Environ()
	}
	for k, f := range opts.Flags {
		if f != nil && f.Changed {
			src.Flags[k] = f
		}
	}
	src.Sets = opts.Sets
	return src
}

// printConfig writes the resolved config as YAML (--print-config).
func printConfig(io *IOStreams, cfg *config.Config) error {
	y, err := cfg.YAML()
	if err != nil {
		return err
	}
	_, err = io.Out.Write(y)
	return err
}

// placeRanks finds this process's place in a data-parallel run; with
// --nproc-per-node N > 1 it starts the N local ranks itself and reports
// launched once they are done.
func placeRanks(ctx context.Context, opts *RunOptions, cfg *config.Config) (world launch.World, launched bool, err error) {
	if world, err = launch.FromEnv(opts.Getenv); err != nil {
		return world, false, &UsageError{Err: err}
	}
	if opts.NProcPerNode < 1 {
		return world, false, usageErrorf("--nproc-per-node %d: want at least 1", opts.NProcPerNode)
	}
	if opts.NProcPerNode == 1 {
		return world, false, nil
	}
	if world.Distributed() {
		return world, false, usageErrorf("--nproc-per-node %d inside a launcher that already set %d ranks (%s): pass one or the other", opts.NProcPerNode, world.WorldSize, world.Source)
	}
	return world, true, runRanks(ctx, opts, cfg)
}

// quickstartEnv is the env target of the embedded quickstart.
func quickstartEnv() string {
	cfg, err := config.Resolve(config.Source{Data: configs.Quickstart()})
	if err != nil || len(cfg.Envs) == 0 {
		return ""
	}
	return cfg.Envs[0].Target
}

func runRun(ctx context.Context, opts *RunOptions, env string) error {
	cfg, err := loadRunConfig(opts, env)
	if err != nil {
		return err
	}
	if opts.PrintConfig {
		return printConfig(opts.IO, cfg)
	}
	if err := cfg.Validate(); err != nil {
		return &UsageError{Err: err}
	}
	if opts.Resume && opts.Overwrite {
		return usageErrorf("--resume and --overwrite contradict each other: pass one")
	}
	if opts.ResumeOrStart {
		if opts.Resume || opts.Overwrite {
			return usageErrorf("--resume-or-start decides between --resume and --overwrite itself: pass only it")
		}
		if err := chooseResumeOrStart(opts, cfg.OutputDir); err != nil {
			return err
		}
	}
	if opts.ResumeWithChanges && !opts.Resume {
		return usageErrorf("--resume-with-changes goes with --resume (or --resume-or-start)")
	}
	if opts.DryRun {
		return dryRun(ctx, cfg, opts)
	}
	if opts.Smoke {
		return smokeRun(ctx, cfg, opts)
	}
	world, launched, err := placeRanks(ctx, opts, cfg)
	if err != nil || launched {
		return err
	}
	logResolved(opts.Logger, cfg)
	prog := newProgress(opts.IO, opts.Logger)
	ro := runOptions(opts)
	ro.World = world
	ro.OnStart, ro.OnMetrics, ro.OnRollout = prog.start, prog.step, prog.rollout
	if opts.InterruptAfter != "" {
		step, delay, err := parseInterruptAfter(opts.InterruptAfter)
		if err != nil {
			return err
		}
		// The signal lands DELAY after step STEP, or at step STEP+1 if
		// that comes first: inside step STEP+1 either way.
		var once sync.Once
		interrupt := func() { once.Do(func() { _ = syscall.Kill(os.Getpid(), syscall.SIGINT) }) }
		ro.OnMetrics = func(m train.StepMetrics) {
			prog.step(m)
			switch m.Step {
			case step:
				time.AfterFunc(delay, interrupt)
			case step + 1:
				interrupt()
			}
		}
	}
	res, err := train.Run(ctx, cfg, ro)
	prog.finish()
	printRunSummary(opts.IO.ErrOut, opts.Argv0, res)
	if isInterrupted(err) && res != nil && res.Checkpoint != "" && opts.args != nil {
		fmt.Fprintf(opts.IO.ErrOut, "  continue    %s\n", resumeCommand(opts.Argv0, opts.args()))
	}
	if err != nil {
		return err
	}
	// Under --nproc-per-node the launcher prints it, once (rank 0's
	// output is echoed to the terminal as well).
	if world.Rank == 0 && world.Source != "nproc-per-node" {
		fmt.Fprintf(opts.IO.Out, "%s\n", res.Checkpoint)
	}
	return nil
}

// runOptions are the train options the flags give.
func runOptions(opts *RunOptions) train.RunOptions {
	ro := train.RunOptions{
		Logger: opts.Logger, Getenv: opts.Getenv, Version: Version(),
		Resume: opts.Resume, Overwrite: opts.Overwrite, ResumeWithChanges: opts.ResumeWithChanges,
	}
	if opts.Executable != nil {
		ro.Executable, _ = opts.Executable()
	}
	if opts.Environ != nil {
		ro.Environ = opts.Environ()
	}
	return ro
}

// dryRun checks the model, worker and envs without training.
func dryRun(ctx context.Context, cfg *config.Config, opts *RunOptions) error {
	return train.Check(ctx, cfg, runOptions(opts), func(part, detail string) {
		fmt.Fprintf(opts.IO.Out, "ok  %-10s %s\n", part, detail)
	})
}

// logResolved logs the settings that shape the run, once, at start.
func logResolved(log zerolog.Logger, cfg *config.Config) {
	targets := make([]string, len(cfg.Envs))
	for i, e := range cfg.Envs {
		targets[i] = e.Target
	}
	g := cfg.GRPO
	log.Info().Str("model", cfg.Model).Strs("envs", targets).Str("output_dir", cfg.OutputDir).
		Int("num_generations", g.NumGenerations).Int("batch", g.PerDeviceTrainBatchSize).
		Str("loss_type", g.LossType).Float64("learning_rate", g.LearningRate).Int("max_steps", g.MaxSteps).
		Str("engine", cfg.Engine.Kind).Str("device", cfg.Worker.Device).Msg("run")
}

// envVarHelp documents the environment variables, from the config's own key table.
func envVarHelp() string {
	var b strings.Builder
	b.WriteString("Environment variables:\n")
	b.WriteString("  OPENREWARD_API_KEY       API key for catalog envs (Owner/Env); never logged\n")
	b.WriteString("  OPENREWARD_URL           platform base URL (default https://openreward.ai)\n")
	b.WriteString("  OPENREWARD_API_URL, OPENREWARD_SESSION_URL  override the api./sessions. hosts\n")
	b.WriteString("  ORTRAIN_WORKER_LIB       path of the libtorch worker library\n")
	b.WriteString("  ORTRAIN_CACHE_DIR        where measured CPU decode kernels are kept (default ~/.cache/ortrain)\n")
	b.WriteString("  ORTRAIN_WORKER_ONEDNN    off: hide oneDNN's sgemm from the worker (its decode kernels use at::mm)\n")
	b.WriteString("  HF_HUB_CACHE, HF_HOME    where Hugging Face repo ids are looked up\n")
	b.WriteString("  ORTRAIN_<KEY>            any config key, e.g. ORTRAIN_GRPO_LEARNING_RATE, ORTRAIN_ROLLOUT_CALL_TIMEOUT")
	return b.String()
}

// addEnvTargetFlags registers the flags that go with --env on every command
// that takes one.
func addEnvTargetFlags(fs *pflag.FlagSet, protocol, tokenEnv *string) {
	fs.StringVar(protocol, "protocol", "", "the protocol --env speaks: ors, openenv or auto (default: a URL is probed, a builtin speaks its own, Owner/Env is ORS)")
	fs.StringVar(tokenEnv, "token-env", "", "environment variable holding a bearer token for --env (OpenEnv: a private HF Space or a secured server; default HF_TOKEN for *.hf.space)")
}

// parseInterruptAfter reads --interrupt-after STEP[+DELAY].
func parseInterruptAfter(v string) (step int, delay time.Duration, err error) {
	s, d, hasDelay := strings.Cut(v, "+")
	if step, err = strconv.Atoi(s); err != nil || step < 1 {
		return 0, 0, usageErrorf("--interrupt-after %q: want STEP[+DELAY] with STEP >= 1, e.g. 3+120ms", v)
	}
	if hasDelay {
		if delay, err = time.ParseDuration(d); err != nil || delay < 0 {
			return 0, 0, usageErrorf("--interrupt-after %q: want STEP[+DELAY] with a duration DELAY, e.g. 3+120ms", v)
		}
	}
	return step, delay, nil
}

// chooseResumeOrStart turns --resume-or-start into --resume when dir has a
// complete checkpoint, and into --overwrite when it has none: an attempt
// that was stopped before its first checkpoint saved nothing to continue.
// A run still going there is refused either way (its directory is locked).
func chooseResumeOrStart(opts *RunOptions, dir string) error {
	ckpt, step, err := train.LatestCheckpoint(dir)
	switch {
	case err == nil:
		opts.Resume = true
		opts.Logger.Info().Str("checkpoint", ckpt).Int("step", step).Msg("--resume-or-start: resuming")
	case errors.Is(err, train.ErrNoCheckpoint):
		opts.Overwrite = true
		opts.Logger.Info().Str("output_dir", dir).Msg("--resume-or-start: no complete checkpoint, starting afresh")
	default:
		return fmt.Errorf("--resume-or-start: %w", err)
	}
	return nil
}

// resumeCommand is the command that continues an interrupted run: the same
// flags (as rankArgs gives them, "run --flag=value"), with whatever chose
// a fresh start or a fault replaced by --resume.
func resumeCommand(argv0 string, args []string) string {
	if argv0 == "" {
		argv0 = "ortrain"
	}
	out := []string{shellQuote(argv0)}
	for _, a := range args {
		name, _, _ := strings.Cut(a, "=")
		switch name {
		case "--overwrite", "--resume", "--resume-or-start", "--interrupt-after":
			continue
		}
		out = append(out, shellQuote(a))
	}
	return strings.Join(append(out, "--resume"), " ")
}
