package train

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/reward"
)

// pass@k against the closed form 1 - C(n-c,k)/C(n,k), by hand.
func TestPassAtK(t *testing.T) {
	tests := []struct {
		n, c, k int
		want    float64
	}{
		{4, 0, 1, 0},
		{4, 1, 1, 0.25},
		{4, 1, 2, 0.5},        // 1 - C(3,2)/C(4,2) = 1 - 3/6
		{4, 2, 2, 5.0 / 6},    // 1 - C(2,2)/C(4,2) = 1 - 1/6
		{8, 3, 4, 1 - 5.0/70}, // 1 - C(5,4)/C(8,4)
		{4, 4, 1, 1},
		{4, 1, 4, 1},
	}
	for _, tc := range tests {
		assert.InDelta(t, tc.want, passAtK(tc.n, tc.c, tc.k), 1e-12, "n=%d c=%d k=%d", tc.n, tc.c, tc.k)
	}
}

func TestEvaluateQuickstartModel(t *testing.T) {
	requireWorker(t)
	// The model sits where a run's checkpoint would, so the eval lands in
	// that run's eval/<step>-<time>/ and leaves output_dir alone.
	root := t.TempDir()
	run := filepath.Join(root, "run")
	out := filepath.Join(root, "elsewhere")
	cfg := quickstart(t, out, 1)
	cfg.Model = filepath.Join(run, "checkpoints", "step-000007", "model")
	cfg.Envs[0].NumTasks = 3
	res, err := Evaluate(context.Background(), cfg, EvalOptions{Logger: zerolog.Nop(), Getenv: os.Getenv, NumGenerations: 4, PassThreshold: 1})
	require.NoError(t, err)
	require.Len(t, res.Tasks, 3)
	assert.Equal(t, 12, res.Rollouts)
	assert.Equal(t, []int{1, 2, 4}, res.Ks)
	for i, task := range res.Tasks {
		assert.Equal(t, i, task.Index)
		assert.Len(t, task.Rewards, 4)
		assert.Zero(t, task.Failures)
	}
	assert.Equal(t, 12, countLines(t, res.Trajectory))

	assert.Equal(t, filepath.Join(run, "eval"), filepath.Dir(res.Dir))
	assert.Regexp(t, `^000007-\d{8}-\d{6}$`, filepath.Base(res.Dir))
	assert.Equal(t, filepath.Join(res.Dir, "trajectories.jsonl"), res.Trajectory)
	assert.NoDirExists(t, out, "an eval of a checkpoint writes nothing to output_dir")

	// result.json is EvalResult plus the keys internal/report reads.
	var got map[string]any
	require.NoError(t, ReadJSON(filepath.Join(res.Dir, "result.json"), &got))
	assert.Equal(t, 7.0, got["checkpoint_step"])
	assert.Equal(t, cfg.Model, got["model"])
	assert.Regexp(t, `^[0-9a-f]{64}$`, got["model_hash"])
	assert.Equal(t, 12.0, got["rollouts"])
	assert.Len(t, got["tasks"], 3)
	for _, k := range []string{"mean_reward", "pass_at_k", "failed_rollouts", "seconds"} {
		assert.Contains(t, got, k)
	}

	// An explicit Dir is used as given; the checkpoint's step is still recorded.
	res2, err := Evaluate(context.Background(), cfg, EvalOptions{Logger: zerolog.Nop(), Getenv: os.Getenv, NumGenerations: 1, PassThreshold: 1, Dir: filepath.Join(root, "mine")})
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(root, "mine"), res2.Dir)
	require.NotNil(t, res2.CheckpointStep)
	assert.Equal(t, 7, *res2.CheckpointStep)
	assert.FileExists(t, filepath.Join(root, "mine", "result.json"))
}

func TestNewEvalDir(t *testing.T) {
	root := t.TempDir()
	now := time.Date(2026, 11, 23, 22, 30, 5, 0, time.UTC)
	ck := filepath.Join(root, "run", "checkpoints", "step-000100")
	tests := []struct {
		name, model string
		wantDir     string
		wantStep    int // -1: none
	}{
		{"checkpoint model dir", filepath.Join(ck, "model"), filepath.Join(root, "run", "eval", "000100-20261123-223005"), 100},
		{"checkpoint dir", ck + "/", filepath.Join(root, "run", "eval", "000100-20261123-223005-2"), 100},
		{"plain model dir", filepath.Join(root, "models", "tiny"), filepath.Join(root, "out", "eval", "tiny-20261123-223005"), -1},
		{"hub repo id", "Qwen/Qwen3-4B", filepath.Join(root, "out", "eval", "Qwen3-4B-20261123-223005"), -1},
		{"step dir outside checkpoints", filepath.Join(root, "x", "step-000003", "model"), filepath.Join(root, "out", "eval", "model-20261123-223005"), -1},
		{"step name not a number", filepath.Join(root, "run", "checkpoints", "step-last", "model"), filepath.Join(root, "out", "eval", "model-20261123-223005-2"), -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, step, err := NewEvalDir(tt.model, filepath.Join(root, "out"), now)
			assert.True(t, filepath.IsAbs(dir), "always absolute: %s", dir)
			require.NoError(t, err)
			assert.Equal(t, tt.wantDir, dir)
			assert.DirExists(t, dir)
			if tt.wantStep < 0 {
				assert.Nil(t, step)
			} else {
				require.NotNil(t, step)
				assert.Equal(t, tt.wantStep, *step)
			}
		})
	}
}

// Issue 16: eval reports every reward function's mean, and pass@k is on
// their weighted sum.
func TestEvaluateReportsRewardFunctions(t *testing.T) {
	requireWorker(t)
	out := filepath.Join(t.TempDir(), "eval")
	cfg := quickstart(t, out, 1)
	cfg.Envs[0].NumTasks = 2
	two := 2.0
	cfg.Rewards = []reward.Spec{
		{Name: "env", Kind: reward.KindEnv},
		{Name: "always", Kind: reward.KindExpression, Weight: &two, Expression: "1.0"},
	}
	res, err := Evaluate(context.Background(), cfg, EvalOptions{Logger: zerolog.Nop(), Getenv: os.Getenv, NumGenerations: 2, PassThreshold: 2})
	require.NoError(t, err)
	assert.Equal(t, 1.0, res.Rewards["rewards/always/mean"])
	assert.Contains(t, res.Rewards, "rewards/env/mean")
	// Every rollout's combined reward is env + 2, so all of them pass at 2.
	assert.Equal(t, 1.0, res.PassAtK["pass@1"])
	assert.InDelta(t, res.Rewards["rewards/env/mean"]+2, res.MeanReward, 1e-9)
}
