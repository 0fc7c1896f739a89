package config

import (
	"errors"
	"fmt"
	"github.com/ortrain/ortrain/internal/curriculum"
	"github.com/ortrain/ortrain/internal/reward"
	"math"
	"net"
	"regexp"
	"slices"
	"strings"

	"github.com/ortrain/ortrain/internal/grpo"
)

// FieldError is an invalid config value: it names the field, the value and
// what is allowed. Validation refuses; it never rewrites a setting.
type FieldError struct {
	Field   string
	Value   any
	Allowed string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("config %s: %v is not allowed (%s)", e.Field, formatValue(e.Value), e.Allowed)
}

func formatValue(v any) string {
	if s, ok := v.(string); ok {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprint(v)
}

func bad(field string, value any, allowedf string, args ...any) error {
	return &FieldError{Field: field, Value: value, Allowed: fmt.Sprintf(allowedf, args...)}
}

func oneOf(field, value string, allowed ...string) error {
	for _, a := range allowed {
		if value == a {
			return nil
		}
	}
	return bad(field, value, "allowed: %s", strings.Join(allowed, ", "))
}

var (
	deviceRE  = regexp.MustCompile(`^(auto|cpu|cuda|cuda:[0-9]+)$`)
	envNameRE = regexp.MustCompile(`^[A-Za-z0-9._/-]+$`)
	envVarRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// SaveableModules lists the values grpo.lora.modules_to_save accepts: the
// modules of a Qwen/Llama decoder that LoRA does not adapt, by the name
// their weights carry (model.embed_tokens.weight, model.norm.weight,
// lm_head.weight, model.layers.N.input_layernorm.weight, …; see
// internal/model's tensor specs and the worker's csrc/model.cpp). "norm"
// is the final norm. lm_head is embed_tokens in a model with tied
// embeddings.
func SaveableModules() []string {
	return []string{"embed_tokens", "lm_head", "norm", "input_layernorm", "post_attention_layernorm", "q_norm", "k_norm"}
}

// Validate checks every field and the relations between them.
func (c *Config) Validate() error {
	checks := []func() error{c.validateTop, c.validateEnvs, c.GRPO.validate, c.validateRuntime, c.validateAgent,
		func() error { return reward.ValidateSpecs(c.Rewards) }}
	for _, check := range checks {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

func (c *Config) validateTop() error {
	if c.OutputDir == "" {
		return bad("output_dir", c.OutputDir, "a directory path is required")
	}
	if c.InitModelPreset != "" && c.Model == "" {
		return bad("model", c.Model, "a directory to create is required when init_model_preset is set")
	}
	// The format names are the chat package's; it checks them (with the
	// list) when the model's template loads, --dry-run included.
	if c.Chat.ToolCallFormat == "" {
		return bad("chat.tool_call_format", c.Chat.ToolCallFormat, "auto or a format name (hermes, qwen_xml, llama3_json, mistral, deepseek_v3, glm45, minimax_m2, kimi_k2, none)")
	}
	return nil
}

func (c *Config) validateEnvs() error {
	for i, e := range c.Envs {
		f := func(k string) string { return fmt.Sprintf("envs[%d].%s", i, k) }
		switch {
		case strings.TrimSpace(e.Target) == "":
			return bad(f("target"), e.Target, "a URL (http://host:port), a catalog name (Owner/Env) or builtin:NAME")
		case e.Split == "":
			return bad(f("split"), e.Split, "a split name such as train")
		case e.NumTasks < 0:
			return bad(f("num_tasks"), e.NumTasks, "0 (whole split) or a positive count")
		case e.NumTasks > 0 && len(e.Indices) > 0:
			return bad(f("num_tasks"), e.NumTasks, "set num_tasks or indices, not both")
		case !(e.Weight > 0) || math.IsInf(e.Weight, 0):
			return bad(f("weight"), e.Weight, "a positive finite number")
		case e.Protocol != "" && e.Protocol != "ors" && e.Protocol != "openenv" && e.Protocol != "auto":
			return bad(f("protocol"), e.Protocol, "ors, openenv or auto (empty: detect it)")
		case e.TokenEnv != "" && (!envVarRE.MatchString(e.TokenEnv) || looksLikeHFToken(e.TokenEnv)):
			// The value is not shown: it may be the token itself.
			return bad(f("token_env"), Redacted, "the name of an environment variable such as HF_TOKEN (letters, digits and '_', not starting with a digit) that holds the token, never the token itself")
		case e.ToolLatency < 0:
			// Which targets may be slowed down is the resolver's to say.
			return bad(f("tool_latency"), e.ToolLatency, "0 (none) or a positive duration such as 300ms")
		case e.Tasks != "" && e.Protocol == "ors":
			return bad(f("tasks"), e.Tasks, "a tasks file only for OpenEnv envs (ORS envs list their own tasks); set protocol: openenv")
		}
		for j, idx := range e.Indices {
			if idx < 0 {
				return bad(fmt.Sprintf("envs[%d].indices[%d]", i, j), idx, "task indices are >= 0")
			}
		}
		if e.Name == "" {
			continue
		}
		if !envNameRE.MatchString(e.Name) {
			return bad(f("name"), e.Name, "letters, digits, '-', '_', '.' and '/' (it keys metrics and file names)")
		}
		for j := range i {
			if c.Envs[j].Name == e.Name {
				return bad(f("name"), e.Name, "a name unique across envs (envs[%d] has it too)", j)
			}
		}
	}
	return nil
}

func (c *Config) validateRuntime() error {
	switch c.Worker.DecodeKernels {
	case "auto", "torch", "onednn":
	default:
		return bad("worker.decode_kernels", c.Worker.DecodeKernels, "auto (measure at load and take the faster), torch (libtorch's at::mm) or onednn (oneDNN's sgemm)")
	}
	if n := c.Worker.PackTokens; n < 0 {
		return bad("worker.pack_tokens", n, "0 (pad each row) or a token budget per packed sequence, e.g. 4096")
	}
	if n := c.Async.MaxOffPolicySteps; n < 0 {
		return bad("async.max_off_policy_steps", n, "0 (synchronous) or a positive number of optimizer steps")
	}
	if n := c.GRPO.DynamicSamplingMaxExtraRounds; n < 0 || n > 1000 {
		return bad("grpo.dynamic_sampling_max_extra_rounds", n, "0 (drop nothing beyond the round's own groups: uniform ones fill it) to 1000 extra rounds of K tasks")
	}
	if err := c.Curriculum.Curriculum().Validate(); err != nil {
		var fe *curriculum.FieldError
		if errors.As(err, &fe) {
			return bad("curriculum."+fe.Field, fe.Value, "%s", fe.Allowed)
		}
		return err
	}
	if n := c.Async.SamplerThreads; n < 0 {
		return bad("async.sampler_threads", n, "0 (worker.threads) or a positive thread count")
	}
	if n := c.Async.SamplerCopies; n < 1 || n > 2 {
		return bad("async.sampler_copies", n, "1 (one weight version in flight) or 2 (two: rounds overlap two steps, one more model in memory)")
	}
	if c.Engine.Kind == "vllm" && c.GRPO.LoRA.Enabled && len(c.GRPO.LoRA.ModulesToSave) > 0 {
		return bad("grpo.lora.modules_to_save", c.GRPO.LoRA.ModulesToSave,
			"empty with engine.kind vllm: vLLM loads LoRA adapters without full modules (use engine.kind builtin, or turn LoRA off to sync full weights)")
	}
	r := c.Rollout
	switch {
	case r.MaxConcurrency < 1:
		return bad("rollout.max_concurrency", r.MaxConcurrency, "at least 1")
	case r.EpisodeTimeout <= 0:
		return bad("rollout.episode_timeout", r.EpisodeTimeout, "a positive duration such as 10m")
	case r.CallTimeout <= 0:
		return bad("rollout.call_timeout", r.CallTimeout, "a positive duration such as 2m")
	case !(r.MaxFailureFraction >= 0 && r.MaxFailureFraction <= 1):
		return bad("rollout.max_failure_fraction", r.MaxFailureFraction, "a fraction in [0, 1]")
	case r.MaxRetries < 0:
		return bad("rollout.max_retries", r.MaxRetries, "0 (no retries) or a positive count")
	case r.RetryBackoff <= 0:
		return bad("rollout.retry_backoff", r.RetryBackoff, "a positive duration such as 1s")
	case r.EnvDownTimeout <= 0:
		return bad("rollout.env_down_timeout", r.EnvDownTimeout, "a positive duration such as 5m")
	case r.RetryBackoff > r.EnvDownTimeout:
		return bad("rollout.retry_backoff", r.RetryBackoff, "at most rollout.env_down_timeout (%v): the first wait must fit in the time an env may be down", r.EnvDownTimeout)
	case r.MaxFailedToolSteps < 0:
		return bad("rollout.max_failed_tool_steps", r.MaxFailedToolSteps, "0 (never stop) or a positive count of steps")
	}
	if err := oneOf("engine.kind", c.Engine.Kind, "builtin", "vllm"); err != nil {
		return err
	}
	if err := oneOf("engine.batching", c.Engine.Batching, "continuous", "static"); err != nil {
		return err
	}
	if _, err := c.Engine.KVCacheBudgetBytes(); err != nil {
		return bad("engine.kv_cache_budget", c.Engine.KVCacheBudget, "a size in bytes, or with a unit: 2GiB, 512MiB, 1.5GB, 0 (keep none)")
	}
	switch {
	case c.Engine.GenerateTimeout <= 0:
		return bad("engine.generate_timeout", c.Engine.GenerateTimeout, "a positive duration such as 5m")
	case c.Engine.MaxBatchSize < 1:
		return bad("engine.max_batch_size", c.Engine.MaxBatchSize, "at least 1")
	case c.Engine.VLLMReplicas < 0:
		return bad("engine.vllm_replicas", c.Engine.VLLMReplicas, "0 (one per vllm_tensor_parallel_size GPUs) or a positive count")
	case c.Engine.VLLMTensorParSize < 1:
		return bad("engine.vllm_tensor_parallel_size", c.Engine.VLLMTensorParSize, "at least 1")
	case c.Engine.VLLMPort < 0 || c.Engine.VLLMPort > 65535:
		return bad("engine.vllm_port", c.Engine.VLLMPort, "0 (free ports) or a TCP port")
	case c.Engine.VLLMGPUMemoryUtilization < 0 || c.Engine.VLLMGPUMemoryUtilization > 1:
		return bad("engine.vllm_gpu_memory_utilization", c.Engine.VLLMGPUMemoryUtilization, "0 (vLLM's default) or a fraction in (0, 1]")
	case c.Engine.VLLMMaxModelLen < 0:
		return bad("engine.vllm_max_model_len", c.Engine.VLLMMaxModelLen, "0 (the model's) or a positive length")
	case c.Engine.VLLMSyncTimeout <= 0 || c.Engine.VLLMStartupTimeout <= 0:
		return bad("engine.vllm_sync_timeout", c.Engine.VLLMSyncTimeout, "positive durations for vllm_sync_timeout and vllm_startup_timeout")
	case c.Engine.VLLMMaxRestarts < 0:
		return bad("engine.vllm_max_restarts", c.Engine.VLLMMaxRestarts, ">= 0")
	case !bindHost(c.Engine.VLLMHost):
		return bad("engine.vllm_host", c.Engine.VLLMHost, "an address or host name to bind, such as 127.0.0.1 or 0.0.0.0 (no scheme, no port)")
	case c.Engine.VLLMAPIKey == Redacted:
		return bad("engine.vllm_api_key", Redacted, "the key itself (a run's config.yaml hides it), preferably as ORTRAIN_ENGINE_VLLM_API_KEY")
	case c.Engine.Kind == "vllm" && len(c.Engine.VLLMURLs) == 0 && len(c.Engine.VLLMGPUs) == 0 && len(c.Engine.VLLMCommand) == 0:
		return bad("engine.vllm_gpus", c.Engine.VLLMGPUs, "GPUs to launch vLLM on (or engine.vllm_urls of running servers) when engine.kind is vllm")
	case !deviceRE.MatchString(c.Worker.Device):
		return bad("worker.device", c.Worker.Device, "auto, cpu, cuda or cuda:N")
	case c.Worker.Threads < 0:
		return bad("worker.threads", c.Worker.Threads, "0 (all cores) or a positive count")
	case c.Worker.StepTimeout <= 0:
		return bad("worker.step_timeout", c.Worker.StepTimeout, "a positive duration such as 10m")
	case c.Worker.LogprobTimeout <= 0:
		return bad("worker.logprob_timeout", c.Worker.LogprobTimeout, "a positive duration such as 10m")
	case c.Worker.OptimizerTimeout <= 0:
		return bad("worker.optimizer_timeout", c.Worker.OptimizerTimeout, "a positive duration such as 5m")
	case c.Worker.SaveTimeout <= 0:
		return bad("worker.save_timeout", c.Worker.SaveTimeout, "a positive duration such as 10m")
	case c.Worker.CollectiveTimeout <= 0:
		return bad("worker.collective_timeout", c.Worker.CollectiveTimeout, "a positive duration longer than the spread of rollout times across ranks, such as 30m")
	case c.Worker.BucketMB < 1:
		return bad("worker.bucket_mb", c.Worker.BucketMB, "a positive size in MiB such as 25")
	}
	if err := oneOf("worker.shard", c.Worker.Shard, "none", "optimizer", "gradients", "parameters"); err != nil {
		return err
	}
	return oneOf("worker.dtype", c.Worker.DType, "float32", "bfloat16", "float16")
}

func (g *GRPOConfig) validate() error {
	if _, err := g.BatchShape(); err != nil {
		return err
	}
	if _, err := g.LossConfig(); err != nil {
		return err
	}
	if err := oneOf("grpo.scale_rewards", g.ScaleRewards, "group", "batch", "none"); err != nil {
		return err
	}
	if err := oneOf("grpo.reward_aggregation", g.RewardAggregation, "last", "sum", "max", "mean"); err != nil {
		return err
	}
	if err := oneOf("grpo.lr_scheduler_type", g.LRSchedulerType, "constant", "linear", "cosine"); err != nil {
		return err
	}
	switch {
	case !(g.TopP > 0 && g.TopP <= 1):
		return bad("grpo.top_p", g.TopP, "in (0, 1]")
	case g.TopK < 0:
		return bad("grpo.top_k", g.TopK, "0 (off) or a positive count")
	case !(g.MinP >= 0 && g.MinP < 1):
		return bad("grpo.min_p", g.MinP, "in [0, 1)")
	case g.MaxCompletionLength < 1:
		return bad("grpo.max_completion_length", g.MaxCompletionLength, "at least 1 token")
	case g.MaxToolCallingIterations < 0:
		return bad("grpo.max_tool_calling_iterations", g.MaxToolCallingIterations, "0 (no tool turns) or more")
	case !(g.LearningRate >= 0) || math.IsInf(g.LearningRate, 0):
		return bad("grpo.learning_rate", g.LearningRate, "a non-negative number")
	case g.WarmupSteps < 0:
		return bad("grpo.warmup_steps", g.WarmupSteps, ">= 0")
	case !(g.WarmupRatio >= 0 && g.WarmupRatio < 1):
		return bad("grpo.warmup_ratio", g.WarmupRatio, "in [0, 1)")
	case g.WarmupSteps > 0 && g.WarmupRatio > 0:
		return bad("grpo.warmup_steps", g.WarmupSteps, "set warmup_steps or warmup_ratio, not both (warmup_ratio is %v)", g.WarmupRatio)
	case !(g.WeightDecay >= 0):
		return bad("grpo.weight_decay", g.WeightDecay, ">= 0")
	case !(g.AdamBeta1 >= 0 && g.AdamBeta1 < 1):
		return bad("grpo.adam_beta1", g.AdamBeta1, "in [0, 1)")
	case !(g.AdamBeta2 >= 0 && g.AdamBeta2 < 1):
		return bad("grpo.adam_beta2", g.AdamBeta2, "in [0, 1)")
	case !(g.AdamEpsilon > 0):
		return bad("grpo.adam_epsilon", g.AdamEpsilon, "> 0")
	case !(g.MaxGradNorm >= 0):
		return bad("grpo.max_grad_norm", g.MaxGradNorm, ">= 0 (0 disables clipping)")
	case g.MaxSteps < 0:
		return bad("grpo.max_steps", g.MaxSteps, "0 (use num_train_epochs) or a positive count")
	case g.MaxSteps == 0 && !(g.NumTrainEpochs > 0):
		return bad("grpo.num_train_epochs", g.NumTrainEpochs, "> 0 when max_steps is 0")
	case g.LoggingSteps < 1:
		return bad("grpo.logging_steps", g.LoggingSteps, "at least 1")
	case g.SaveSteps < 0:
		return bad("grpo.save_steps", g.SaveSteps, "0 (only at the end) or a positive count")
	}
	return g.LoRA.validate("grpo.lora")
}

// validate checks a lora section; prefix names it in errors (grpo.lora,
// sft.lora).
func (l *LoRAConfig) validate(prefix string) error {
	if err := l.validateModulesToSave(prefix); err != nil {
		return err
	}
	if l.Enabled {
		switch {
		case l.Rank < 1:
			return bad(prefix+".r", l.Rank, "at least 1")
		case !(l.Alpha > 0):
			return bad(prefix+".alpha", l.Alpha, "> 0")
		case !(l.Dropout >= 0 && l.Dropout < 1):
			return bad(prefix+".dropout", l.Dropout, "in [0, 1)")
		case len(l.TargetModules) == 0:
			return bad(prefix+".target_modules", l.TargetModules, "at least one module name such as q_proj")
		}
	}
	return nil
}

func (l *LoRAConfig) validateModulesToSave(prefix string) error {
	if len(l.ModulesToSave) == 0 {
		return nil
	}
	if !l.Enabled {
		return bad(prefix+".modules_to_save", l.ModulesToSave, "only with %s.enabled: true (full fine-tuning trains every module)", prefix)
	}
	for i, m := range l.ModulesToSave {
		field := fmt.Sprintf("%s.modules_to_save[%d]", prefix, i)
		if !slices.Contains(SaveableModules(), m) {
			return bad(field, m, "allowed: %s", strings.Join(SaveableModules(), ", "))
		}
		if slices.Contains(l.ModulesToSave[:i], m) {
			return bad(field, m, "each module once")
		}
	}
	return nil
}

// BatchShape is the batch relations of grpo-reference.md §1.1 for one
// process (P = 1): B completions per micro-batch, S micro-steps per
// generation round, N_gen completions per round.
type BatchShape struct {
	B, GA, S, NGen, G, Iterations int
}

// PromptsPerRound is N_gen / G, the unique prompts generated per round.
func (s BatchShape) PromptsPerRound() int { return s.NGen / s.G }

// BatchShape derives and checks the batch relations.
func (g *GRPOConfig) BatchShape() (BatchShape, error) {
	s := BatchShape{B: g.PerDeviceTrainBatchSize, GA: g.GradientAccumulationSteps, G: g.NumGenerations, Iterations: g.NumIterations}
	switch {
	case s.G < 2:
		return s, bad("grpo.num_generations", s.G, "at least 2: advantages compare completions within a group")
	case s.B < 1:
		return s, bad("grpo.per_device_train_batch_size", s.B, "at least 1 (it counts completions, not prompts)")
	case s.GA < 1:
		return s, bad("grpo.gradient_accumulation_steps", s.GA, "at least 1")
	case s.Iterations < 1:
		return s, bad("grpo.num_iterations", s.Iterations, "at least 1")
	case g.GenerationBatchSize < 0:
		return s, bad("grpo.generation_batch_size", g.GenerationBatchSize, "0 (derived) or a positive count")
	case g.StepsPerGeneration < 0:
		return s, bad("grpo.steps_per_generation", g.StepsPerGeneration, "0 (derived) or a positive count")
	case g.GenerationBatchSize > 0 && g.StepsPerGeneration > 0:
		return s, bad("grpo.generation_batch_size", g.GenerationBatchSize,
			"set generation_batch_size or steps_per_generation (%d), not both", g.StepsPerGeneration)
	}
	switch {
	case g.GenerationBatchSize > 0:
		if g.GenerationBatchSize%s.B != 0 {
			return s, bad("grpo.generation_batch_size", g.GenerationBatchSize,
				"a multiple of per_device_train_batch_size (%d)", s.B)
		}
		s.NGen, s.S = g.GenerationBatchSize, g.GenerationBatchSize/s.B
	case g.StepsPerGeneration > 0:
		s.S, s.NGen = g.StepsPerGeneration, s.B*g.StepsPerGeneration
	default:
		s.S, s.NGen = s.GA, s.B*s.GA
	}
	if s.NGen%s.G != 0 {
		return s, bad("grpo.num_generations", s.G,
			"a divisor of the generation batch size %d (= per_device_train_batch_size %d x steps_per_generation %d), so a round holds whole groups",
			s.NGen, s.B, s.S)
	}
	return s, nil
}

// LossConfig converts the GRPO fields to the worker's loss configuration.
func (g *GRPOConfig) LossConfig() (grpo.LossConfig, error) {
	lc := grpo.DefaultLossConfig()
	lt, err := grpo.ParseLossType(g.LossType)
	rl := slices.DeleteFunc(grpo.LossTypeNames(), func(n string) bool { return n == grpo.LossSFT.String() })
	if err != nil || lt == grpo.LossSFT {
		// sft is `ortrain sft`'s loss: it ignores the advantages.
		return lc, bad("grpo.loss_type", g.LossType, "allowed: %s (sft is the loss of `ortrain sft`, which ignores rewards)", strings.Join(rl, ", "))
	}
	lvl, err := grpo.ParseISLevel(g.ImportanceSamplingLevel)
	if err != nil {
		return lc, bad("grpo.importance_sampling_level", g.ImportanceSamplingLevel, "allowed: token, sequence")
	}
	lc.Type, lc.ISLevel = lt, lvl
	lc.Epsilon, lc.EpsilonHigh = g.Epsilon, g.EpsilonHigh
	if g.EpsilonHigh == 0 {
		lc.EpsilonHigh = g.Epsilon
	}
	lc.Delta, lc.Beta, lc.Temperature = g.Delta, g.Beta, g.Temperature
	lc.MaxCompletionLength = g.MaxCompletionLength
	lc.ISCorrection = grpo.ISCorrectionOff
	if g.VLLMISCorrection {
		mode, err := grpo.ParseISCorrection(g.VLLMISMode)
		if err != nil || mode == grpo.ISCorrectionOff {
			return lc, bad("grpo.vllm_importance_sampling_mode", g.VLLMISMode, "allowed: token_truncate, token_mask, sequence_truncate, sequence_mask")
		}
		lc.ISCorrection = mode
	}
	lc.ISClipMin, lc.ISClipMax = g.VLLMISClipMin, g.VLLMISClipMax
	if g.VLLMISClipMax == 0 {
		lc.ISClipMax = math.Inf(1)
	}
	if err := lc.Validate(); err != nil {
		return lc, fmt.Errorf("config grpo: %w", err)
	}
	return lc, nil
}

// looksLikeHFToken: a Hugging Face token (hf_ and some 34 letters and
// digits), where a variable's name belongs.
func looksLikeHFToken(s string) bool { return strings.HasPrefix(s, "hf_") && len(s) > 20 }

// bindHost: a host name or an IP address, without scheme or port.
func bindHost(h string) bool {
	if h == "" || strings.ContainsAny(h, " \t/@") {
		return false
	}
	if strings.Contains(h, ":") {
		return net.ParseIP(strings.Trim(h, "[]")) != nil
	}
	return true
}

// Curriculum is the curriculum package's view of the section.
func (c CurriculumConfig) Curriculum() curriculum.Config {
	return curriculum.Config{Enabled: c.Enabled, PassThreshold: c.PassThreshold, MinPassRate: c.MinPassRate,
		MaxPassRate: c.MaxPassRate, RevisitProbability: c.RevisitProbability, Window: c.Window}
}
