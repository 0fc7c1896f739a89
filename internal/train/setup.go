package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/curriculum"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/launch"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/reward"
	"github.com/ortrain/ortrain/internal/rollout"
	"github.com/ortrain/ortrain/internal/worker"
)

// stack is what a run and an eval build before rolling out: the model, its
// chat template, the connected envs, the worker with the policy, the
// generation engine and the rollout runner.
type stack struct {
	modelDir string
	chat     rollout.ChatSpec
	envs     []*runEnv
	lib      *worker.Library
	policy   *workerPolicy
	gen      engine.Generator
	runner   rolloutRunner
	rewards  *reward.Set
	// group is the data-parallel process group (nil: one process).
	group *worker.Group
}

// stackOptions say what differs between a run and an eval.
type stackOptions struct {
	resumeDir  string // load weights and optimizer state from this checkpoint
	adapterDir string // load this PEFT adapter over the model (eval of a LoRA run)
	reference  bool   // keep a frozen reference model (beta > 0)
	getenv     func(string) string
	logger     zerolog.Logger
	// world places a rank of a data-parallel run on its own GPU (rankDevice).
	world launch.World
	// engine builds the generation backend over the loaded policy.
	engine func(ctx context.Context, modelDir string, p *workerPolicy, st *stack) (engine.Generator, error)
}

// buildStack loads everything in dependency order; on error it releases
// what it had built.
func buildStack(ctx context.Context, cfg *config.Config, so stackOptions) (_ *stack, err error) {
	st := &stack{}
	defer func() {
		if err != nil {
			st.close()
		}
	}()
	if st.rewards, err = compileRewards(cfg); err != nil {
		return nil, err
	}
	if st.modelDir, err = PrepareModel(cfg, so.getenv, so.logger); err != nil {
		return nil, err
	}
	if st.chat, err = LoadChat(st.modelDir, cfg.Chat); err != nil {
		return nil, err
	}
	if st.envs, err = connectEnvs(ctx, cfg.Envs, so.getenv, so.logger); err != nil {
		return nil, err
	}
	if err = checkFinalAnswerTools(ctx, cfg, st.envs); err != nil {
		return nil, err
	}
	if st.lib, st.policy, err = loadPolicy(ctx, cfg, st.modelDir, so.resumeDir, so.reference, so.world, so.getenv, so.logger); err != nil {
		return nil, err
	}
	if so.adapterDir != "" {
		if err = st.policy.m.LoadPEFT(ctx, so.adapterDir); err != nil {
			return nil, err
		}
	}
	if st.gen, err = so.engine(ctx, st.modelDir, st.policy, st); err != nil {
		return nil, err
	}
	if st.runner, err = newRollouts(cfg, st.envs, st.gen, st.chat, st.modelDir, so.logger); err != nil {
		return nil, err
	}
	return st, nil
}

// close releases the stack in reverse order of construction.
func (st *stack) close() {
	if st.runner != nil {
		closeRollouts(st.runner)
	}
	if st.gen != nil {
		_ = st.gen.Close()
	}
	if st.group != nil {
		_ = st.group.Close()
	}
	if st.policy != nil {
		st.policy.m.Close()
	}
	if st.lib != nil {
		_ = st.lib.Close()
	}
	closeEnvs(st.envs)
}

// PrepareModel resolves the model directory; a missing directory is created
// with init_model_preset when one is configured (the quickstart).
func PrepareModel(cfg *config.Config, getenv func(string) string, log zerolog.Logger) (string, error) {
	if cfg.Model == "" {
		return "", &config.FieldError{Field: "model", Value: "", Allowed: "a model directory or Hugging Face repo id (or init_model_preset to create one)"}
	}
	if cfg.InitModelPreset != "" {
		if _, err := os.Stat(cfg.Model); errors.Is(err, os.ErrNotExist) {
			preset, ok := model.PresetByName(cfg.InitModelPreset)
			if !ok {
				return "", &config.FieldError{Field: "init_model_preset", Value: cfg.InitModelPreset, Allowed: "one of " + strings.Join(model.PresetNames(), ", ")}
			}
			log.Info().Str("dir", cfg.Model).Str("preset", preset.Name).Msg("creating model")
			if err := model.Init(cfg.Model, preset, cfg.Seed); err != nil {
				return "", fmt.Errorf("create model %s: %w", cfg.Model, err)
			}
		}
	}
	// model.Resolve's error names the model, the paths searched and the fix.
	dir, _, err := model.Resolve(cfg.Model, getenv)
	if err != nil {
		return "", err
	}
	return dir, nil
}

// chatTemplate compiles the template at path (chat.template_path) or, with
// no path, the model directory's own.
func chatTemplate(tok *chat.Tokenizer, dir, path string) (*chat.Template, error) {
	if path == "" {
		tmpl, err := tok.Template("")
		if err != nil {
			return nil, fmt.Errorf("chat template of %s: %w (add chat_template to tokenizer_config.json or a chat_template.jinja file, or set chat.template_path)", dir, err)
		}
		return tmpl, nil
	}
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, &config.FieldError{Field: "chat.template_path", Value: path, Allowed: fmt.Sprintf("a readable Jinja chat template file (%v)", err)}
	}
	tmpl, err := chat.NewTemplate(string(src), tok.SpecialStrings(), nil)
	if err != nil {
		return nil, &config.FieldError{Field: "chat.template_path", Value: path, Allowed: fmt.Sprintf("a Jinja chat template that compiles (%v)", err)}
	}
	return tmpl, nil
}

// LoadChat loads the tokenizer and chat template of a model directory with
// the configured tool-call format and template kwargs.
func LoadChat(dir string, cc config.ChatConfig) (rollout.ChatSpec, error) {
	tok, err := chat.LoadTokenizer(dir)
	if err != nil {
		return rollout.ChatSpec{}, fmt.Errorf("load tokenizer of %s: %w", dir, err)
	}
	tmpl, err := chatTemplate(tok, dir, cc.TemplatePath)
	if err != nil {
		return rollout.ChatSpec{}, err
	}
	spec := rollout.ChatSpec{Tokenizer: tok, Template: tmpl, Kwargs: cc.TemplateKwargs, Policy: chat.KeepSampled, HideTools: !cc.RenderTools}
	if cc.ToolCallFormat != "" && cc.ToolCallFormat != "auto" {
		f, err := chat.ParseToolCallFormat(cc.ToolCallFormat)
		if err != nil {
			return spec, &config.FieldError{Field: "chat.tool_call_format", Value: cc.ToolCallFormat, Allowed: err.Error()}
		}
		spec.Format = &f
		return spec, nil
	}
	// A template whose tool-call format is unknown would leave every call
	// the model writes in its content, silently: refuse at startup.
	f, err := chat.DetectToolCallFormat(tmpl.Source())
	if err != nil {
		return spec, &config.FieldError{Field: "chat.tool_call_format", Value: cc.ToolCallFormat,
			Allowed: fmt.Sprintf("a format set explicitly: the chat template of %s matches none (%v)", dir, err)}
	}
	spec.Format = &f
	return spec, nil
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
func loopConfig(cfg *config.Config, shape config.BatchShape, lossCfg grpo.LossConfig, envList []*runEnv, s *curriculum.Sampler) (stepLoopConfig, error) {
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
		DynamicSampling: g.DynamicSampling, MaxExtraRounds: g.DynamicSamplingMaxExtraRounds,
		MaxSteps: maxSteps, Schedule: sched.At, SaveSteps: g.SaveSteps, LoggingSteps: g.LoggingSteps,
		MaxFailureFrac: cfg.Rollout.MaxFailureFraction, Seed: cfg.Seed, Trajectories: cfg.Logging.LogCompletions,
		StepTimeout: cfg.Worker.StepTimeout, LogprobTimeout: cfg.Worker.LogprobTimeout, OptimizerTimeout: cfg.Worker.OptimizerTimeout,
		PackTokens:         cfg.Worker.PackTokens,
		MaxFailedToolSteps: cfg.Rollout.MaxFailedToolSteps,
		// Sampler log-probs from another engine, or from older weights,
		// reweight the loss (TIS/MIS).
		UseSamplerLogps:   (cfg.Engine.Kind == "vllm" || cfg.Async.MaxOffPolicySteps > 0) && g.VLLMISCorrection,
		MaxOffPolicySteps: cfg.Async.MaxOffPolicySteps,
		SharedEngine:      cfg.Engine.Kind == "vllm",
		// The async builtin copy scores its rounds again where sampling
		// truncates nothing (see rescoreSamplerLogprobs).
		RescoreSamplerLogps: g.TopP == 1 && g.TopK == 0 && g.MinP == 0,
	}
	for _, e := range envList {
		lc.EnvNames = append(lc.EnvNames, e.Key)
		lc.Splits = append(lc.Splits, e.Config.Split)
		lc.Secrets = append(lc.Secrets, e.Config.Secrets)
	}
	return lc, nil
}

// modelOptions are the worker settings of the policy (and of an async
// run's sampler copy, which keeps no reference).
func modelOptions(cfg *config.Config, modelDir string, reference bool) worker.ModelOptions {
	g := cfg.GRPO
	opts := worker.ModelOptions{
		Dir: modelDir, ChatTemplatePath: cfg.Chat.TemplatePath, Device: cfg.Worker.Device, DType: cfg.Worker.DType, Threads: cfg.Worker.Threads, Seed: cfg.Seed,
		PackTokens: cfg.Worker.PackTokens, DecodeKernels: cfg.Worker.DecodeKernels,
		Reference: reference, GradientCheckpointing: g.GradientCheckpointing,
		Optim: worker.AdamWOptions{Beta1: g.AdamBeta1, Beta2: g.AdamBeta2, Eps: g.AdamEpsilon, WeightDecay: g.WeightDecay, MaxGradNorm: g.MaxGradNorm},
	}
	if opts.Threads == 0 {
		opts.Threads = runtime.NumCPU()
	}
	if g.LoRA.Enabled {
		opts.LoRA = &worker.LoRAOptions{Rank: g.LoRA.Rank, Alpha: g.LoRA.Alpha, Dropout: g.LoRA.Dropout, TargetModules: g.LoRA.TargetModules, ModulesToSave: g.LoRA.ModulesToSave}
	}
	return opts
}

// loadPolicy opens the worker library and loads the model (from the
// checkpoint when resuming) with the optimizer settings of cfg.
func loadPolicy(ctx context.Context, cfg *config.Config, modelDir, resumeDir string, reference bool, world launch.World, getenv func(string) string, log zerolog.Logger) (*worker.Library, *workerPolicy, error) {
	path, _, err := worker.FindLibrary(cfg.Worker.Library, getenv)
	if err != nil {
		return nil, nil, err
	}
	lib, err := worker.Open(path)
	if err != nil {
		return nil, nil, err
	}
	g := cfg.GRPO
	opts := modelOptions(cfg, modelDir, reference)
	if opts.Device, err = policyDevice(cfg.Worker, lib.Info(), world, getenv, log); err != nil {
		lib.Close()
		return nil, nil, err
	}
	if resumeDir != "" {
		opts.Dir = checkpointModelDir(resumeDir, modelDir, g.LoRA.Enabled)
	}
	log.Info().Str("library", path).Str("model", opts.Dir).Str("device", opts.Device).Str("dtype", opts.DType).Int("threads", opts.Threads).Msg("loading policy")
	m, err := lib.LoadModel(ctx, opts)
	if err != nil {
		lib.Close()
		if strings.HasPrefix(opts.Device, "cuda") && strings.Contains(strings.ToLower(err.Error()), "cuda") {
			// libtorch's own words ("not linked with support for cuda
			// devices", "no CUDA GPUs are available") name no fix.
			return nil, nil, &config.FieldError{Field: "worker.device", Value: opts.Device,
				Allowed: fmt.Sprintf("cpu, or a CUDA device this worker can use: the worker (%s) could not load the model on %s (%v); "+
					"build it against a CUDA libtorch (scripts/install-libtorch.sh uses a pip torch's, then scripts/build-worker.sh) on a machine with a GPU, or pass --device cpu",
					path, opts.Device, err)}
		}
		if errors.Is(err, worker.ErrOneDNNUnavailable) {
			return nil, nil, &config.FieldError{Field: "worker.decode_kernels", Value: opts.DecodeKernels,
				Allowed: fmt.Sprintf("auto or torch: %v", err)}
		}
		return nil, nil, err
	}
	logDecodeKernels(log, "policy", m.DecodeKernels())
	warnLargeOnCPU(opts.Device, opts.DType, m.Config().NumParams(), g.LoRA.Enabled, log)
	p := &workerPolicy{m: m, lora: g.LoRA.Enabled, libPath: path, device: opts.Device}
	if resumeDir != "" {
		if err := p.restore(ctx, resumeDir); err != nil {
			m.Close()
			lib.Close()
			return nil, nil, fmt.Errorf("--resume from %s: %w", resumeDir, err)
		}
	}
	return lib, p, nil
}

// logDecodeKernels says which CPU decode kernels a loaded model samples
// with and why (measured here, cached, or set by worker.decode_kernels).
func logDecodeKernels(log zerolog.Logger, which string, k worker.DecodeKernels) {
	if !k.Applies {
		return
	}
	ev := log.Info().Str("model", which).Str("mode", k.Mode)
	if k.CachePath != "" {
		ev = ev.Str("cache", k.CachePath)
	}
	ev.Msg("decode kernels: " + k.Summary())
}
