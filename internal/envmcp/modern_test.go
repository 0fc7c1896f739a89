package envmcp_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envmcp"
	"github.com/ortrain/ortrain/internal/envtarget"
)

const modern = "2026-07-28"

// modernBody is a 2026-07-28 request: its version and capabilities ride in
// params._meta.
func modernBody(t *testing.T, id int, method string, params map[string]any) []byte {
	t.Helper()
	if params == nil {
		params = map[string]any{}
	}
	params["_meta"] = map[string]any{
		"io.modelcontextprotocol/protocolVersion":    modern,
		"io.modelcontextprotocol/clientInfo":         map[string]string{"name": "envmcp-test", "version": "0"},
		"io.modelcontextprotocol/clientCapabilities": map[string]any{},
	}
	b, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	require.NoError(t, err)
	return b
}

// modernHeaders are the standard headers a conforming client sends.
func modernHeaders(method, name string) map[string]string {
	h := map[string]string{"MCP-Protocol-Version": modern, "Mcp-Method": method}
	if name != "" {
		h["Mcp-Name"] = name
	}
	return h
}

// A stateless client (TypeScript and Python SDK 2.x, Go SDK) probes
// server/discover and then calls tools with no session at all.
func TestModernEpisode(t *testing.T) {
	reward := 0.75
	sess := &stubSession{call: func(_ context.Context, name string, _ json.RawMessage) (*envtarget.ToolOutput, error) {
		if name == "finish" {
			return &envtarget.ToolOutput{Text: "done", Reward: &reward, Finished: true}, nil
		}
		return &envtarget.ToolOutput{Text: "ok"}, nil
	}}
	srv, base := serve(t, envmcp.Options{Version: "9.9"})
	ep := srv.Attach("r", "k", sess, []envtarget.ToolSpec{{Name: "echo"}, {Name: "finish"}})
	c := newClient(t, base, "r", "k")

	r := c.do(http.MethodPost, modernBody(t, 1, "server/discover", nil), modernHeaders("server/discover", ""))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	assert.Empty(t, r.Header.Get("Mcp-Session-Id"), "the stateless revision mints no session")
	var disc struct {
		ResultType        string         `json:"resultType"`
		SupportedVersions []string       `json:"supportedVersions"`
		Capabilities      map[string]any `json:"capabilities"`
		Meta              map[string]struct {
			Name, Version string
		} `json:"_meta"`
		TTLMs      *int   `json:"ttlMs"`
		CacheScope string `json:"cacheScope"`
	}
	require.NoError(t, json.Unmarshal(r.RPC.Result, &disc))
	assert.Equal(t, "complete", disc.ResultType)
	assert.Equal(t, []string{"2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"}, disc.SupportedVersions)
	assert.Contains(t, disc.Capabilities, "tools")
	assert.Equal(t, "9.9", disc.Meta["io.modelcontextprotocol/serverInfo"].Version)
	require.NotNil(t, disc.TTLMs)
	assert.Equal(t, "private", disc.CacheScope)

	r = c.do(http.MethodPost, modernBody(t, 2, "tools/list", nil), modernHeaders("tools/list", ""))
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	var list map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(r.RPC.Result, &list))
	assert.JSONEq(t, `"complete"`, string(list["resultType"]))
	assert.JSONEq(t, `0`, string(list["ttlMs"]))
	assert.JSONEq(t, `"private"`, string(list["cacheScope"]))
	assert.Contains(t, string(list["tools"]), `"finish"`)
	assert.Contains(t, string(list["_meta"]), "io.modelcontextprotocol/serverInfo")

	call := func(id int, name string) (int, map[string]json.RawMessage) {
		r := c.do(http.MethodPost, modernBody(t, id, "tools/call", map[string]any{"name": name, "arguments": map[string]any{}}), modernHeaders("tools/call", name))
		var res map[string]json.RawMessage
		if r.RPC.Result != nil {
			require.NoError(t, json.Unmarshal(r.RPC.Result, &res))
		}
		return r.Status, res
	}
	status, res := call(3, "echo")
	require.Equal(t, http.StatusOK, status)
	assert.JSONEq(t, `"complete"`, string(res["resultType"]))
	assert.NotContains(t, res, "structuredContent")

	status, res = call(4, "finish")
	require.Equal(t, http.StatusOK, status)
	assert.JSONEq(t, `{"finished":true,"reward":0.75}`, string(res["structuredContent"]))
	var meta map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(res["_meta"], &meta))
	assert.JSONEq(t, `true`, string(meta["ortrain/finished"]))
	assert.JSONEq(t, `0.75`, string(meta["ortrain/reward"]))
	assert.Contains(t, meta, "io.modelcontextprotocol/serverInfo", "ortrain's keys sit beside the server's identity")
	assert.Contains(t, string(res["content"]), "[episode finished: reward 0.75")

	status, res = call(5, "echo")
	require.Equal(t, http.StatusOK, status)
	assert.JSONEq(t, `true`, string(res["isError"]))
	assert.Equal(t, 1, ep.CallsAfterFinish())
	assert.Len(t, ep.Calls(), 3)
}

// The 2026-07-28 rules: 400 with -32022/-32602/-32020 for a bad version,
// envelope or headers, 404 with -32601 for an unknown method; legacy
// traffic keeps its own.
func TestModernErrors(t *testing.T) {
	srv, base := serve(t, envmcp.Options{})
	srv.Attach("r", "k", &stubSession{}, []envtarget.ToolSpec{{Name: "echo"}, {Name: "héllo"}})
	c := newClient(t, base, "r", "k")
	callEcho := modernBody(t, 1, "tools/call", map[string]any{"name": "echo"})
	withMeta := func(meta map[string]any) []byte {
		b, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": map[string]any{"_meta": meta}})
		require.NoError(t, err)
		return b
	}
	tests := []struct {
		name    string
		body    []byte
		headers map[string]string
		status  int
		code    int // 0: a result
	}{
		{"tools/call", callEcho, modernHeaders("tools/call", "echo"), http.StatusOK, 0},
		{"session id ignored", callEcho, map[string]string{"MCP-Protocol-Version": modern, "Mcp-Method": "tools/call", "Mcp-Name": "echo", "Mcp-Session-Id": "stale"}, http.StatusOK, 0},
		{"base64 name", modernBody(t, 1, "tools/call", map[string]any{"name": "héllo"}),
			modernHeaders("tools/call", "=?base64?"+base64.StdEncoding.EncodeToString([]byte("héllo"))+"?="), http.StatusOK, 0},
		{"ping", modernBody(t, 1, "ping", nil), modernHeaders("ping", ""), http.StatusOK, 0},
		{"unsupported version", withMeta(map[string]any{"io.modelcontextprotocol/protocolVersion": "2099-01-01", "io.modelcontextprotocol/clientCapabilities": map[string]any{}}),
			map[string]string{"MCP-Protocol-Version": "2099-01-01", "Mcp-Method": "tools/list"}, http.StatusBadRequest, -32022},
		{"legacy version in the envelope", withMeta(map[string]any{"io.modelcontextprotocol/protocolVersion": "2025-06-18", "io.modelcontextprotocol/clientCapabilities": map[string]any{}}),
			map[string]string{"MCP-Protocol-Version": "2025-06-18", "Mcp-Method": "tools/list"}, http.StatusBadRequest, -32022},
		{"version not a string", withMeta(map[string]any{"io.modelcontextprotocol/protocolVersion": 7}), modernHeaders("tools/list", ""), http.StatusBadRequest, -32602},
		{"no client capabilities", withMeta(map[string]any{"io.modelcontextprotocol/protocolVersion": modern}), modernHeaders("tools/list", ""), http.StatusBadRequest, -32602},
		{"no version header", callEcho, map[string]string{"Mcp-Method": "tools/call", "Mcp-Name": "echo"}, http.StatusBadRequest, -32020},
		{"version header mismatch", callEcho, map[string]string{"MCP-Protocol-Version": "2025-11-25", "Mcp-Method": "tools/call", "Mcp-Name": "echo"}, http.StatusBadRequest, -32020},
		{"no method header", callEcho, map[string]string{"MCP-Protocol-Version": modern, "Mcp-Name": "echo"}, http.StatusBadRequest, -32020},
		{"method header mismatch", callEcho, modernHeaders("tools/list", "echo"), http.StatusBadRequest, -32020},
		{"no name header", callEcho, modernHeaders("tools/call", ""), http.StatusBadRequest, -32020},
		{"name header mismatch", callEcho, modernHeaders("tools/call", "other"), http.StatusBadRequest, -32020},
		{"bad base64 name", callEcho, modernHeaders("tools/call", "=?base64?!!?="), http.StatusBadRequest, -32020},
		{"unknown method", modernBody(t, 1, "resources/list", nil), modernHeaders("resources/list", ""), http.StatusNotFound, -32601},
		{"initialize is not a method", modernBody(t, 1, "initialize", nil), modernHeaders("initialize", ""), http.StatusNotFound, -32601},
		{"discover without _meta", []byte(`{"jsonrpc":"2.0","id":1,"method":"server/discover"}`), nil, http.StatusOK, 0},
		{"modern header without _meta", []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`), map[string]string{"MCP-Protocol-Version": modern}, http.StatusBadRequest, -32602},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := c.do(http.MethodPost, tt.body, tt.headers)
			require.Equal(t, tt.status, r.Status, "%s", r.Body)
			if tt.code == 0 {
				require.Nil(t, r.RPC.Error, "%s", r.Body)
				assert.Contains(t, string(r.RPC.Result), `"resultType":"complete"`)
				return
			}
			require.NotNil(t, r.RPC.Error, "%s", r.Body)
			assert.Equal(t, tt.code, r.RPC.Error.Code, r.RPC.Error.Message)
			assert.JSONEq(t, `1`, string(r.RPC.ID), "the error answers the request's id")
		})
	}

	t.Run("-32022 names the supported versions", func(t *testing.T) {
		r := c.do(http.MethodPost, withMeta(map[string]any{"io.modelcontextprotocol/protocolVersion": "2099-01-01", "io.modelcontextprotocol/clientCapabilities": map[string]any{}}),
			map[string]string{"MCP-Protocol-Version": "2099-01-01", "Mcp-Method": "tools/list"})
		var body struct {
			Error struct {
				Data struct {
					Supported []string `json:"supported"`
					Requested string   `json:"requested"`
				} `json:"data"`
			} `json:"error"`
		}
		require.NoError(t, json.Unmarshal(r.Body, &body))
		assert.Equal(t, "2099-01-01", body.Error.Data.Requested)
		assert.Equal(t, []string{"2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"}, body.Error.Data.Supported)
	})

	t.Run("a legacy session's unknown version header says the same", func(t *testing.T) {
		legacy := newClient(t, base, "r", "k")
		legacy.initialize("2025-11-25")
		r := legacy.do(http.MethodPost, []byte(`{"jsonrpc":"2.0","id":1,"method":"ping"}`), map[string]string{"MCP-Protocol-Version": "1900-01-01"})
		require.Equal(t, http.StatusBadRequest, r.Status)
		require.NotNil(t, r.RPC.Error)
		assert.Equal(t, -32022, r.RPC.Error.Code)
	})

	t.Run("notifications are accepted", func(t *testing.T) {
		b := []byte(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`)
		r := c.do(http.MethodPost, b, map[string]string{"MCP-Protocol-Version": modern})
		assert.Equal(t, http.StatusAccepted, r.Status)
		assert.Empty(t, r.Body)
	})
}
