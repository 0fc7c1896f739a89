package train

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/reward"
)

// Issue 16: the quickstart with an added expression reward (a brevity
// bonus) still learns its env, and both functions are logged under TRL's
// names.
func TestQuickstartWithExpressionRewardLearns(t *testing.T) {
	requireWorker(t)
	if testing.Short() {
		t.Skip("learning test takes about a minute")
	}
	out := filepath.Join(t.TempDir(), "run")
	cfg := quickstart(t, out, 100)
	cfg.GRPO.SaveSteps = 0
	cfg.Logging.LogCompletions = false
	half := 0.5
	cfg.Rewards = []reward.Spec{
		{Name: "env", Kind: reward.KindEnv},
		{Name: "brevity", Kind: reward.KindExpression, Weight: &half, Expression: "completion_tokens < 8 ? 1.0 : 0.0"},
	}
	_, err := Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: func(string) string { return "" }})
	require.NoError(t, err)
	metrics := readMetrics(t, out)
	require.Len(t, metrics, 100)
	for _, k := range []string{"rewards/env/mean", "rewards/env/std", "rewards/brevity/mean", "env/letters/reward_mean"} {
		assert.Contains(t, metrics[len(metrics)-1], k)
	}
	first, last := meanOf(metrics[:5], "rewards/env/mean"), meanOf(metrics[90:], "rewards/env/mean")
	t.Logf("env reward: first 5 steps %.3f, last 10 steps %.3f; brevity last 10 %.3f; combined last 10 %.3f",
		first, last, meanOf(metrics[90:], "rewards/brevity/mean"), meanOf(metrics[90:], "reward"))
	assert.LessOrEqual(t, first, 0.1)
	assert.GreaterOrEqual(t, last, 0.5)
	// The logged reward is the weighted sum the advantages came from.
	m := metrics[len(metrics)-1]
	assert.InDelta(t, m["rewards/env/mean"]+0.5*m["rewards/brevity/mean"], m["reward"], 1e-9)
}

// A reward function that fails for a rollout fails the rollout
// (reward_error), never scores it 0.
func TestFailingRewardFailsTheRollout(t *testing.T) {
	requireWorker(t)
	out := filepath.Join(t.TempDir(), "run")
	cfg := quickstart(t, out, 1)
	cfg.GRPO.SaveSteps = 0
	cfg.Rollout.MaxFailureFraction = 1
	cfg.Rewards = []reward.Spec{{Name: "judge", Kind: reward.KindExpression, Expression: "double(metadata['missing'])"}}
	_, err := Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: func(string) string { return "" }})
	require.NoError(t, err)
	metrics := readMetrics(t, out)
	require.Len(t, metrics, 1)
	assert.Equal(t, 32.0, metrics[0]["rollouts/reward_error"], "every rollout the expression failed for is a failed rollout")
	_, scored := metrics[0]["rewards/judge/mean"]
	assert.False(t, scored, "failed rollouts are not scored as 0")

	// With the default failure budget such a step stops the run.
	cfg = quickstart(t, filepath.Join(t.TempDir(), "run"), 1)
	cfg.Rewards = []reward.Spec{{Name: "judge", Kind: reward.KindExpression, Expression: "double(metadata['missing'])"}}
	_, err = Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: func(string) string { return "" }})
	require.ErrorIs(t, err, ErrTooManyFailures)
	assert.Contains(t, err.Error(), "judge")
}
