package train

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/vllm"
)

// TestVLLMOptionsFromConfig: engine.kind vllm becomes one engine.VLLMOptions:
// the launch from engine.vllm_*, replica logs and (by default) synced
// weights in output_dir, and LoRA adapters served under vLLM's next allowed
// --max-lora-rank.
func TestVLLMOptionsFromConfig(t *testing.T) {
	base := func() *config.Config {
		cfg := config.Default()
		cfg.OutputDir = "/runs/a"
		cfg.Worker.GPUs = []int{0}
		cfg.Engine.Kind = "vllm"
		cfg.Engine.VLLMGPUs = []int{1, 2}
		cfg.Engine.VLLMReplicas = 2
		cfg.Engine.VLLMCommand = []string{"ortrain", "serve-engine"}
		cfg.Engine.VLLMExtraArgs = []string{"--enforce-eager"}
		cfg.Engine.VLLMPort = 8100
		cfg.Engine.VLLMGPUMemoryUtilization = 0.5
		cfg.Engine.VLLMMaxModelLen = 4096
		cfg.Engine.VLLMStartupTimeout = 3 * time.Minute
		cfg.Engine.VLLMMaxRestarts = 7
		cfg.Engine.GenerateTimeout = 90 * time.Second
		return &cfg
	}
	tests := []struct {
		name  string
		edit  func(*config.Config)
		check func(t *testing.T, o engine.VLLMOptions)
	}{
		{"full weights", func(*config.Config) {}, func(t *testing.T, o engine.VLLMOptions) {
			assert.Equal(t, engine.SyncFull, o.SyncMode)
			assert.Nil(t, o.Launch.LoRA)
			assert.Equal(t, "/runs/a/weight-sync", o.SyncDir)
			assert.Equal(t, "/runs/a/vllm-logs", o.LogDir)
			assert.Equal(t, vllm.LaunchConfig{Command: []string{"ortrain", "serve-engine"}, Self: "/bin/ortrain", Model: "/models/m", Host: "127.0.0.1",
				TensorParallelSize: 1, GPUMemoryUtilization: 0.5, MaxModelLen: 4096, ExtraArgs: []string{"--enforce-eager"},
				Environ: []string{"PATH=/bin"}}, o.Launch)
			assert.Equal(t, vllm.GPUPlan{GPUs: []int{1, 2}, Replicas: 2, TensorParallelSize: 1, TrainerGPUs: []int{0}}, o.GPUs)
			assert.Equal(t, 8100, o.BasePort)
			assert.Equal(t, 3*time.Minute, o.StartupTimeout)
			assert.Equal(t, 7, o.MaxRestarts)
			assert.Equal(t, 10*time.Minute, o.SyncTimeout)
			assert.Equal(t, 90*time.Second, o.Timeout)
			assert.Empty(t, o.URLs)
		}},
		{"lora rank 4", func(c *config.Config) { c.GRPO.LoRA.Enabled, c.GRPO.LoRA.Rank = true, 4 }, func(t *testing.T, o engine.VLLMOptions) {
			assert.Equal(t, engine.SyncLoRA, o.SyncMode)
			assert.Equal(t, &vllm.LoRALaunch{MaxRank: 8, MaxLoras: 2}, o.Launch.LoRA)
		}},
		{"lora rank 64", func(c *config.Config) { c.GRPO.LoRA.Enabled, c.GRPO.LoRA.Rank = true, 64 }, func(t *testing.T, o engine.VLLMOptions) {
			assert.Equal(t, &vllm.LoRALaunch{MaxRank: 64, MaxLoras: 2}, o.Launch.LoRA)
		}},
		{"sync dir and colocation", func(c *config.Config) {
			c.Engine.VLLMSyncDir, c.Engine.VLLMColocate, c.Engine.VLLMSyncTimeout = "/dev/shm/sync", true, time.Minute
		}, func(t *testing.T, o engine.VLLMOptions) {
			assert.Equal(t, "/dev/shm/sync", o.SyncDir)
			assert.True(t, o.GPUs.Colocate)
			assert.Equal(t, time.Minute, o.SyncTimeout)
		}},
		{"urls", func(c *config.Config) { c.Engine.VLLMURLs = []string{"http://a:8000", "http://b:8000"} }, func(t *testing.T, o engine.VLLMOptions) {
			assert.Equal(t, []string{"http://a:8000", "http://b:8000"}, o.URLs)
		}},
		{"api key and host", func(c *config.Config) { c.Engine.VLLMHost = "0.0.0.0"; c.Engine.VLLMAPIKey = "k-1" }, func(t *testing.T, o engine.VLLMOptions) {
			assert.Equal(t, "0.0.0.0", o.Launch.Host)
			assert.Equal(t, "k-1", o.APIKey, "sent to every server")
			assert.Equal(t, "k-1", o.Launch.APIKey, "given to launched replicas")
			assert.NoError(t, o.Launch.CheckExposure())
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := base()
			tt.edit(cfg)
			var exported string
			export := func(_ context.Context, dir string) error { exported = dir; return nil }
			o := vllmOptions(cfg, "/models/m", export, RunOptions{Executable: "/bin/ortrain", Environ: []string{"PATH=/bin"}}, zerolog.Nop())
			require.NotNil(t, o.Export)
			require.NoError(t, o.Export(context.Background(), filepath.Join("x", "y")))
			assert.Equal(t, filepath.Join("x", "y"), exported, "weights are exported by the given exporter")
			tt.check(t, o)
		})
	}
}
