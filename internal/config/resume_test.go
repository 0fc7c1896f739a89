package config

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runConfig is a resolved config as a run would save it, with the parts
// that rendering could lose: secrets, env overrides, indices, LoRA.
func runConfig(t *testing.T) *Config {
	t.Helper()
	cfg, err := Load(Source{File: writeFile(t, `
model: models/tiny
init_model_preset: tiny
seed: 7
envs:
  - target: builtin:letters
    name: letters-train
    indices: [3, 1, 2]
    secrets: {API_KEY: sk-123}
    chat: {final_answer_tool: submit}
  - target: http://127.0.0.1:8080
    split: test
    num_tasks: 10
    weight: 0.5
grpo:
  num_generations: 4
  per_device_train_batch_size: 8
  gradient_accumulation_steps: 2
  lora: {enabled: true, r: 8, modules_to_save: [lm_head]}
`)})
	require.NoError(t, err)
	return cfg
}

// saveAndLoad writes cfg as the run directory's config.yaml and reads it
// back as a resume does.
func saveAndLoad(t *testing.T, cfg *Config) *Config {
	t.Helper()
	y, err := cfg.YAML()
	require.NoError(t, err)
	p := filepath.Join(t.TempDir(), "config.yaml")
	require.NoError(t, os.WriteFile(p, y, 0o644))
	saved, err := LoadFile(p)
	require.NoError(t, err)
	return saved
}

func TestResumeChanges(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   []Change
	}{
		{"nothing changed", func(*Config) {}, nil},
		{"settings that keep the batch", func(c *Config) {
			c.GRPO.LearningRate, c.GRPO.MaxSteps, c.Rollout.CallTimeout = 1, 500, 1
			c.Envs[0].Secrets["API_KEY"] = "sk-rotated"
			c.Logging.TensorBoard = true
			c.Envs[0].ToolLatency = 300 * time.Millisecond
		}, nil},
		{"off-policy steps", func(c *Config) { c.Async.MaxOffPolicySteps = 1 }, []Change{{"async.max_off_policy_steps", "0", "1"}}},
		{"group size", func(c *Config) { c.GRPO.NumGenerations = 8 }, []Change{{"grpo.num_generations", "4", "8"}}},
		{"batch knobs", func(c *Config) {
			c.GRPO.PerDeviceTrainBatchSize, c.GRPO.GradientAccumulationSteps, c.GRPO.StepsPerGeneration = 16, 1, 4
			c.GRPO.NumIterations, c.GRPO.GenerationBatchSize = 2, 64
		}, []Change{
			{"grpo.per_device_train_batch_size", "8", "16"}, {"grpo.gradient_accumulation_steps", "2", "1"},
			{"grpo.steps_per_generation", "0", "4"}, {"grpo.num_iterations", "1", "2"}, {"grpo.generation_batch_size", "0", "64"},
		}},
		{"model and seed", func(c *Config) { c.Model, c.InitModelPreset, c.Seed = "Qwen/Qwen3-4B", "", 8 }, []Change{
			{"model", `"models/tiny"`, `"Qwen/Qwen3-4B"`}, {"init_model_preset", `"tiny"`, `""`}, {"seed", "7", "8"},
		}},
		{"loss", func(c *Config) { c.GRPO.LossType = "grpo" }, []Change{{"grpo.loss_type", `"dapo"`, `"grpo"`}}},
		{"lora", func(c *Config) {
			c.GRPO.LoRA.Rank, c.GRPO.LoRA.Alpha, c.GRPO.LoRA.Dropout = 16, 16, 0
			c.GRPO.LoRA.TargetModules, c.GRPO.LoRA.ModulesToSave = []string{"q_proj"}, nil
		}, []Change{
			{"grpo.lora.r", "8", "16"}, {"grpo.lora.alpha", "32", "16"}, {"grpo.lora.dropout", "0.05", "0"},
			{"grpo.lora.target_modules", `["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]`, `["q_proj"]`},
			{"grpo.lora.modules_to_save", `["lm_head"]`, "[]"},
		}},
		{"lora off", func(c *Config) { c.GRPO.LoRA.Enabled = false }, []Change{{"grpo.lora.enabled", "true", "false"}}},
		{"env entry", func(c *Config) {
			c.Envs[0].Target, c.Envs[0].Split, c.Envs[0].Indices, c.Envs[0].Name = "builtin:echo", "validation", []int{1}, "echo"
			c.Envs[1].NumTasks, c.Envs[1].Weight = 20, 2
		}, []Change{
			{"envs[0].target", `"builtin:letters"`, `"builtin:echo"`}, {"envs[0].split", `"train"`, `"validation"`},
			{"envs[0].indices", "[3, 1, 2]", "[1]"}, {"envs[0].name", `"letters-train"`, `"echo"`},
			{"envs[1].num_tasks", "10", "20"}, {"envs[1].weight", "0.5", "2"},
		}},
		{"env removed", func(c *Config) { c.Envs = c.Envs[:1] }, []Change{
			{"envs[1]", "http://127.0.0.1:8080 split test", "(none)"},
		}},
		{"env added", func(c *Config) {
			c.Envs = append(c.Envs, EnvConfig{Target: "builtin:echo", Split: "train", Weight: 1, Name: "echo", Secrets: map[string]string{"K": "secret-v"}})
		}, []Change{{"envs[2]", "(none)", "echo (builtin:echo split train)"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			saved := saveAndLoad(t, runConfig(t))
			now := runConfig(t)
			tc.mutate(now)
			got := ResumeChanges(saved, now)
			assert.Equal(t, tc.want, got)
			for _, c := range got {
				for _, secret := range []string{"sk-123", "sk-rotated", "secret-v"} {
					assert.NotContains(t, c.String(), secret)
				}
			}
		})
	}
}

func TestResumeChangesIgnoresLoRASettingsWhileOff(t *testing.T) {
	saved, now := Default(), Default()
	now.GRPO.LoRA.Rank = 64
	assert.Empty(t, ResumeChanges(&saved, &now))
	now.GRPO.LoRA.Enabled = true
	assert.Equal(t, []Change{{"grpo.lora.enabled", "false", "true"}, {"grpo.lora.r", "16", "64"}}, ResumeChanges(&saved, &now))
}

func TestResumeKeysAreConfigKeys(t *testing.T) {
	keys := Keys()
	for _, k := range append(resumeKeys(), loraKeys()...) {
		assert.Contains(t, keys, k)
	}
	for _, k := range envResumeKeys() {
		assert.Contains(t, keys, "envs[]."+k)
	}
}

func TestResumeChangedErrorListsChanges(t *testing.T) {
	err := &ResumeChangedError{Changes: []Change{{"grpo.num_generations", "4", "8"}, {"envs[1]", "x split test", "(none)"}}}
	assert.Equal(t, "the run was started with other settings that change the batch or the model:\n"+
		"  grpo.num_generations: 4 -> 8\n"+
		"  envs[1]: x split test -> (none)\n"+
		"resume with the run's own settings, or pass --resume-with-changes to resume anyway (the change is recorded in the run directory)",
		err.Error())
}

func TestLoadFileIgnoresEnvironmentAndRefusesUnknownKeys(t *testing.T) {
	t.Setenv("ORTRAIN_GRPO_NUM_GENERATIONS", "16")
	cfg, err := LoadFile(writeFile(t, "grpo:\n  num_generations: 4\n"))
	require.NoError(t, err)
	assert.Equal(t, 4, cfg.GRPO.NumGenerations)

	_, err = LoadFile(writeFile(t, "grpo:\n  num_generatons: 4\n"))
	var uk *UnknownKeysError
	require.ErrorAs(t, err, &uk)

	_, err = LoadFile(filepath.Join(t.TempDir(), "missing.yaml"))
	require.ErrorIs(t, err, os.ErrNotExist)
}
