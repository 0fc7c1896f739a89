package train

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/config"
)

// Issue 14 bug 7: eval takes a LoRA run's checkpoint (the directory or its
// adapter/), loads base + adapter, and records what it evaluated; a LoRA
// config evaluates the run's latest checkpoint, never the untrained base.
func TestEvaluateLoRACheckpoint(t *testing.T) {
	requireWorker(t)
	out := filepath.Join(t.TempDir(), "run")
	cfg := quickstart(t, out, 2)
	cfg.GRPO.SaveSteps = 0
	cfg.GRPO.LoRA.Enabled, cfg.GRPO.LoRA.Rank, cfg.GRPO.LoRA.Alpha = true, 4, 8
	eo := EvalOptions{Logger: zerolog.Nop(), Getenv: noEnv, NumGenerations: 2, PassThreshold: 1}
	evalCfg := func(model string) *config.Config {
		c := *cfg
		c.Model = model
		c.Envs = []config.EnvConfig{{Target: "builtin:letters", Split: "validation", NumTasks: 2, Weight: 1}}
		return &c
	}

	_, err := Evaluate(context.Background(), evalCfg(cfg.Model), eo)
	var fe *config.FieldError
	require.ErrorAs(t, err, &fe, "a LoRA config without a checkpoint would evaluate the untrained base")
	assert.Contains(t, err.Error(), "--model RUN/checkpoints/step-N")

	res, err := Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: noEnv})
	require.NoError(t, err)
	ck := res.Checkpoint
	require.DirExists(t, filepath.Join(ck, "adapter"))

	for name, model := range map[string]string{
		"checkpoint dir":      ck,
		"adapter dir":         filepath.Join(ck, "adapter"),
		"LoRA config's model": cfg.Model,
	} {
		t.Run(name, func(t *testing.T) {
			r, err := Evaluate(context.Background(), evalCfg(model), eo)
			require.NoError(t, err)
			assert.Equal(t, 4, r.Rollouts)
			assert.Zero(t, r.Failures)
			wantAdapter, _ := filepath.Abs(filepath.Join(ck, "adapter"))
			assert.Equal(t, wantAdapter, r.Adapter, "the eval records the adapter it loaded")
			require.NotNil(t, r.CheckpointStep)
			assert.Equal(t, 2, *r.CheckpointStep)
			assert.Len(t, r.ModelHash, 64)
		})
	}
}
