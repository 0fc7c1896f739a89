package envs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/ors"
)

func TestLadderPasses(t *testing.T) {
	tests := []struct {
		answer string
		level  int
		want   bool
	}{
		{"", 0, false},
		{"x", 0, true},
		{"xxxxxxxxxa", 1, true},
		{"xxxxxxxxx", 1, false},
		{"abababab", 4, true},
		{"aaAbbbbb", 4, false}, // 'A' is not 'a'
		{"aaaaaaaa", 8, true},
		{"aaaaaaab", 8, false},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, envs.LadderPasses(tc.answer, tc.level), "%q at level %d", tc.answer, tc.level)
	}
}

// The ladder over ORS: nine levels cycling through each split, binary
// rewards, bad task specs refused.
func TestLadderOverORS(t *testing.T) {
	ctx := context.Background()
	c, _ := serve(t, "ladder")
	for split, n := range map[string]int{"train": 72, "validation": 18} {
		tasks, err := c.Tasks(ctx, split)
		require.NoError(t, err)
		require.Len(t, tasks, n, split)
		for i, task := range tasks {
			var spec struct{ Level int }
			require.NoError(t, json.Unmarshal(task.Spec, &spec))
			assert.Equal(t, i%9, spec.Level, "%s task %d", split, i)
		}
	}
	s, err := c.OpenSession(ctx, ors.SessionSpec{Split: "train", Index: 4})
	require.NoError(t, err)
	defer s.Close(ctx)
	prompt, err := s.Prompt(ctx)
	require.NoError(t, err)
	assert.Equal(t, "Call the `submit` tool with an answer that holds the letter 'a' at least 4 times.", prompt[0].Text)
	out, err := s.CallTool(ctx, "submit", json.RawMessage(`{"answer":"babababa"}`))
	require.NoError(t, err)
	assert.Equal(t, 1.0, *out.Reward)
	assert.True(t, out.Finished)
	bad, err := c.OpenSession(ctx, ors.SessionSpec{Task: json.RawMessage(`{"id":"x","level":9}`)})
	if err == nil {
		// The server builds the episode on its first use.
		defer bad.Close(ctx)
		_, err = bad.Prompt(ctx)
	}
	var he *ors.InvalidRequestError
	require.ErrorAs(t, err, &he, "level 9 does not exist")
	assert.Equal(t, 400, he.StatusCode)
}

// The same env over OpenEnv (an MCP env): the reward of a submission at
// each level.
func TestLadderOverOpenEnv(t *testing.T) {
	ctx := context.Background()
	c, _ := serveOpenEnv(t, "ladder", envs.ProtocolOpenEnv)
	for _, tc := range []struct {
		level  int
		answer string
		want   float64
	}{{0, "zz", 1}, {2, "abca", 1}, {3, "abca", 0}, {8, "aaaaaaaa", 1}} {
		s, _, err := c.Start(ctx, map[string]any{"split": "validation", "index": tc.level})
		require.NoError(t, err)
		call, err := s.CallTool(ctx, "submit", json.RawMessage(fmt.Sprintf(`{"answer":%q}`, tc.answer)))
		require.NoError(t, err)
		require.Nil(t, call.Error)
		assert.Equal(t, tc.want, *call.Reward, "level %d, %q", tc.level, tc.answer)
		assert.True(t, call.Done)
		require.NoError(t, s.Close(ctx))
	}
}
