package config

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/grpo"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "cfg.yaml")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	return p
}

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestDefaultsValidate(t *testing.T) {
	cfg, err := Load(Source{})
	require.NoError(t, err)
	assert.Equal(t, Default().GRPO, cfg.GRPO)
	assert.Equal(t, "dapo", cfg.GRPO.LossType)
	assert.Equal(t, 8, cfg.GRPO.NumGenerations)
	assert.Equal(t, 10*time.Minute, cfg.Rollout.EpisodeTimeout)
}

func TestPrecedence(t *testing.T) {
	file := writeFile(t, `
model: /models/a
grpo:
  learning_rate: 2.0e-5
  num_generations: 4
  per_device_train_batch_size: 8
  temperature: 0.7
rollout:
  call_timeout: 45s
envs:
  - target: builtin:letters
  - target: http://127.0.0.1:8080
    split: test
    indices: [1, 2]
    weight: 3
`)
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.Float64("temperature", 1.0, "")
	fs.Int("num-generations", 8, "")
	require.NoError(t, fs.Parse([]string{"--temperature", "0.9"}))

	cfg, err := Load(Source{
		File:   file,
		Getenv: envOf(map[string]string{"ORTRAIN_GRPO_LEARNING_RATE": "3e-5", "ORTRAIN_GRPO_TEMPERATURE": "0.8", "ORTRAIN_SEED": "7"}),
		Flags:  map[string]*pflag.Flag{"grpo.temperature": fs.Lookup("temperature"), "grpo.num_generations": fs.Lookup("num-generations")},
	})
	require.NoError(t, err)
	assert.Equal(t, "/models/a", cfg.Model)                  // file
	assert.InDelta(t, 3e-5, cfg.GRPO.LearningRate, 1e-12)    // env beats file
	assert.InDelta(t, 0.9, cfg.GRPO.Temperature, 1e-12)      // changed flag beats env
	assert.Equal(t, 4, cfg.GRPO.NumGenerations)              // unchanged flag does not beat file
	assert.Equal(t, int64(7), cfg.Seed)                      // env over default
	assert.Equal(t, 45*time.Second, cfg.Rollout.CallTimeout) // duration from YAML string
	assert.Equal(t, 0.2, cfg.GRPO.Epsilon)                   // default kept
	require.Len(t, cfg.Envs, 2)
	assert.Equal(t, EnvConfig{Target: "builtin:letters", Split: "train", Weight: 1}, cfg.Envs[0])
	assert.Equal(t, EnvConfig{Target: "http://127.0.0.1:8080", Split: "test", Indices: []int{1, 2}, Weight: 3}, cfg.Envs[1])
}

func TestUnknownKeys(t *testing.T) {
	tests := []struct {
		name, body, key, suggestion string
	}{
		{"typo nested", "grpo:\n  learnig_rate: 1\n", "grpo.learnig_rate", "grpo.learning_rate"},
		{"misplaced top level", "learning_rate: 1\n", "learning_rate", "grpo.learning_rate"},
		{"typo top", "modle: x\n", "modle", "model"},
		{"list item", "envs:\n  - target: a\n    splt: train\n", "envs[0].splt", "envs[0].split"},
		{"nothing close", "zzzzzzzzzzzz: 1\n", "zzzzzzzzzzzz", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(Source{File: writeFile(t, tc.body)})
			var uk *UnknownKeyError
			require.ErrorAs(t, err, &uk)
			assert.Equal(t, tc.key, uk.Key)
			assert.Equal(t, tc.suggestion, uk.Suggestion)
			assert.Contains(t, err.Error(), tc.key)
		})
	}
}

func TestMapsAcceptAnyKey(t *testing.T) {
	cfg, err := Load(Source{File: writeFile(t, "chat:\n  template_kwargs:\n    enable_thinking: false\nenvs:\n  - target: Eigent/SETA\n    secrets: {OPENAI_API_KEY: x}\n")})
	require.NoError(t, err)
	assert.Equal(t, false, cfg.Chat.TemplateKwargs["enable_thinking"])
	assert.Equal(t, "x", cfg.Envs[0].Secrets["OPENAI_API_KEY"])
}

func TestBadEnvValueNamesVariable(t *testing.T) {
	_, err := Load(Source{Getenv: envOf(map[string]string{"ORTRAIN_GRPO_NUM_GENERATIONS": "eight"})})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ORTRAIN_GRPO_NUM_GENERATIONS")
	assert.Contains(t, err.Error(), "integer")
}

func TestValidationErrors(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		field  string
	}{
		{"loss type", func(c *Config) { c.GRPO.LossType = "ppo" }, "grpo.loss_type"},
		{"group of one", func(c *Config) { c.GRPO.NumGenerations = 1 }, "grpo.num_generations"},
		{"groups split rounds", func(c *Config) { c.GRPO.NumGenerations = 3 }, "grpo.num_generations"},
		{"both batch knobs", func(c *Config) { c.GRPO.GenerationBatchSize = 16; c.GRPO.StepsPerGeneration = 2 }, "grpo.generation_batch_size"},
		{"gen batch not multiple", func(c *Config) { c.GRPO.GenerationBatchSize = 12 }, "grpo.generation_batch_size"},
		{"scale rewards", func(c *Config) { c.GRPO.ScaleRewards = "yes" }, "grpo.scale_rewards"},
		{"top p", func(c *Config) { c.GRPO.TopP = 0 }, "grpo.top_p"},
		{"device", func(c *Config) { c.Worker.Device = "gpu0" }, "worker.device"},
		{"dtype", func(c *Config) { c.Worker.DType = "fp8" }, "worker.dtype"},
		{"engine", func(c *Config) { c.Engine.Kind = "sglang" }, "engine.kind"},
		{"vllm host url", func(c *Config) { c.Engine.VLLMHost = "http://0.0.0.0" }, "engine.vllm_host"},
		{"vllm host port", func(c *Config) { c.Engine.VLLMHost = "10.0.0.1:8000" }, "engine.vllm_host"},
		{"vllm key redacted", func(c *Config) { c.Engine.VLLMAPIKey = Redacted }, "engine.vllm_api_key"},
		{"batching", func(c *Config) { c.Engine.Batching = "dynamic" }, "engine.batching"},
		{"kv budget", func(c *Config) { c.Engine.KVCacheBudget = "2 gigs" }, "engine.kv_cache_budget"},
		{"kv budget negative", func(c *Config) { c.Engine.KVCacheBudget = "-1GiB" }, "engine.kv_cache_budget"},
		{"env target", func(c *Config) { c.Envs = []EnvConfig{{Split: "train", Weight: 1}} }, "envs[0].target"},
		{"env exclusive", func(c *Config) {
			c.Envs = []EnvConfig{{Target: "x", Split: "train", Weight: 1, NumTasks: 3, Indices: []int{1}}}
		}, "envs[0].num_tasks"},
		{"warmup both", func(c *Config) { c.GRPO.WarmupSteps = 3; c.GRPO.WarmupRatio = 0.1 }, "grpo.warmup_steps"},
		{"lora rank", func(c *Config) { c.GRPO.LoRA.Enabled = true; c.GRPO.LoRA.Rank = 0 }, "grpo.lora.r"},
		{"concurrency", func(c *Config) { c.Rollout.MaxConcurrency = 0 }, "rollout.max_concurrency"},
		{"env name chars", func(c *Config) { c.Envs = []EnvConfig{{Target: "x", Split: "train", Weight: 1, Name: "a b"}} }, "envs[0].name"},
		{"env name unique", func(c *Config) {
			c.Envs = []EnvConfig{{Target: "x", Split: "train", Weight: 1, Name: "x/train"}, {Target: "y", Split: "test", Weight: 1, Name: "x/train"}}
		}, "envs[1].name"},
		{"retries", func(c *Config) { c.Rollout.MaxRetries = -1 }, "rollout.max_retries"},
		{"backoff", func(c *Config) { c.Rollout.RetryBackoff = 0 }, "rollout.retry_backoff"},
		{"backoff past down timeout", func(c *Config) { c.Rollout.RetryBackoff = 10 * time.Minute }, "rollout.retry_backoff"},
		{"env down", func(c *Config) { c.Rollout.EnvDownTimeout = -time.Second }, "rollout.env_down_timeout"},
		{"failed tool steps", func(c *Config) { c.Rollout.MaxFailedToolSteps = -1 }, "rollout.max_failed_tool_steps"},
		{"step timeout", func(c *Config) { c.Worker.StepTimeout = 0 }, "worker.step_timeout"},
		{"logprob timeout", func(c *Config) { c.Worker.LogprobTimeout = 0 }, "worker.logprob_timeout"},
		{"optimizer timeout", func(c *Config) { c.Worker.OptimizerTimeout = 0 }, "worker.optimizer_timeout"},
		{"save timeout", func(c *Config) { c.Worker.SaveTimeout = 0 }, "worker.save_timeout"},
		{"modules to save without lora", func(c *Config) { c.GRPO.LoRA.ModulesToSave = []string{"lm_head"} }, "grpo.lora.modules_to_save"},
		{"modules to save unknown", func(c *Config) {
			c.GRPO.LoRA.Enabled, c.GRPO.LoRA.ModulesToSave = true, []string{"lm_head", "q_proj"}
		}, "grpo.lora.modules_to_save[1]"},
		{"async negative", func(c *Config) { c.Async.MaxOffPolicySteps = -1 }, "async.max_off_policy_steps"},
		{"sampler threads negative", func(c *Config) { c.Async.SamplerThreads = -1 }, "async.sampler_threads"},
		{"sampler copies 3", func(c *Config) { c.Async.SamplerCopies = 3 }, "async.sampler_copies"},
		{"tool latency negative", func(c *Config) {
			c.Envs = []EnvConfig{{Target: "builtin:letters", Split: "train", Weight: 1, ToolLatency: -time.Second}}
		}, "envs[0].tool_latency"},
		{"token_env not a variable name", func(c *Config) {
			c.Envs = []EnvConfig{{Target: "https://o-e.hf.space", Split: "train", Weight: 1, TokenEnv: "hf_abc-123"}}
		}, "envs[0].token_env"},
		{"modules to save twice", func(c *Config) {
			c.GRPO.LoRA.Enabled, c.GRPO.LoRA.ModulesToSave = true, []string{"norm", "norm"}
		}, "grpo.lora.modules_to_save[1]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Default()
			tc.mutate(&cfg)
			err := cfg.Validate()
			var fe *FieldError
			require.ErrorAs(t, err, &fe)
			assert.Equal(t, tc.field, fe.Field)
			assert.Contains(t, err.Error(), tc.field)
		})
	}
}

func TestBatchShape(t *testing.T) {
	tests := []struct {
		name                 string
		b, ga, spg, gbs, g   int
		wantS, wantN, prompt int
	}{
		{"defaults", 8, 1, 0, 0, 8, 1, 8, 1},
		{"worked example P=1", 4, 2, 0, 0, 4, 2, 8, 2},
		{"steps per generation", 4, 1, 4, 0, 4, 4, 16, 4},
		{"generation batch size", 4, 1, 0, 32, 8, 8, 32, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := Default().GRPO
			g.PerDeviceTrainBatchSize, g.GradientAccumulationSteps = tc.b, tc.ga
			g.StepsPerGeneration, g.GenerationBatchSize, g.NumGenerations = tc.spg, tc.gbs, tc.g
			s, err := g.BatchShape()
			require.NoError(t, err)
			assert.Equal(t, tc.wantS, s.S)
			assert.Equal(t, tc.wantN, s.NGen)
			assert.Equal(t, tc.prompt, s.PromptsPerRound())
		})
	}
}

func TestLossConfigMapping(t *testing.T) {
	g := Default().GRPO
	g.LossType, g.Epsilon, g.EpsilonHigh, g.Beta = "cispo", 0.2, 5.0, 0.04
	lc, err := g.LossConfig()
	require.NoError(t, err)
	assert.Equal(t, grpo.LossCISPO, lc.Type)
	assert.Equal(t, 5.0, lc.EpsilonHigh)
	assert.Equal(t, grpo.ISCorrectionSequenceMask, lc.ISCorrection)

	g = Default().GRPO
	lc, err = g.LossConfig()
	require.NoError(t, err)
	assert.Equal(t, lc.Epsilon, lc.EpsilonHigh, "epsilon_high 0 means same as epsilon")
}

func TestKeysCoverTags(t *testing.T) {
	keys := Keys()
	assert.Contains(t, keys, "grpo.learning_rate")
	assert.Contains(t, keys, "envs[].target")
	assert.Contains(t, keys, "grpo.lora.r")
	assert.Equal(t, "ORTRAIN_GRPO_LEARNING_RATE", EnvVarFor("grpo.learning_rate"))
}

func TestYAMLRoundTrip(t *testing.T) {
	cfg := Default()
	cfg.Model = "/m"
	cfg.Envs = []EnvConfig{{Target: "builtin:letters", Split: "train", Weight: 1, Secrets: map[string]string{"K": "v"}}}
	b, err := cfg.YAML()
	require.NoError(t, err)
	assert.Contains(t, string(b), "episode_timeout: 10m0s")
	back, err := Load(Source{Data: b})
	require.NoError(t, err)
	assert.Equal(t, cfg.GRPO, back.GRPO)
	assert.Equal(t, cfg.Rollout, back.Rollout)
	// Secrets are rendered as <redacted> (issue 14), so the saved file
	// holds their names only; everything else round-trips.
	want := slices.Clone(cfg.Envs)
	want[0].Secrets = map[string]string{"K": Redacted}
	assert.Equal(t, want, back.Envs)
	assert.Equal(t, "v", cfg.Envs[0].Secrets["K"], "rendering does not touch the config")
}

func TestNewFieldDefaults(t *testing.T) {
	cfg, err := Load(Source{})
	require.NoError(t, err)
	assert.Equal(t, 2, cfg.Rollout.MaxRetries)
	assert.Equal(t, time.Second, cfg.Rollout.RetryBackoff)
	assert.Equal(t, 5*time.Minute, cfg.Rollout.EnvDownTimeout)
	assert.Equal(t, 3, cfg.Rollout.MaxFailedToolSteps)
	assert.Equal(t, 10*time.Minute, cfg.Worker.StepTimeout)
	assert.Equal(t, 10*time.Minute, cfg.Worker.LogprobTimeout)
	assert.Equal(t, 5*time.Minute, cfg.Worker.OptimizerTimeout)
	assert.Equal(t, 10*time.Minute, cfg.Worker.SaveTimeout)
	assert.Empty(t, cfg.GRPO.LoRA.ModulesToSave)
	assert.False(t, cfg.Logging.TensorBoard)
	assert.False(t, cfg.Logging.LogPrompts)
}

func TestNewFieldsFromFile(t *testing.T) {
	cfg, err := Load(Source{File: writeFile(t, `
envs:
  - target: builtin:letters
    name: letters-train
    chat: {final_answer_tool: submit, render_tools: false}
  - target: builtin:letters
    split: validation
    name: letters/validation
    tool_latency: 300ms
async: {max_off_policy_steps: 2, sampler_threads: 1}
rollout: {max_retries: 5, retry_backoff: 2s, env_down_timeout: 1m, max_failed_tool_steps: 0}
worker: {step_timeout: 1h, logprob_timeout: 20m, optimizer_timeout: 1m, save_timeout: 30m}
grpo:
  lora: {enabled: true, modules_to_save: [lm_head, norm]}
logging: {tensorboard: true, log_prompts: true}
`)})
	require.NoError(t, err)
	assert.Equal(t, "letters-train", cfg.Envs[0].Name)
	assert.Equal(t, "letters/validation", cfg.Envs[1].Name)
	assert.Equal(t, 300*time.Millisecond, cfg.Envs[1].ToolLatency)
	assert.Zero(t, cfg.Envs[0].ToolLatency)
	assert.Equal(t, AsyncConfig{MaxOffPolicySteps: 2, SamplerThreads: 1, SamplerCopies: 2}, cfg.Async)
	assert.Equal(t, RolloutConfig{MaxConcurrency: 64, EpisodeTimeout: 10 * time.Minute, CallTimeout: 2 * time.Minute,
		MaxFailureFraction: 0.5, MaxRetries: 5, RetryBackoff: 2 * time.Second, EnvDownTimeout: time.Minute}, cfg.Rollout)
	assert.Equal(t, time.Hour, cfg.Worker.StepTimeout)
	assert.Equal(t, 20*time.Minute, cfg.Worker.LogprobTimeout)
	assert.Equal(t, time.Minute, cfg.Worker.OptimizerTimeout)
	assert.Equal(t, 30*time.Minute, cfg.Worker.SaveTimeout)
	assert.Equal(t, []string{"lm_head", "norm"}, cfg.GRPO.LoRA.ModulesToSave)
	assert.True(t, cfg.Logging.TensorBoard)
	assert.True(t, cfg.Logging.LogPrompts)
}

func ptr[T any](v T) *T { return &v }

func TestEnvChat(t *testing.T) {
	top := ChatConfig{SystemPrompt: "Answer.", ToolCallFormat: "hermes", FinalAnswerTool: "submit", RenderTools: false,
		TemplateKwargs: map[string]any{"enable_thinking": false, "style": "short"}}
	tests := []struct {
		name     string
		override EnvChatConfig
		want     ChatConfig
	}{
		{"nothing set inherits", EnvChatConfig{}, top},
		{"empty tool switches it off", EnvChatConfig{FinalAnswerTool: ptr(""), RenderTools: ptr(true)},
			ChatConfig{SystemPrompt: "Answer.", ToolCallFormat: "hermes", RenderTools: true, TemplateKwargs: top.TemplateKwargs}},
		{"prompt and kwargs merged", EnvChatConfig{SystemPrompt: ptr("Use the tools."), TemplateKwargs: map[string]any{"enable_thinking": true, "style": nil}},
			ChatConfig{SystemPrompt: "Use the tools.", ToolCallFormat: "hermes", FinalAnswerTool: "submit",
				TemplateKwargs: map[string]any{"enable_thinking": true}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Default()
			cfg.Chat = top
			cfg.Chat.TemplateKwargs = map[string]any{"enable_thinking": false, "style": "short"}
			cfg.Envs = []EnvConfig{{Target: "other", Split: "train", Weight: 1}, {Target: "x", Split: "train", Weight: 1, Chat: tc.override}}
			got := cfg.EnvChat(1)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, top, cfg.EnvChat(0), "an entry without overrides gets the top-level chat")
			got.TemplateKwargs["new"] = 1
			assert.NotContains(t, cfg.Chat.TemplateKwargs, "new", "the result shares no map with the config")
		})
	}
}

func TestEnvChatFromFileKeepsCase(t *testing.T) {
	cfg, err := Load(Source{File: writeFile(t, `
chat: {final_answer_tool: submit, render_tools: false}
envs:
  - target: builtin:letters
  - target: builtin:echo
    chat: {final_answer_tool: "", render_tools: true, template_kwargs: {enableThinking: true}}
`)})
	require.NoError(t, err)
	assert.Equal(t, "submit", cfg.EnvChat(0).FinalAnswerTool)
	assert.Equal(t, "", cfg.EnvChat(1).FinalAnswerTool)
	assert.True(t, cfg.EnvChat(1).RenderTools)
	assert.Equal(t, map[string]any{"enableThinking": true}, cfg.EnvChat(1).TemplateKwargs)
}

func TestSecretsNeverRendered(t *testing.T) {
	cfg, err := Resolve(Source{File: writeFile(t, `
envs:
  - target: Eigent/SETA
    secrets: {OPENAI_API_KEY: sk-live-123, ZED_TOKEN: tok-456}
  - target: builtin:letters
`)})
	require.NoError(t, err)
	y, err := cfg.YAML()
	require.NoError(t, err)
	assert.NotContains(t, string(y), "sk-live-123")
	assert.NotContains(t, string(y), "tok-456")
	assert.Contains(t, string(y), "OPENAI_API_KEY: <redacted>")
	assert.Equal(t, []string{"OPENAI_API_KEY", "ZED_TOKEN"}, cfg.Envs[0].SecretNames())
	assert.Empty(t, cfg.Envs[1].SecretNames())
	assert.Equal(t, "sk-live-123", cfg.Envs[0].Secrets["OPENAI_API_KEY"], "the config itself keeps the value")

	cfg, err = Resolve(Source{Getenv: func(k string) string {
		if k == "ORTRAIN_ENGINE_VLLM_API_KEY" {
			return "replica-key-789"
		}
		return ""
	}})
	require.NoError(t, err)
	assert.Equal(t, "replica-key-789", cfg.Engine.VLLMAPIKey)
	y, err = cfg.YAML()
	require.NoError(t, err)
	assert.NotContains(t, string(y), "replica-key-789")
	assert.Contains(t, string(y), "vllm_api_key: <redacted>")
}

func TestParseByteSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
	}{
		{"0", 0},
		{"1073741824", 1 << 30},
		{"2GiB", 2 << 30},
		{"2gib", 2 << 30},
		{"512MiB", 512 << 20},
		{"512 MiB", 512 << 20},
		{"1.5GB", 1_500_000_000},
		{"64K", 64 << 10},
		{"10kb", 10_000},
		{"100B", 100},
	}
	for _, tc := range tests {
		got, err := ParseByteSize(tc.in)
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
	}
	for _, in := range []string{"", "GiB", "-5", "two", "1e400", "NaN"} {
		_, err := ParseByteSize(in)
		assert.Error(t, err, in)
	}
}

// TestTRLNamesPointToOrtrainKeys: TRL's settings that have no key of the
// same name say what does their job, instead of a near-miss suggestion
// (grpo.vllm_mode is not engine.vllm_port).
func TestTRLNamesPointToOrtrainKeys(t *testing.T) {
	tests := []struct {
		body, key, wantIn string
	}{
		{"grpo:\n  vllm_mode: colocate\n", "grpo.vllm_mode", "engine.vllm_colocate"},
		{"grpo:\n  use_vllm: true\n", "grpo.use_vllm", "engine.kind: vllm"},
		{"bf16: true\n", "bf16", "worker.dtype: bfloat16"},
		{"grpo:\n  report_to: tensorboard\n", "grpo.report_to", "logging.tensorboard"},
		{"grpo:\n  reward_weights: [1, 2]\n", "grpo.reward_weights", "rewards[].weight"},
		{"grpo:\n  max_prompt_length: 512\n", "grpo.max_prompt_length", "grpo.max_completion_length"},
	}
	for _, tc := range tests {
		t.Run(tc.key, func(t *testing.T) {
			_, err := Load(Source{File: writeFile(t, tc.body)})
			var uk *UnknownKeyError
			require.ErrorAs(t, err, &uk)
			assert.Equal(t, tc.key, uk.Key)
			assert.Contains(t, uk.TRL, tc.wantIn)
			assert.Empty(t, uk.Suggestion)
		})
	}
	assert.Equal(t, "grpo.beta", KeyForLeaf("--beta"))
	assert.Equal(t, "grpo.gradient_accumulation_steps", KeyForLeaf("gradient-accumulation-steps"))
	assert.Equal(t, "", KeyForLeaf("nope"))
}

// TestSetAnyKey: --set KEY=VALUE sets any config key, parsed by its type,
// above the environment and below named flags; a wrong key or value is
// named with the nearest key.
func TestSetAnyKey(t *testing.T) {
	cfg, err := Load(Source{Sets: []string{"grpo.beta=0.04", "engine.vllm_urls=[\"http://a:8000\"]", "worker.shard=optimizer"},
		Getenv: func(k string) string {
			if k == "ORTRAIN_GRPO_BETA" {
				return "0.5"
			}
			return ""
		}})
	require.NoError(t, err)
	assert.Equal(t, 0.04, cfg.GRPO.Beta, "--set wins over the environment")
	assert.Equal(t, []string{"http://a:8000"}, cfg.Engine.VLLMURLs)
	assert.Equal(t, "optimizer", cfg.Worker.Shard)

	_, err = Load(Source{Sets: []string{"grpo.learnig_rate=1"}})
	var uk *UnknownKeyError
	require.ErrorAs(t, err, &uk)
	assert.Equal(t, SetSource, uk.Source)
	assert.Equal(t, "grpo.learning_rate", uk.Suggestion)
	_, err = Load(Source{Sets: []string{"grpo.use_vllm=true"}})
	require.ErrorAs(t, err, &uk)
	assert.Contains(t, uk.TRL, "engine.kind")
	_, err = Load(Source{Sets: []string{"grpo.beta=lots"}})
	var te *TypeError
	require.ErrorAs(t, err, &te)
	_, err = Load(Source{Sets: []string{"no-equals-sign"}})
	assert.Error(t, err)
}

func TestDefaultText(t *testing.T) {
	for key, want := range map[string]string{
		"worker.device":              "auto",
		"grpo.learning_rate":         "1e-06",
		"grpo.num_generations":       "8",
		"engine.vllm_urls":           "",
		"sft.max_length":             "1024",
		"grpo.loss_type":             "dapo",
		"engine.kind":                "builtin",
		"async.max_off_policy_steps": "0",
	} {
		assert.Equal(t, want, DefaultText(key), key)
	}
}
