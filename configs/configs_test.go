package configs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/config"
)

// Every shipped config loads and validates, so a key renamed in
// internal/config cannot silently break them.
func TestShippedConfigsValidate(t *testing.T) {
	files, err := filepath.Glob("*.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			cfg, err := config.Load(config.Source{File: f})
			require.NoError(t, err)
			assert.NotEmpty(t, cfg.Envs)
		})
	}
	data, err := os.ReadFile("quickstart.yaml")
	require.NoError(t, err)
	assert.Equal(t, data, Quickstart(), "the embedded quickstart is the file")
}

// The quickstart documents optional settings in comments; uncommented, they
// must load as they read, so the documentation cannot drift from the keys.
func TestQuickstartCommentedSettingsLoad(t *testing.T) {
	tests := []struct {
		name, comment, setting string
		check                  func(*testing.T, *config.Config)
	}{
		{"lora with modules_to_save", "  # lora: {", "  lora: {", func(t *testing.T, c *config.Config) {
			assert.True(t, c.GRPO.LoRA.Enabled)
			assert.Equal(t, []string{"lm_head", "norm"}, c.GRPO.LoRA.ModulesToSave)
		}},
		{"env name", "    # name: letters-train", "    name: letters-train", func(t *testing.T, c *config.Config) {
			assert.Equal(t, "letters-train", c.Envs[0].Name)
		}},
		{"tool latency", "    # tool_latency: 300ms", "    tool_latency: 300ms", func(t *testing.T, c *config.Config) {
			assert.Equal(t, 300*time.Millisecond, c.Envs[0].ToolLatency)
		}},
		{"async", "# async: {", "async: {", func(t *testing.T, c *config.Config) {
			assert.Equal(t, 1, c.Async.MaxOffPolicySteps)
		}},
		{"dynamic sampling", "  # dynamic_sampling: true\n  # dynamic_sampling_max_extra_rounds: 4", "  dynamic_sampling: true\n  dynamic_sampling_max_extra_rounds: 4",
			func(t *testing.T, c *config.Config) {
				assert.True(t, c.GRPO.DynamicSampling)
				assert.Equal(t, 4, c.GRPO.DynamicSamplingMaxExtraRounds)
			}},
		{"curriculum", "# curriculum: {", "curriculum: {", func(t *testing.T, c *config.Config) {
			assert.True(t, c.Curriculum.Enabled)
			assert.Equal(t, 0.1, c.Curriculum.RevisitProbability)
			assert.Equal(t, 16, c.Curriculum.Window)
		}},
		{"env chat", "    # chat:                   # per-env overrides of the chat settings below;\n    #   final_answer_tool: submit",
			"    chat:\n      final_answer_tool: echo", func(t *testing.T, c *config.Config) {
				assert.Equal(t, "echo", c.EnvChat(0).FinalAnswerTool)
				assert.Equal(t, "submit", c.Chat.FinalAnswerTool)
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			doc := string(Quickstart())
			require.Contains(t, doc, tc.comment)
			cfg, err := config.Load(config.Source{Data: []byte(strings.Replace(doc, tc.comment, tc.setting, 1))})
			require.NoError(t, err)
			tc.check(t, cfg)
		})
	}
}
