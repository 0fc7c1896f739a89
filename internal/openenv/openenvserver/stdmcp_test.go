package openenvserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
	"github.com/ortrain/ortrain/internal/testclients"
)

// stdReply is one HTTP answer of the standard MCP transport.
type stdReply struct {
	Status int
	Header http.Header
	Body   []byte
	RPC    struct {
		ID     json.RawMessage `json:"id"`
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Code    int             `json:"code"`
			Message string          `json:"message"`
			Data    json.RawMessage `json:"data"`
		} `json:"error"`
	}
}

func mcpDo(t *testing.T, method, url, body string, headers map[string]string) stdReply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewBufferString(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	r := stdReply{Status: resp.StatusCode, Header: resp.Header}
	r.Body, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	if len(r.Body) > 0 {
		require.NoError(t, json.Unmarshal(r.Body, &r.RPC), "%s", r.Body)
	}
	return r
}

// initialize runs the handshake and returns the session id.
func initialize(t *testing.T, base, version string) (string, stdReply) {
	t.Helper()
	r := mcpDo(t, http.MethodPost, base+"/mcp", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"`+version+`","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`, nil)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	sid := r.Header.Get("Mcp-Session-Id")
	if r.RPC.Error == nil {
		require.NotEmpty(t, sid)
		n := mcpDo(t, http.MethodPost, base+"/mcp", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, map[string]string{"Mcp-Session-Id": sid, "MCP-Protocol-Version": version})
		require.Equal(t, http.StatusAccepted, n.Status)
		require.Empty(t, n.Body)
	}
	return sid, r
}

// The standard lifecycle on the OpenEnv kit's /mcp: initialize negotiates
// a version and opens a session, the session's requests get MCP's shapes
// and the spec's statuses, and DELETE ends it.
func TestStandardMCPLifecycle(t *testing.T) {
	base, srv := serve(t, envs.MCPEcho(), openenvserver.Options{})

	t.Run("negotiation", func(t *testing.T) {
		for client, want := range map[string]string{"2025-11-25": "2025-11-25", "2025-06-18": "2025-06-18", "2025-03-26": "2025-03-26",
			"2024-11-05": "2024-11-05", "2026-07-28": "2025-11-25", "1900-01-01": "2025-11-25"} {
			_, r := initialize(t, base, client)
			require.Nil(t, r.RPC.Error, "%s", r.Body)
			var res struct {
				ProtocolVersion string         `json:"protocolVersion"`
				Capabilities    map[string]any `json:"capabilities"`
				ServerInfo      struct{ Name, Version string }
			}
			require.NoError(t, json.Unmarshal(r.RPC.Result, &res))
			assert.Equal(t, want, res.ProtocolVersion, client)
			assert.Contains(t, res.Capabilities, "tools")
			assert.Equal(t, envs.MCPEchoEnvName, res.ServerInfo.Name)
		}
	})

	sid, _ := initialize(t, base, "2025-06-18")
	session := map[string]string{"Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-06-18"}
	tests := []struct {
		name    string
		body    string
		headers map[string]string
		status  int
		code    int    // 0: a result
		result  string // JSONEq of the result, when set
	}{
		{"ping", `{"jsonrpc":"2.0","id":1,"method":"ping"}`, session, 200, 0, `{}`},
		{"tools/call", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo_with_length","arguments":{"message":"ab"}}}`, session, 200, 0,
			`{"content":[{"type":"text","text":"{\"message\":\"ab\",\"length\":2}"}],"structuredContent":{"message":"ab","length":2},"isError":false,"_meta":{"ortrain/finished":false,"ortrain/reward":null}}`},
		{"tool error is a result", `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo_message","arguments":{"message":1}}}`, session, 200, 0,
			`{"content":[{"type":"text","text":"Invalid arguments for tool 'echo_message': message: Input should be a valid string"}],"isError":true,"_meta":{"ortrain/finished":false,"ortrain/reward":null}}`},
		{"no tool name", `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{}}`, session, 200, -32602, ""},
		{"unknown method", `{"jsonrpc":"2.0","id":5,"method":"resources/list"}`, session, 200, -32601, ""},
		{"params not an object", `{"jsonrpc":"2.0","id":6,"method":"tools/list","params":[1]}`, session, 200, -32602, ""},
		{"unknown session", `{"jsonrpc":"2.0","id":7,"method":"ping"}`, map[string]string{"Mcp-Session-Id": "nope"}, 404, -32001, ""},
		{"unsupported version header", `{"jsonrpc":"2.0","id":8,"method":"ping"}`, map[string]string{"Mcp-Session-Id": sid, "MCP-Protocol-Version": "1900-01-01"}, 400, -32022, ""},
		{"2026 request is refused with the versions to use", `{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`,
			map[string]string{"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list"}, 400, -32022, ""},
		{"no session: a stateless call", `{"jsonrpc":"2.0","id":10,"method":"ping"}`, map[string]string{"MCP-Protocol-Version": "2025-06-18"}, 200, 0, `{}`},
		{"parse error", `{"jsonrpc":`, session, 400, -32700, ""},
		{"batch", `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, session, 400, -32600, ""},
		{"null id", `{"jsonrpc":"2.0","id":null,"method":"ping"}`, session, 400, -32600, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := mcpDo(t, http.MethodPost, base+"/mcp", tt.body, tt.headers)
			require.Equal(t, tt.status, r.Status, "%s", r.Body)
			assert.Equal(t, "application/json", r.Header.Get("Content-Type"))
			if tt.code != 0 {
				require.NotNil(t, r.RPC.Error, "%s", r.Body)
				assert.Equal(t, tt.code, r.RPC.Error.Code, r.RPC.Error.Message)
				return
			}
			require.Nil(t, r.RPC.Error, "%s", r.Body)
			if tt.result != "" {
				assert.JSONEq(t, tt.result, string(r.RPC.Result))
			}
		})
	}

	t.Run("tools/list in MCP's shape", func(t *testing.T) {
		r := mcpDo(t, http.MethodPost, base+"/mcp", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, session)
		var res struct {
			Tools []map[string]json.RawMessage `json:"tools"`
		}
		require.NoError(t, json.Unmarshal(r.RPC.Result, &res))
		require.Len(t, res.Tools, 2)
		for _, tl := range res.Tools {
			assert.ElementsMatch(t, []string{"name", "description", "inputSchema"}, keys(tl), "no null fields a strict client would reject")
		}
	})

	t.Run("server/discover sends 2026 clients to initialize", func(t *testing.T) {
		r := mcpDo(t, http.MethodPost, base+"/mcp", `{"jsonrpc":"2.0","id":"d","method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`,
			map[string]string{"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "server/discover"})
		require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
		var res struct {
			ResultType        string   `json:"resultType"`
			SupportedVersions []string `json:"supportedVersions"`
		}
		require.NoError(t, json.Unmarshal(r.RPC.Result, &res))
		assert.Equal(t, "complete", res.ResultType)
		assert.Equal(t, []string{"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"}, res.SupportedVersions)
	})

	t.Run("GET is 405", func(t *testing.T) {
		r := mcpDo(t, http.MethodGet, base+"/mcp", "", session)
		assert.Equal(t, http.StatusMethodNotAllowed, r.Status)
		assert.Equal(t, "POST, DELETE", r.Header.Get("Allow"))
	})

	t.Run("DELETE ends the session", func(t *testing.T) {
		other, _ := initialize(t, base, "2025-11-25")
		live := srv.Stats().Live
		assert.Equal(t, http.StatusBadRequest, mcpDo(t, http.MethodDelete, base+"/mcp", "", nil).Status)
		assert.Equal(t, http.StatusOK, mcpDo(t, http.MethodDelete, base+"/mcp", "", map[string]string{"Mcp-Session-Id": other}).Status)
		assert.Equal(t, live-1, srv.Stats().Live)
		assert.Equal(t, http.StatusNotFound, mcpDo(t, http.MethodDelete, base+"/mcp", "", map[string]string{"Mcp-Session-Id": other}).Status)
		assert.Equal(t, http.StatusNotFound, mcpDo(t, http.MethodPost, base+"/mcp", `{"jsonrpc":"2.0","id":1,"method":"ping"}`, map[string]string{"Mcp-Session-Id": other}).Status)
		assert.Equal(t, http.StatusOK, mcpDo(t, http.MethodPost, base+"/mcp", `{"jsonrpc":"2.0","id":1,"method":"ping"}`, session).Status, "other sessions live on")
	})

	t.Run("OpenEnv's own JSON-RPC is unchanged", func(t *testing.T) {
		r := mcpDo(t, http.MethodPost, base+"/mcp", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo_message","arguments":{"message":"s"}}}`, nil)
		assert.JSONEq(t, `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"s","annotations":null,"meta":null}],"structured_content":{"result":"s"},"meta":null,"data":"s","is_error":false}}`, string(r.Body))
		r = mcpDo(t, http.MethodPost, base+"/mcp", `{"jsonrpc":"2.0","id":2,"method":"envcheck/no-such-method"}`, nil)
		assert.Equal(t, http.StatusOK, r.Status)
		assert.JSONEq(t, `{"jsonrpc":"2.0","id":2,"error":{"code":-32601,"message":"Method not found: envcheck/no-such-method","data":null}}`, string(r.Body))
	})
}

func keys(m map[string]json.RawMessage) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// An MCP session holds one env instance: a multi-step episode (lockbox
// served over OpenEnv) keeps its state across tool calls, ends with its
// reward in _meta, and takes a capacity slot.
func TestStandardMCPSessionState(t *testing.T) {
	base, _ := serve(t, openenvserver.FromORS(envs.Lockbox()), openenvserver.Options{MaxSessions: 1})
	sid, _ := initialize(t, base, "2025-11-25")
	h := map[string]string{"Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-11-25"}
	call := func(name, args string) map[string]json.RawMessage {
		r := mcpDo(t, http.MethodPost, base+"/mcp", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"`+name+`","arguments":`+args+`}}`, h)
		require.Nil(t, r.RPC.Error, "%s", r.Body)
		var res map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(r.RPC.Result, &res))
		return res
	}
	opened := call(envs.LockboxOpenTool, `{}`)
	code := regexp.MustCompile(`[0-9]`).FindString(string(opened["content"]))
	require.NotEmpty(t, code)
	unlocked := call(envs.LockboxUnlockTool, `{"code":"`+code+`"}`)
	assert.JSONEq(t, `false`, string(unlocked["isError"]))
	assert.JSONEq(t, `{"ortrain/finished":true,"ortrain/reward":1}`, string(unlocked["_meta"]), "the opened envelope was remembered")

	_, r := initialize(t, base, "2025-11-25")
	require.NotNil(t, r.RPC.Error, "the one slot is taken")
	assert.Equal(t, -32000, r.RPC.Error.Code)
	assert.Contains(t, string(r.RPC.Error.Data), `"max_sessions":1`)
}

// The official TypeScript SDK client connects to the OpenEnv kit's /mcp
// (mcp-echo and lockbox), lists and calls tools, and ends its session.
func TestTypeScriptSDKClientOnOpenEnv(t *testing.T) {
	n := testclients.RequireNode(t, "@modelcontextprotocol/sdk")
	run := func(t *testing.T, base string, calls string) map[string]any {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		// The script lives with envmcp's tests, which run it too.
		cmd := exec.CommandContext(ctx, n.Bin, "../../envmcp/testdata/mcp_client.js", base+"/mcp", "", calls)
		cmd.Env = n.Env()
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		require.NoError(t, cmd.Run(), "mcp_client.js: %s", stderr.String())
		t.Logf("the SDK client saw: %s", stdout.String())
		var out map[string]any
		require.NoError(t, json.Unmarshal(stdout.Bytes(), &out))
		assert.Equal(t, "2025-11-25", out["protocolVersion"])
		assert.NotEmpty(t, out["sessionId"])
		assert.Equal(t, true, out["terminated"])
		assert.Empty(t, out["transportErrors"])
		return out
	}

	t.Run("mcp-echo", func(t *testing.T) {
		base, srv := serve(t, envs.MCPEcho(), openenvserver.Options{})
		out := run(t, base, `[{"name":"echo_message","arguments":{"message":"hi"}},{"name":"echo_with_length","arguments":{"message":"abc"}},{"name":"nope"}]`)
		assert.Len(t, out["tools"], 2)
		calls := out["calls"].([]any)
		require.Len(t, calls, 3)
		first := calls[0].(map[string]any)["result"].(map[string]any)
		assert.Equal(t, "hi", first["content"].([]any)[0].(map[string]any)["text"])
		second := calls[1].(map[string]any)["result"].(map[string]any)
		assert.Equal(t, map[string]any{"message": "abc", "length": float64(3)}, second["structuredContent"])
		third := calls[2].(map[string]any)["result"].(map[string]any)
		assert.Equal(t, true, third["isError"], "an unknown tool is an error result the model sees")
		require.Eventually(t, func() bool { return srv.Stats().Live == 0 }, 5*time.Second, 10*time.Millisecond, "DELETE freed the session")
	})

	t.Run("lockbox", func(t *testing.T) {
		base, _ := serve(t, openenvserver.FromORS(envs.Lockbox()), openenvserver.Options{})
		out := run(t, base, `[{"name":"open_envelope"},{"name":"unlock","arguments":{"code":"$digit"}}]`)
		calls := out["calls"].([]any)
		require.Len(t, calls, 2)
		unlocked := calls[1].(map[string]any)["result"].(map[string]any)
		assert.Equal(t, map[string]any{"ortrain/finished": true, "ortrain/reward": float64(1)}, unlocked["_meta"])
	})
}
