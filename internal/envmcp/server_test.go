package envmcp_test

import (
	"encoding/json"
	"net/http"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envmcp"
	"github.com/ortrain/ortrain/internal/envs"
)

// A whole lockbox episode through MCP against the real built-in env, over
// ORS and over OpenEnv: the agent reads the code, unlocks the box, and the
// reward and the end of the episode are recorded.
func TestLockboxEpisode(t *testing.T) {
	for _, tt := range []struct {
		name, protocol string
	}{
		{"ors", ""},
		{"openenv", "openenv"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sess, tools := openBuiltin(t, "builtin:lockbox", tt.protocol)
			srv, base := serve(t, envmcp.Options{Version: "1.2.3"})
			ep := srv.Attach("r1", "key-1", sess, tools)
			t.Cleanup(func() { srv.Detach("r1") })
			c := newClient(t, base, "r1", "key-1")

			init := c.initialize("2025-06-18")
			assert.Equal(t, "2025-06-18", init.ProtocolVersion)
			require.NotNil(t, init.Capabilities.Tools)
			assert.False(t, init.Capabilities.Tools.ListChanged)
			assert.Equal(t, "ortrain", init.ServerInfo.Name)
			assert.Equal(t, "1.2.3", init.ServerInfo.Version)

			names := []string{}
			for _, tl := range c.listTools() {
				names = append(names, tl.Name)
			}
			assert.ElementsMatch(t, []string{envs.LockboxOpenTool, envs.LockboxUnlockTool}, names)

			opened := c.callTool(envs.LockboxOpenTool, nil)
			require.False(t, opened.IsError, opened.text(t))
			// The answer's wording is the env's ("code: 4", or JSON): take
			// the one digit in it.
			code := regexp.MustCompile(`[0-9]`).FindAllString(opened.text(t), -1)
			require.Len(t, code, 1, opened.text(t))
			assert.False(t, ep.Finished(), "reading the code does not end the episode")

			_, ended := ep.FinishedAt()
			assert.False(t, ended)
			assert.Nil(t, opened.StructuredContent, "only the last call carries structured content")
			assert.JSONEq(t, `false`, string(opened.Meta[envmcp.MetaFinished]))

			unlocked := c.callTool(envs.LockboxUnlockTool, map[string]string{"code": code[0]})
			require.False(t, unlocked.IsError, unlocked.text(t))
			assert.Equal(t, "unlocked\n\n[episode finished: reward 1 — no more tool calls are needed]", unlocked.text(t))
			assert.JSONEq(t, `{"finished":true,"reward":1}`, string(unlocked.StructuredContent))
			assert.JSONEq(t, `true`, string(unlocked.Meta[envmcp.MetaFinished]))
			assert.JSONEq(t, `1`, string(unlocked.Meta[envmcp.MetaReward]))
			assert.True(t, ep.Finished())

			// After the end, calls never reach the env: the agent sees an
			// isError result saying so, and the call is recorded and counted.
			again := c.callTool(envs.LockboxUnlockTool, map[string]string{"code": code[0]})
			assert.True(t, again.IsError)
			assert.Equal(t, "the episode is over (it finished at tool call 2); end the episode", again.text(t))
			assert.JSONEq(t, `true`, string(again.Meta[envmcp.MetaFinished]))
			assert.JSONEq(t, `null`, string(again.Meta[envmcp.MetaReward]))
			assert.Equal(t, 1, ep.CallsAfterFinish())

			calls := ep.Calls()
			require.Len(t, calls, 3)
			assert.Equal(t, envs.LockboxOpenTool, calls[0].Name)
			assert.JSONEq(t, `{}`, string(calls[0].Arguments), "absent arguments are sent as {}")
			assert.Equal(t, opened.text(t), calls[0].Result)
			assert.False(t, calls[0].Finished)
			assert.Equal(t, envs.LockboxUnlockTool, calls[1].Name)
			assert.JSONEq(t, `{"code":"`+code[0]+`"}`, string(calls[1].Arguments))
			require.NotNil(t, calls[1].Reward)
			assert.InDelta(t, 1.0, *calls[1].Reward, 1e-12)
			assert.True(t, calls[1].Finished)
			assert.False(t, calls[1].IsError)
			assert.Empty(t, calls[1].Err)
			assert.True(t, calls[2].IsError)
			assert.True(t, calls[2].AfterFinish)
			assert.False(t, calls[1].AfterFinish)
			assert.Contains(t, calls[2].Err, "the episode is over")
			assert.Nil(t, calls[2].Reward)
			at, ended := ep.FinishedAt()
			require.True(t, ended)
			assert.Equal(t, calls[1].End, at, "the episode ended when the finishing call returned")
			for _, call := range calls {
				assert.False(t, call.Start.IsZero())
				assert.False(t, call.End.Before(call.Start))
			}

			rewards := ep.Rewards()
			require.Len(t, rewards, 3, "one reward slot per call")
			if rewards[0] != nil { // OpenEnv steps may carry a zero reward
				assert.Zero(t, *rewards[0])
			}
			require.NotNil(t, rewards[1])
			assert.InDelta(t, 1.0, *rewards[1], 1e-12)
			assert.Nil(t, rewards[2])
			*rewards[1] = 7
			assert.InDelta(t, 1.0, *ep.Rewards()[1], 1e-12, "Rewards returns copies")
		})
	}
}

// tools/list shows each tool's schema as the env gave it, and an object
// schema for a tool that takes no arguments.
func TestToolsListSchemas(t *testing.T) {
	sess, tools := openBuiltin(t, "builtin:lockbox", "")
	srv, base := serve(t, envmcp.Options{})
	srv.Attach("r1", "k", sess, tools)
	c := newClient(t, base, "r1", "k")
	c.initialize("2025-06-18")
	listed := map[string]listedTool{}
	for _, tl := range c.listTools() {
		listed[tl.Name] = tl
	}
	require.Len(t, listed, 2)
	assert.Equal(t, "Read the code.", listed[envs.LockboxOpenTool].Description)
	var open map[string]any
	require.NoError(t, json.Unmarshal(listed[envs.LockboxOpenTool].InputSchema, &open))
	assert.Equal(t, "object", open["type"], "a no-argument tool still has an object schema")
	assert.JSONEq(t, `{"properties":{"code":{"type":"string"}},"required":["code"],"type":"object"}`,
		string(listed[envs.LockboxUnlockTool].InputSchema))

	// The raw body keeps MCP's field names.
	r := c.request("tools/list", nil)
	var raw struct {
		Tools []map[string]json.RawMessage `json:"tools"`
	}
	require.NoError(t, json.Unmarshal(r.RPC.Result, &raw))
	for _, tl := range raw.Tools {
		assert.Contains(t, tl, "name")
		assert.Contains(t, tl, "description")
		assert.Contains(t, tl, "inputSchema")
		assert.NotContains(t, tl, "input_schema")
	}
}

// Each rollout admits only its own key; an empty key admits nobody.
func TestAuth(t *testing.T) {
	srv, base := serve(t, envmcp.Options{})
	srv.Attach("a", "key-a", &stubSession{}, nil)
	srv.Attach("b", "key-b", &stubSession{}, nil)
	srv.Attach("open", "", &stubSession{}, nil)
	initBody := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}`
	tests := []struct {
		name, id, auth string
		want           int
	}{
		{"own key", "a", "Bearer key-a", http.StatusOK},
		{"own key, lower-case scheme", "a", "bearer key-a", http.StatusOK},
		{"other rollout's key", "a", "Bearer key-b", http.StatusUnauthorized},
		{"other rollout's key, other way", "b", "Bearer key-a", http.StatusUnauthorized},
		{"no key", "a", "", http.StatusUnauthorized},
		{"basic scheme", "a", "Basic a2V5LWE=", http.StatusUnauthorized},
		{"key prefix", "a", "Bearer key-", http.StatusUnauthorized},
		{"empty key attached", "open", "Bearer ", http.StatusUnauthorized},
		{"unknown rollout", "nope", "Bearer key-a", http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClient(t, base, tt.id, "")
			r := c.do(http.MethodPost, []byte(initBody), map[string]string{"Authorization": tt.auth})
			assert.Equal(t, tt.want, r.Status, "%s", r.Body)
			if tt.want == http.StatusUnauthorized {
				assert.Equal(t, `Bearer realm="ortrain"`, r.Header.Get("WWW-Authenticate"))
				assert.NotContains(t, string(r.Body), "key-", "the answer never echoes a key")
			}
		})
	}
}

// After Detach a rollout's path is gone, and its MCP sessions with it;
// other rollouts are untouched.
func TestDetach(t *testing.T) {
	srv, base := serve(t, envmcp.Options{})
	srv.Attach("a", "ka", &stubSession{}, nil)
	srv.Attach("b", "kb", &stubSession{}, nil)
	a, b := newClient(t, base, "a", "ka"), newClient(t, base, "b", "kb")
	a.initialize("2025-06-18")
	b.initialize("2025-06-18")
	require.Equal(t, http.StatusOK, a.request("ping", nil).Status)

	srv.Detach("a")
	// a's key opens nothing now: the same 401 as any unknown key, so a
	// detached id cannot be told from an attached one without a live key;
	// b's key learns that a is gone.
	assert.Equal(t, http.StatusUnauthorized, a.request("ping", nil).Status)
	assert.Equal(t, http.StatusUnauthorized, a.request("initialize", map[string]any{"protocolVersion": "2025-06-18"}).Status)
	assert.Equal(t, http.StatusNotFound, newClient(t, base, "a", "kb").request("ping", nil).Status)
	assert.Equal(t, http.StatusOK, b.request("ping", nil).Status)
	srv.Detach("a") // a second Detach is harmless
	srv.Detach("never-attached")

	// Attached again, the id serves a fresh episode: old MCP sessions are gone.
	ep := srv.Attach("a", "ka", &stubSession{}, nil)
	assert.Equal(t, "a", ep.ID())
	assert.Equal(t, http.StatusNotFound, a.request("ping", nil).Status)
	a.initialize("2025-06-18")
	assert.Equal(t, http.StatusOK, a.request("ping", nil).Status)
}
