package train

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/model"
)

// TestQuickstartLoRALearnsWithModulesToSave: LoRA alone cannot learn the
// quickstart, because the tiny model's tied embedding (its lm_head) and
// final norm bound the logits and no adapter reaches them; training those
// two in full beside the adapters (PEFT's modules_to_save) lets it learn.
// The final checkpoint's adapter carries them under PEFT's keys.
func TestQuickstartLoRALearnsWithModulesToSave(t *testing.T) {
	requireWorker(t)
	if testing.Short() {
		t.Skip("learning test: two 100-step runs")
	}
	for _, tc := range []struct {
		name          string
		modulesToSave []string
		learns        bool
	}{
		{"lora_only_stays_flat", nil, false},
		{"modules_to_save_learns", []string{"lm_head", "norm"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// 40 steps show the flat case (the learning one takes 100).
			steps := 100
			if !tc.learns {
				steps = 40
			}
			out := filepath.Join(t.TempDir(), "run")
			cfg := quickstart(t, out, steps)
			cfg.GRPO.SaveSteps = 0
			cfg.Logging.LogCompletions = false
			cfg.GRPO.LoRA.Enabled = true
			cfg.GRPO.LoRA.Rank = 8
			cfg.GRPO.LoRA.Alpha = 16
			cfg.GRPO.LoRA.ModulesToSave = tc.modulesToSave
			require.NoError(t, cfg.Validate())
			res, err := Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: func(string) string { return "" }})
			require.NoError(t, err)
			metrics := readMetrics(t, out)
			require.Len(t, metrics, steps)
			curve := make([]float64, 0, 10)
			for i := 0; i < steps; i += 10 {
				curve = append(curve, meanOf(metrics[i:i+10], "reward"))
			}
			first, last := meanOf(metrics[:5], "reward"), meanOf(metrics[steps-10:], "reward")
			t.Logf("mean reward: first 5 steps %.3f, last 10 steps %.3f; per 10 steps %.3f", first, last, curve)
			assert.LessOrEqual(t, first, 0.1)
			if tc.learns {
				assert.GreaterOrEqual(t, last, 0.5)
			} else {
				assert.Less(t, last, 0.2, "without modules_to_save the adapters cannot move the capped logits")
			}

			adapter := filepath.Join(res.Checkpoint, ckptAdapterDir)
			raw, err := os.ReadFile(filepath.Join(adapter, "adapter_config.json"))
			require.NoError(t, err)
			var ac struct {
				ModulesToSave []string `json:"modules_to_save"`
			}
			require.NoError(t, json.Unmarshal(raw, &ac))
			_, tensors, err := model.ReadSafetensors(filepath.Join(adapter, "adapter_model.safetensors"))
			require.NoError(t, err)
			keys := map[string]bool{}
			for _, tt := range tensors {
				keys[tt.Name] = true
			}
			if tc.modulesToSave == nil {
				assert.Nil(t, ac.ModulesToSave)
				assert.False(t, keys["base_model.model.model.norm.weight"])
				return
			}
			assert.Equal(t, []string{"lm_head", "norm", "embed_tokens"}, ac.ModulesToSave, "tied: embed_tokens is the same matrix")
			for _, k := range []string{"base_model.model.lm_head.weight", "base_model.model.model.embed_tokens.weight", "base_model.model.model.norm.weight"} {
				assert.True(t, keys[k], "adapter has %s", k)
			}
		})
	}
}
