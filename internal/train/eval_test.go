package train

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	out := filepath.Join(t.TempDir(), "eval")
	cfg := quickstart(t, out, 1)
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
}
