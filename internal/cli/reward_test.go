package cli

import (
	"context"
	"math"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/reward"
)

// serveRewardExample runs `ortrain reward serve-example args...` until the
// test ends and returns the URL it printed.
func serveRewardExample(t *testing.T, args ...string) string {
	t.Helper()
	return serveUntilCleanup(t, []string{"reward", "serve-example"}, args...)
}

// TestRewardServeExampleScoresThroughTheContract serves the example scorer
// and scores a batch through a reward set with an http reward.
func TestRewardServeExampleScoresThroughTheContract(t *testing.T) {
	url := serveRewardExample(t, "--port", "0")
	require.True(t, strings.HasPrefix(url, "http://127.0.0.1:") && strings.HasSuffix(url, "/score"), url)

	set, err := reward.Compile([]reward.Spec{
		{Name: "env", Kind: reward.KindEnv},
		{Name: "judge", Kind: reward.KindHTTP, URL: url, Timeout: 5 * time.Second},
	}, reward.Options{})
	require.NoError(t, err)
	one := 1.0
	batch := []reward.Trajectory{
		{Task: map[string]any{"answer": "Paris"}, Turns: []reward.Turn{{Role: "assistant", Text: "paris!"}}, EnvRewards: []*float64{&one}},
		{Task: map[string]any{"answer": "Paris"}, Turns: []reward.Turn{{Role: "assistant", Text: "Lyon"}}},
		{Task: map[string]any{"question": "?"}, Turns: []reward.Turn{{Role: "assistant", Text: "Paris"}}},
	}
	scores, err := set.Score(context.Background(), batch)
	require.NoError(t, err)
	// judge 1, 0, null (no answer); totals env + judge = 2, 0, 0.
	wantJudge := []float64{1, 0, math.NaN()}
	wantTotal := []float64{2, 0, 0}
	for i, s := range scores {
		require.NoError(t, s.Err)
		if math.IsNaN(wantJudge[i]) {
			assert.True(t, math.IsNaN(s.Values[1]), "trajectory %d declines", i)
		} else {
			assert.Equal(t, wantJudge[i], s.Values[1], "trajectory %d", i)
		}
		assert.Equal(t, wantTotal[i], s.Total, "trajectory %d", i)
	}
}

func TestRewardServeExampleFlags(t *testing.T) {
	deps := SystemDeps()
	deps.IO, _, _ = TestIO()
	var got *RewardServeExampleOptions
	cmd := newRewardServeExampleCmd(deps, func(_ context.Context, o *RewardServeExampleOptions) error { got = o; return nil })
	cmd.SetArgs([]string{"--host", "0.0.0.0", "--port", "9100"})
	require.NoError(t, cmd.Execute())
	require.NotNil(t, got)
	assert.Equal(t, "0.0.0.0", got.Host)
	assert.Equal(t, 9100, got.Port)
}

func TestRewardServeExampleErrors(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { busy.Close() })
	busyPort := strconv.Itoa(busy.Addr().(*net.TCPAddr).Port)
	tests := []struct {
		name     string
		args     []string
		code     int
		contains string
	}{
		{"bad port", []string{"reward", "serve-example", "--port", "70000"}, ExitUsage, "--port 70000 is not a TCP port"},
		{"extra argument", []string{"reward", "serve-example", "x"}, ExitUsage, "unknown command"},
		{"unknown subcommand", []string{"reward", "serve"}, ExitUsage, `unknown command "serve"`},
		{"port in use", []string{"reward", "serve-example", "--port", busyPort}, ExitError, "is the port in use?"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := execCLI(t, nil, tt.args...)
			assert.Equal(t, tt.code, code, errOut)
			assert.Empty(t, out)
			assert.Contains(t, errOut, tt.contains)
		})
	}
}
