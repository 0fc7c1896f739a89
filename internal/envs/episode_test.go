package envs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envs"
)

// Issue 23 item 8: every kit env assigns a fresh episode id on a reset that
// names none (the real client checks that two sessions differ), keeps one
// it is given, and a fresh env's stateless GET /state still says null.
func TestResetAssignsFreshEpisodeIDs(t *testing.T) {
	ctx := context.Background()
	for _, key := range []string{"mcp-echo", "guess", "letters", "lockbox", "echo"} {
		t.Run(key, func(t *testing.T) {
			c, served := serveOpenEnv(t, key, envs.ProtocolOpenEnv)
			var ids []string
			for range 2 {
				s, _, err := c.Start(ctx, map[string]any{"seed": 1})
				require.NoError(t, err)
				st, err := s.State(ctx)
				require.NoError(t, err)
				var state struct {
					EpisodeID *string `json:"episode_id"`
				}
				require.NoError(t, json.Unmarshal(st, &state))
				require.NotNil(t, state.EpisodeID, "state episode_id after reset")
				assert.Regexp(t, uuid4, *state.EpisodeID)
				ids = append(ids, *state.EpisodeID)
				require.NoError(t, s.Close(ctx))
			}
			assert.NotEqual(t, ids[0], ids[1], "two sessions, two episodes")

			s, _, err := c.Start(ctx, map[string]any{"episode_id": "given"})
			require.NoError(t, err)
			st, err := s.State(ctx)
			require.NoError(t, err)
			assert.Contains(t, string(st), `"episode_id":"given"`)
			require.NoError(t, s.Close(ctx))

			resp, err := http.Get(served.URL + "/state")
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			assert.JSONEq(t, `{"episode_id":null,"step_count":0}`, string(body), "a fresh env has no episode yet")

			resp, err = http.Post(served.URL+"/reset", "application/json", bytes.NewBufferString(`{}`))
			require.NoError(t, err)
			_ = resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode, "a stateless reset without an id works")
		})
	}
}

// Issue 23 item 8: an ORS env served over OpenEnv answers tools/call
// without a reset (over HTTP and the /mcp socket), as OpenEnv's own MCP
// envs do: the call opens the default task's episode.
func TestORSEnvToolsWithoutReset(t *testing.T) {
	ctx := context.Background()
	c, _ := serveOpenEnv(t, "echo", envs.ProtocolOpenEnv)
	res, err := c.MCP(ctx, "tools/call", map[string]any{"name": "echo", "arguments": map[string]string{"text": "hello"}})
	require.NoError(t, err, "stateless POST /mcp")
	assert.Contains(t, string(res), `"data":"match"`, "task 0 of the default split (target hello) is the one opened")

	sid, err := c.CreateMCPSession(ctx)
	require.NoError(t, err)
	res, err = c.MCP(ctx, "tools/call", map[string]any{"name": "echo", "arguments": map[string]string{"text": "nope"}, "session_id": sid})
	require.NoError(t, err, "POST /mcp in a session")
	assert.Contains(t, string(res), "no match")
	require.NoError(t, c.CloseMCPSession(ctx, sid))

	m, err := c.DialMCP(ctx)
	require.NoError(t, err)
	defer m.Close(ctx)
	list, err := m.Call(ctx, "tools/list", nil)
	require.NoError(t, err)
	assert.Contains(t, string(list), `"echo"`)
	res, err = m.Call(ctx, "tools/call", map[string]any{"name": "echo", "arguments": map[string]string{"text": "x"}})
	require.NoError(t, err, "/mcp WebSocket")
	assert.Contains(t, string(res), "no match (got 'x')")
	list, err = m.Call(ctx, "tools/list", nil)
	require.NoError(t, err)
	assert.Contains(t, string(list), `"hint"`, "once the episode is open its task tools are listed")
}
