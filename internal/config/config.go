// Package config holds ortrain's configuration: the structs, their defaults,
// loading (defaults < YAML file < ORTRAIN_* environment < flags, resolved
// once with viper) and validation with errors that name the field, the value
// and what is allowed. Nothing else reads the environment for settings.
package config

import (
	"github.com/ortrain/ortrain/internal/curriculum"
	"github.com/ortrain/ortrain/internal/reward"
	"maps"
	"slices"
	"time"
)

// Config is the resolved configuration of a training or evaluation run.
// YAML keys are the mapstructure tags; GRPO fields keep TRL's names.
type Config struct {
	// Model is a local Hugging Face model directory or a repo id (Org/Name)
	// resolved from the local Hugging Face cache.
	Model string `mapstructure:"model"`
	// OutputDir receives the run directory: resolved config, manifest,
	// metrics.jsonl, trajectories and checkpoints.
	OutputDir string `mapstructure:"output_dir"`
	// InitModelPreset, when Model does not exist yet, creates it with
	// `ortrain init-model --preset` (the quickstart uses "tiny").
	InitModelPreset string `mapstructure:"init_model_preset"`
	// Seed drives task shuffling, sampling and initialisation.
	Seed int64 `mapstructure:"seed"`

	Envs []EnvConfig `mapstructure:"envs"`
	// Rewards are weighted reward functions (TRL's reward_funcs and
	// reward_weights); empty means the env's own rewards alone.
	Rewards []reward.Spec `mapstructure:"rewards"`
	Chat    ChatConfig    `mapstructure:"chat"`
	GRPO    GRPOConfig    `mapstructure:"grpo"`
	Rollout RolloutConfig `mapstructure:"rollout"`
	Engine  EngineConfig  `mapstructure:"engine"`
	Worker  WorkerConfig  `mapstructure:"worker"`
	Logging LoggingConfig `mapstructure:"logging"`
	Async   AsyncConfig   `mapstructure:"async"`
	// Curriculum samples solved and unsolvable tasks less (curriculum.go).
	Curriculum CurriculumConfig `mapstructure:"curriculum"`
	// SFT is `ortrain sft`'s section (sft.go); `ortrain run` ignores it.
	SFT SFTConfig `mapstructure:"sft"`
	// Agent, when set, plays the rollouts with the user's own agent
	// (agent.go).
	Agent AgentConfig `mapstructure:"agent"`
}

// AsyncConfig lets the rollouts of the next rounds run while the current
// step trains (off-policy by at most MaxOffPolicySteps optimizer steps).
type AsyncConfig struct {
	// MaxOffPolicySteps is N: round r is generated with the weights of
	// step start(r)-N (start(r): the optimizer steps done when round r is
	// first trained on), so generation overlaps N steps of training; a
	// sample more than N steps old when it is trained on is dropped, and
	// the rest are reweighted with the sampler's log-probs
	// (grpo.vllm_importance_sampling_*). 0 is the synchronous loop.
	MaxOffPolicySteps int `mapstructure:"max_off_policy_steps"`
	// SamplerThreads is the intra-op thread count of each of the builtin
	// engine's sampler copies (0: half of worker.threads, at least 1: the
	// copies sample while the policy trains, and on a small CPU they would
	// otherwise compete for the cores).
	SamplerThreads int `mapstructure:"sampler_threads"`
	// SamplerCopies is how many weight versions the builtin engine's
	// sampler holds (1 or 2). With 2, the rounds of version v+1 start as
	// soon as step v+1 is done while those of version v still run (an
	// env-bound round then spans two steps of training), at the memory of
	// one more copy of the trainable weights' model. vLLM replicas hold
	// one version.
	SamplerCopies int `mapstructure:"sampler_copies"`
}

// EnvConfig is one ORS environment to draw tasks from.
type EnvConfig struct {
	// Target is a URL (http://host:port), a catalog name (Owner/Env) or
	// builtin:NAME (a built-in env served in-process on loopback).
	Target string `mapstructure:"target"`
	Split  string `mapstructure:"split"`
	// NumTasks takes the first N tasks; Indices picks tasks by index. At
	// most one of the two; neither means the whole split.
	NumTasks int   `mapstructure:"num_tasks"`
	Indices  []int `mapstructure:"indices"`
	// Secrets are passed to the env constructor through X-Secrets.
	Secrets map[string]string `mapstructure:"secrets"`
	// Weight is the env's share when several envs are mixed.
	Weight float64 `mapstructure:"weight"`
	// Name is the entry's key in metrics, trajectories and the manifest;
	// empty lets the trainer derive one (env name + split, deduplicated).
	// Unique across entries when given.
	Name string `mapstructure:"name"`
	// Chat overrides the top-level chat settings that depend on the env;
	// what it leaves unset is inherited (see Config.EnvChat).
	Chat EnvChatConfig `mapstructure:"chat"`
	// Protocol pins the env's protocol: ors or openenv. Empty (or auto)
	// detects a URL's protocol by probing it; a builtin speaks its own, a
	// catalog name ORS.
	Protocol string `mapstructure:"protocol"`
	// TokenEnv names the environment variable holding a bearer token for
	// an OpenEnv server that wants one (a private HF Space, a secured
	// server); empty means HF_TOKEN for *.hf.space hosts. The token itself
	// never goes in the config.
	TokenEnv string `mapstructure:"token_env"`
	// Tasks is a JSONL file of OpenEnv tasks: one {"prompt", "reset",
	// optional "split"} per line. Without it an OpenEnv env's task i is an
	// episode reset with seed i (num_tasks of them).
	Tasks string `mapstructure:"tasks"`
	// OpenEnv shapes how an OpenEnv env's actions and observations become
	// tools and turns.
	OpenEnv OpenEnvConfig `mapstructure:"openenv"`
	// ToolLatency makes every tool call of a builtin:NAME env sleep this
	// long first (the env-bound case, measurable on a laptop); 0 = none.
	ToolLatency time.Duration `mapstructure:"tool_latency"`
}

// OpenEnvConfig shapes an OpenEnv env's turns.
type OpenEnvConfig struct {
	// ActionTool names the tool a Gym-style env's action is offered as.
	ActionTool string `mapstructure:"action_tool"`
	// TextAction sends the assistant's plain text as the action's only
	// string field (TRL's Wordle pattern) instead of offering a tool.
	TextAction bool `mapstructure:"text_action"`
	// ObservationField renders one field of each observation ("": all of it
	// as JSON); ObservationDiff renders only what is new since the last turn.
	ObservationField string `mapstructure:"observation_field"`
	ObservationDiff  bool   `mapstructure:"observation_diff"`
}

// EnvChatConfig holds one env entry's chat overrides. A nil field inherits
// the top-level chat setting, so `final_answer_tool: ""` can switch the
// top-level tool off for one env.
type EnvChatConfig struct {
	SystemPrompt    *string `mapstructure:"system_prompt"`
	FinalAnswerTool *string `mapstructure:"final_answer_tool"`
	RenderTools     *bool   `mapstructure:"render_tools"`
	// TemplateKwargs are merged over the top-level ones key by key; a key
	// set to null removes the top-level value.
	TemplateKwargs map[string]any `mapstructure:"template_kwargs"`
}

// ChatConfig shapes the conversation the policy sees.
type ChatConfig struct {
	SystemPrompt string `mapstructure:"system_prompt"`
	// ToolCallFormat is auto (detected from the template) or one of
	// chat.ToolCallFormatNames: hermes, qwen_xml, llama3_json, mistral,
	// deepseek_v3, glm45, minimax_m2, kimi_k2, none.
	ToolCallFormat string `mapstructure:"tool_call_format"`
	// TemplateKwargs are extra chat-template variables (e.g. enable_thinking).
	TemplateKwargs map[string]any `mapstructure:"template_kwargs"`
	// TemplatePath, when set, is a Jinja chat template file used instead of
	// the model's own (TRL's chat_template_path, vLLM's --chat-template).
	// Checkpoints carry it as chat_template.jinja, so the trained model
	// renders prompts the way it was trained.
	TemplatePath string `mapstructure:"template_path"`
	// FinalAnswerTool, when set, submits a plain-text final answer to this
	// tool's single string argument (small models rarely format tool calls).
	FinalAnswerTool string `mapstructure:"final_answer_tool"`
	// RenderTools puts the session's tools into the prompt (the chat
	// template's tools section). Turn off only with final_answer_tool.
	RenderTools bool `mapstructure:"render_tools"`
}

// GRPOConfig carries the GRPO fields of grpo-reference.md §0 with TRL's
// names and defaults (where a CPU-first default differs, the comment says).
type GRPOConfig struct {
	NumGenerations            int     `mapstructure:"num_generations"`
	GenerationBatchSize       int     `mapstructure:"generation_batch_size"` // 0: derived (B*S)
	StepsPerGeneration        int     `mapstructure:"steps_per_generation"`  // 0: derived (= gradient_accumulation_steps)
	NumIterations             int     `mapstructure:"num_iterations"`
	PerDeviceTrainBatchSize   int     `mapstructure:"per_device_train_batch_size"`
	GradientAccumulationSteps int     `mapstructure:"gradient_accumulation_steps"`
	LossType                  string  `mapstructure:"loss_type"`
	ImportanceSamplingLevel   string  `mapstructure:"importance_sampling_level"`
	ScaleRewards              string  `mapstructure:"scale_rewards"`      // group, batch, none
	RewardAggregation         string  `mapstructure:"reward_aggregation"` // last, sum, max, mean
	Beta                      float64 `mapstructure:"beta"`
	Epsilon                   float64 `mapstructure:"epsilon"`
	// EpsilonHigh 0 means "same as epsilon" (TRL's None).
	EpsilonHigh float64 `mapstructure:"epsilon_high"`
	// Delta 0 means off (TRL's None).
	Delta                    float64 `mapstructure:"delta"`
	Temperature              float64 `mapstructure:"temperature"`
	TopP                     float64 `mapstructure:"top_p"`
	TopK                     int     `mapstructure:"top_k"`
	MinP                     float64 `mapstructure:"min_p"`
	MaxCompletionLength      int     `mapstructure:"max_completion_length"`
	MaxToolCallingIterations int     `mapstructure:"max_tool_calling_iterations"`
	MaskTruncatedCompletions bool    `mapstructure:"mask_truncated_completions"`
	// DynamicSampling is DAPO's dynamic sampling (verl's filter_groups):
	// groups whose rollouts all earned the same reward are dropped and
	// more tasks rolled out until the round has K groups with a spread, at
	// most DynamicSamplingMaxExtraRounds more rounds of K tasks per round
	// (then uniform groups fill the batch, with a warning).
	DynamicSampling               bool `mapstructure:"dynamic_sampling"`
	DynamicSamplingMaxExtraRounds int  `mapstructure:"dynamic_sampling_max_extra_rounds"`
	// VLLM importance-sampling correction (used when the sampler returns log-probs that differ from the trainer's).
	VLLMISCorrection bool    `mapstructure:"vllm_importance_sampling_correction"`
	VLLMISMode       string  `mapstructure:"vllm_importance_sampling_mode"`
	VLLMISClipMin    float64 `mapstructure:"vllm_importance_sampling_clip_min"`
	VLLMISClipMax    float64 `mapstructure:"vllm_importance_sampling_clip_max"`

	LearningRate    float64 `mapstructure:"learning_rate"`
	LRSchedulerType string  `mapstructure:"lr_scheduler_type"` // constant, linear, cosine
	WarmupSteps     int     `mapstructure:"warmup_steps"`
	WarmupRatio     float64 `mapstructure:"warmup_ratio"`
	WeightDecay     float64 `mapstructure:"weight_decay"`
	AdamBeta1       float64 `mapstructure:"adam_beta1"`
	AdamBeta2       float64 `mapstructure:"adam_beta2"`
	AdamEpsilon     float64 `mapstructure:"adam_epsilon"`
	MaxGradNorm     float64 `mapstructure:"max_grad_norm"`
	// MaxSteps > 0 bounds the run in optimizer steps; otherwise NumTrainEpochs does.
	MaxSteps              int     `mapstructure:"max_steps"`
	NumTrainEpochs        float64 `mapstructure:"num_train_epochs"`
	ShuffleDataset        bool    `mapstructure:"shuffle_dataset"`
	GradientCheckpointing bool    `mapstructure:"gradient_checkpointing"`
	// LoggingSteps and SaveSteps are in optimizer steps; 0 disables periodic saves.
	LoggingSteps int        `mapstructure:"logging_steps"`
	SaveSteps    int        `mapstructure:"save_steps"`
	LoRA         LoRAConfig `mapstructure:"lora"`
}

// LoRAConfig selects LoRA training instead of full fine-tuning.
type LoRAConfig struct {
	Enabled       bool     `mapstructure:"enabled"`
	Rank          int      `mapstructure:"r"`
	Alpha         float64  `mapstructure:"alpha"`
	Dropout       float64  `mapstructure:"dropout"`
	TargetModules []string `mapstructure:"target_modules"`
	// ModulesToSave are non-LoRA modules trained in full and saved with the
	// adapter, as PEFT's modules_to_save (e.g. lm_head, norm: a tiny model's
	// tied embeddings and final norm cap its logits). See SaveableModules.
	ModulesToSave []string `mapstructure:"modules_to_save"`
}

// RolloutConfig bounds the rollout phase: concurrency and deadlines.
type RolloutConfig struct {
	MaxConcurrency int           `mapstructure:"max_concurrency"`
	EpisodeTimeout time.Duration `mapstructure:"episode_timeout"`
	CallTimeout    time.Duration `mapstructure:"call_timeout"`
	// MaxFailureFraction stops the run when more than this fraction of a
	// step's rollouts fail for infrastructure reasons.
	MaxFailureFraction float64 `mapstructure:"max_failure_fraction"`
	// MaxRetries is how often a rollout whose session died with the env
	// server is retried with a new session on the same task before it
	// counts as failed.
	MaxRetries int `mapstructure:"max_retries"`
	// RetryBackoff is the first wait before a retry; later waits grow
	// exponentially up to a cap.
	RetryBackoff time.Duration `mapstructure:"retry_backoff"`
	// EnvDownTimeout is how long an env may stay unreachable before the run
	// stops (with a checkpoint of the last completed step).
	EnvDownTimeout time.Duration `mapstructure:"env_down_timeout"`
	// MaxFailedToolSteps stops the run after that many consecutive steps in
	// which every tool call failed (a misconfigured tool); 0 never stops.
	MaxFailedToolSteps int `mapstructure:"max_failed_tool_steps"`
}

// EngineConfig picks the generation backend.
type EngineConfig struct {
	Kind            string        `mapstructure:"kind"` // builtin or vllm
	GenerateTimeout time.Duration `mapstructure:"generate_timeout"`
	MaxBatchSize    int           `mapstructure:"max_batch_size"`
	// Batching (builtin engine) is continuous, where requests join and leave
	// the running decode batch between token steps, or static, where a batch
	// runs until its slowest request is done (the engine before continuous
	// batching, kept for comparison).
	Batching string `mapstructure:"batching"`
	// KVCacheBudget (builtin continuous engine) bounds the keys/values kept
	// between a rollout's turns, so the next turn prefills only its new
	// tokens: bytes, or a size such as 2GiB or 512MiB; 0 keeps none. Use
	// KVCacheBudgetBytes.
	KVCacheBudget string `mapstructure:"kv_cache_budget"`
	// VLLMURLs are servers someone else runs; when set nothing is launched.
	VLLMURLs []string `mapstructure:"vllm_urls"`
	// VLLMGPUs are the GPUs replicas are launched on (replicas x tensor
	// parallel size of them), never the trainer's unless VLLMColocate.
	VLLMGPUs []int `mapstructure:"vllm_gpus"`
	// VLLMReplicas is the number of servers; 0 means len(vllm_gpus) /
	// vllm_tensor_parallel_size (at least 1).
	VLLMReplicas      int      `mapstructure:"vllm_replicas"`
	VLLMTensorParSize int      `mapstructure:"vllm_tensor_parallel_size"`
	VLLMExtraArgs     []string `mapstructure:"vllm_extra_args"`
	// VLLMCommand replaces `vllm serve` (e.g. [ortrain, serve-engine] where
	// vLLM is not installed).
	VLLMCommand              []string      `mapstructure:"vllm_command"`
	VLLMColocate             bool          `mapstructure:"vllm_colocate"`
	VLLMPort                 int           `mapstructure:"vllm_port"` // 0: free ports
	VLLMGPUMemoryUtilization float64       `mapstructure:"vllm_gpu_memory_utilization"`
	VLLMMaxModelLen          int           `mapstructure:"vllm_max_model_len"`
	VLLMSyncDir              string        `mapstructure:"vllm_sync_dir"` // default: output_dir/weight-sync
	VLLMSyncTimeout          time.Duration `mapstructure:"vllm_sync_timeout"`
	VLLMStartupTimeout       time.Duration `mapstructure:"vllm_startup_timeout"`
	VLLMMaxRestarts          int           `mapstructure:"vllm_max_restarts"`
	// VLLMHost is the address launched replicas bind (default 127.0.0.1).
	// Beyond loopback they get an API key: VLLMAPIKey, or a random one.
	VLLMHost string `mapstructure:"vllm_host"`
	// VLLMAPIKey is sent as a Bearer token to every server (vllm_urls
	// started with --api-key, or launched replicas). A secret: config.yaml
	// shows it as <redacted>; prefer ORTRAIN_ENGINE_VLLM_API_KEY.
	VLLMAPIKey string `mapstructure:"vllm_api_key"`
}

// WorkerConfig locates and configures the libtorch worker.
type WorkerConfig struct {
	// Library is the worker shared library; empty searches ORTRAIN_WORKER_LIB,
	// next to the binary, and build/.
	Library string `mapstructure:"library"`
	// Device is auto (CUDA when the worker's libtorch has it and a GPU is
	// visible, else CPU), cpu, cuda or cuda:N.
	Device  string `mapstructure:"device"`
	DType   string `mapstructure:"dtype"` // float32, bfloat16, float16
	Threads int    `mapstructure:"threads"`
	// DecodeKernels chooses the kernels of CPU float32 sampling: auto
	// measures oneDNN's sgemm against libtorch's at::mm (and the fused
	// decode attention against ATen's) on the model's shapes at load, once
	// per machine (cached), and takes the faster; torch and onednn fix the
	// choice (reproducible across machines, or to compare).
	DecodeKernels string `mapstructure:"decode_kernels"`
	// PackTokens > 0 packs each micro-batch's rows into sequences of at
	// most this many tokens (TRL's padding_free with a token budget: each
	// row attends only to itself, log-probs unchanged) instead of padding
	// every row to the longest; 0 pads.
	PackTokens int   `mapstructure:"pack_tokens"`
	GPUs       []int `mapstructure:"gpus"`
	// StepTimeout bounds the forward/backward pass of one micro-batch.
	StepTimeout time.Duration `mapstructure:"step_timeout"`
	// LogprobTimeout bounds one log-prob pass (old or reference policy).
	LogprobTimeout time.Duration `mapstructure:"logprob_timeout"`
	// OptimizerTimeout bounds one optimizer step (clip, update, zero grads).
	OptimizerTimeout time.Duration `mapstructure:"optimizer_timeout"`
	// SaveTimeout bounds writing one checkpoint (weights and optimizer).
	SaveTimeout time.Duration `mapstructure:"save_timeout"`
	// CollectiveTimeout bounds the rendezvous and each collective of a
	// data-parallel run (more than one rank): a rank waits at the step's
	// first collective while the slowest rank still rolls out, so it must
	// exceed the spread of rollout times. A peer that dies is noticed
	// sooner (its connection closes).
	CollectiveTimeout time.Duration `mapstructure:"collective_timeout"`
	// BucketMB caps one gradient all-reduce (PyTorch DDP's bucket_cap_mb).
	BucketMB int `mapstructure:"bucket_mb"`
	// Shard spreads the optimizer over the ranks of a data-parallel run
	// (DeepSpeed's ZeRO stages): "none" (every rank holds all gradients
	// and AdamW state), "optimizer" (stage 1: each rank keeps the AdamW
	// state of its 1/P slice of every bucket), "gradients" (stage 2: and
	// only its slice of the gradients between micro-batches), "parameters"
	// (stage 3: and only its slice of every layer's weights, gathered while
	// the layer runs; the builtin engine then samples from a whole copy per
	// rank). Checkpoints stay in the unsharded format, so any world size and
	// stage resumes them.
	Shard string `mapstructure:"shard"`
}

// CurriculumConfig tracks every task's pass rate (a rollout passes when
// its reward is at least pass_threshold) over its last `window` scored
// rollouts; with enabled, a drawn task whose rate is at or below
// min_pass_rate (too hard) or at or above max_pass_rate (too easy) is
// skipped unless a draw below revisit_probability keeps it. The rates are
// saved with each checkpoint and in RUN_DIR/task_pass_rates.json.
type CurriculumConfig struct {
	Enabled            bool    `mapstructure:"enabled"`
	PassThreshold      float64 `mapstructure:"pass_threshold"`
	MinPassRate        float64 `mapstructure:"min_pass_rate"`
	MaxPassRate        float64 `mapstructure:"max_pass_rate"`
	RevisitProbability float64 `mapstructure:"revisit_probability"`
	Window             int     `mapstructure:"window"`
}

// LoggingConfig controls run output.
type LoggingConfig struct {
	// LogCompletions writes every trajectory to trajectories.jsonl.
	LogCompletions bool `mapstructure:"log_completions"`
	// TensorBoard also writes every metric as TensorBoard scalars to
	// RUN_DIR/tb/.
	TensorBoard bool `mapstructure:"tensorboard"`
	// LogPrompts also writes the rendered prompt text of each rollout (long,
	// so off by default).
	LogPrompts bool `mapstructure:"log_prompts"`
}

// Default returns the embedded defaults: TRL's GRPO defaults, CPU worker,
// builtin engine.
func Default() Config {
	return Config{
		OutputDir: "runs/latest",
		Seed:      42,
		Async:     AsyncConfig{SamplerCopies: 2},
		Curriculum: CurriculumConfig{PassThreshold: curriculum.DefaultPassThreshold, MinPassRate: curriculum.DefaultMinPassRate,
			MaxPassRate: curriculum.DefaultMaxPassRate, RevisitProbability: curriculum.DefaultRevisitProbability, Window: curriculum.DefaultWindow},
		Chat: ChatConfig{ToolCallFormat: "auto", RenderTools: true},
		GRPO: GRPOConfig{
			NumGenerations:                8,
			NumIterations:                 1,
			PerDeviceTrainBatchSize:       8,
			GradientAccumulationSteps:     1,
			LossType:                      "dapo",
			ImportanceSamplingLevel:       "token",
			ScaleRewards:                  "group",
			RewardAggregation:             "last",
			Epsilon:                       0.2,
			Temperature:                   1.0,
			TopP:                          1.0,
			MaxCompletionLength:           512,
			MaxToolCallingIterations:      10,
			VLLMISCorrection:              true,
			DynamicSamplingMaxExtraRounds: 4,
			VLLMISMode:                    "sequence_mask",
			VLLMISClipMax:                 3.0,
			LearningRate:                  1e-6,
			LRSchedulerType:               "linear",
			AdamBeta1:                     0.9,
			AdamBeta2:                     0.999,
			AdamEpsilon:                   1e-8,
			MaxGradNorm:                   1.0,
			NumTrainEpochs:                1,
			ShuffleDataset:                true,
			LoggingSteps:                  1,
			SaveSteps:                     50,
			LoRA: LoRAConfig{
				Rank: 16, Alpha: 32, Dropout: 0.05,
				TargetModules: []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
			},
		},
		Rollout: RolloutConfig{
			MaxConcurrency:     64,
			EpisodeTimeout:     10 * time.Minute,
			CallTimeout:        2 * time.Minute,
			MaxFailureFraction: 0.5,
			MaxRetries:         2,
			RetryBackoff:       time.Second,
			EnvDownTimeout:     5 * time.Minute,
			MaxFailedToolSteps: 3,
		},
		Engine: EngineConfig{
			Kind:               "builtin",
			GenerateTimeout:    5 * time.Minute,
			MaxBatchSize:       64,
			Batching:           "continuous",
			KVCacheBudget:      "2GiB",
			VLLMReplicas:       0,
			VLLMTensorParSize:  1,
			VLLMSyncTimeout:    10 * time.Minute,
			VLLMStartupTimeout: 5 * time.Minute,
			VLLMMaxRestarts:    5,
			VLLMHost:           "127.0.0.1",
		},
		Worker: WorkerConfig{
			Device: "auto", DType: "float32", DecodeKernels: "auto",
			StepTimeout:       10 * time.Minute,
			LogprobTimeout:    10 * time.Minute,
			OptimizerTimeout:  5 * time.Minute,
			SaveTimeout:       10 * time.Minute,
			CollectiveTimeout: 30 * time.Minute,
			BucketMB:          25,
			Shard:             "none",
		},
		Logging: LoggingConfig{LogCompletions: true},
		SFT:     defaultSFT(),
		Agent:   defaultAgent(),
	}
}

// DefaultEnv returns the defaults an env entry gets for keys it omits.
func DefaultEnv() EnvConfig { return EnvConfig{Split: "train", Weight: 1} }

// EnvChat returns the chat settings of env entry i: the top-level chat with
// the entry's overrides applied (the top-level chat alone when there is no
// entry i, as for an env given by --env). The result shares no maps with c.
func (c *Config) EnvChat(i int) ChatConfig {
	out := c.Chat
	out.TemplateKwargs = maps.Clone(c.Chat.TemplateKwargs)
	if i < 0 || i >= len(c.Envs) {
		return out
	}
	o := c.Envs[i].Chat
	if o.SystemPrompt != nil {
		out.SystemPrompt = *o.SystemPrompt
	}
	if o.FinalAnswerTool != nil {
		out.FinalAnswerTool = *o.FinalAnswerTool
	}
	if o.RenderTools != nil {
		out.RenderTools = *o.RenderTools
	}
	for k, v := range o.TemplateKwargs {
		if out.TemplateKwargs == nil {
			out.TemplateKwargs = map[string]any{}
		}
		if v == nil {
			delete(out.TemplateKwargs, k)
			continue
		}
		out.TemplateKwargs[k] = v
	}
	return out
}

// SecretNames lists the names of the entry's secrets, sorted, for the
// manifest: the values are never written anywhere.
func (e EnvConfig) SecretNames() []string {
	return slices.Sorted(maps.Keys(e.Secrets))
}
