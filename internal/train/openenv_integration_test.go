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
	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
)

// lettersOverOpenEnv is the quickstart's env served over OpenEnv as an MCP
// env, as the issue writes it: {target: builtin:letters, protocol: openenv}.
func lettersOverOpenEnv(name string) config.EnvConfig {
	return config.EnvConfig{Target: "builtin:letters", Split: "train", Weight: 1, Name: name, Protocol: "openenv"}
}

// Issue 10: the quickstart learns over OpenEnv as it does over ORS.
func TestQuickstartOverOpenEnvLearns(t *testing.T) {
	requireWorker(t)
	if testing.Short() {
		t.Skip("learning test takes about a minute")
	}
	out := filepath.Join(t.TempDir(), "run")
	cfg := quickstart(t, out, 100)
	cfg.Envs = []config.EnvConfig{lettersOverOpenEnv("")}
	cfg.GRPO.SaveSteps = 0
	cfg.Logging.LogCompletions = false
	_, err := Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: func(string) string { return "" }})
	require.NoError(t, err)
	metrics := readMetrics(t, out)
	require.Len(t, metrics, 100)
	first, last := meanOf(metrics[:5], "reward"), meanOf(metrics[90:], "reward")
	t.Logf("over OpenEnv, mean reward: first 5 steps %.3f, last 10 steps %.3f", first, last)
	assert.LessOrEqual(t, first, 0.1)
	assert.GreaterOrEqual(t, last, 0.5)
	assert.Zero(t, metrics[len(metrics)-1]["rollouts/env_error"])
}

// Issue 10 and issue 14 bug 9: an ORS env and an OpenEnv env mixed with
// weights, two entries of one env name, each logged under its own key.
func TestMixedProtocolsLogPerEnvRewards(t *testing.T) {
	requireWorker(t)
	out := filepath.Join(t.TempDir(), "run")
	cfg := quickstart(t, out, 3)
	cfg.GRPO.SaveSteps = 0
	cfg.Envs = []config.EnvConfig{
		{Target: "builtin:letters", Split: "train", Weight: 3},
		{Target: "builtin:letters", Split: "validation", Weight: 1},
		lettersOverOpenEnv("letters-openenv"),
	}
	cfg.Envs[2].Weight = 2
	res, err := Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: func(string) string { return "" }})
	require.NoError(t, err)
	assert.Equal(t, 3, res.Steps)
	keys := map[string]bool{}
	for _, m := range readMetrics(t, out) {
		for k := range m {
			keys[k] = true
		}
	}
	assert.True(t, keys["env/letters-train/reward_mean"] || keys["env/letters-validation/reward_mean"] || keys["env/letters-openenv/reward_mean"], "per-env rewards: %v", keys)
	for k := range keys {
		assert.NotEqual(t, "env/letters/reward_mean", k, "two letters entries are not blurred into one key")
	}
	var man manifest
	require.NoError(t, ReadJSON(filepath.Join(out, "manifest.json"), &man))
	require.Len(t, man.Envs, 3)
	assert.Equal(t, []string{"letters-train", "letters-validation", "letters-openenv"}, []string{man.Envs[0].Key, man.Envs[1].Key, man.Envs[2].Key})
	assert.Equal(t, []string{"ors", "ors", "openenv"}, []string{man.Envs[0].Protocol, man.Envs[1].Protocol, man.Envs[2].Protocol})
}

// Issue 10: eval works on OpenEnv targets.
func TestEvaluateOverOpenEnv(t *testing.T) {
	requireWorker(t)
	out := filepath.Join(t.TempDir(), "eval")
	cfg := quickstart(t, out, 1)
	cfg.Envs = []config.EnvConfig{lettersOverOpenEnv("")}
	cfg.Envs[0].NumTasks = 2
	res, err := Evaluate(context.Background(), cfg, EvalOptions{Logger: zerolog.Nop(), Getenv: func(string) string { return "" }, NumGenerations: 2, PassThreshold: 1})
	require.NoError(t, err)
	require.Len(t, res.Tasks, 2)
	assert.Equal(t, 4, res.Rollouts)
	assert.Zero(t, res.Failures)
	assert.Equal(t, "letters", res.Tasks[0].Env)
}

// Issue 23: capacity refusals are retried and counted in the metrics as
// env/<key>/capacity_waits, not only in debug logs.
func TestCapacityWaitsAreCounted(t *testing.T) {
	requireWorker(t)
	srv, err := envs.ServeLocalProtocol(context.Background(), "letters", envs.ProtocolOpenEnv,
		envs.ServeOptions{OpenEnv: openenvserver.Options{MaxSessions: 2}, ToolLatency: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	out := filepath.Join(t.TempDir(), "run")
	cfg := quickstart(t, out, 2)
	cfg.GRPO.SaveSteps = 0
	cfg.Envs = []config.EnvConfig{{Target: srv.URL, Split: "train", Weight: 1, Name: "full", Protocol: "openenv", NumTasks: 8}}
	_, err = Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: func(string) string { return "" }})
	require.NoError(t, err)
	var waits float64
	for _, m := range readMetrics(t, out) {
		require.Contains(t, m, "env/full/capacity_waits")
		waits += m["env/full/capacity_waits"]
		assert.Zero(t, m["rollouts/env_error"])
	}
	assert.Positive(t, waits, "32 rollouts a step against 2 sessions wait for capacity")
}
