package openenvserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
)

// TestCapturedWS replays the §2 captures against the kit: every reply must
// equal the real server's after JSON parsing.
func TestCapturedWS(t *testing.T) {
	tests := []struct {
		name string
		env  *openenvserver.Env
		file string
	}{
		{"guess", envs.Guess(), "testdata/guess_ws.txt"},
		{"echo", envs.MCPEcho(), "testdata/echo_ws.txt"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base, srv := serve(t, tt.env, openenvserver.Options{})
			replay(t, dialWS(t, base, "/ws"), tt.file)
			require.Eventually(t, func() bool { return srv.Stats().Live == 0 }, 5*time.Second, 10*time.Millisecond)
			assert.Equal(t, int64(1), srv.Stats().Closed)
		})
	}
}

// TestCapturedCapacity: with max 4, sessions 1..4 hear nothing after the
// 101 and session 5 gets the unsolicited CAPACITY_REACHED, then 1000.
func TestCapturedCapacity(t *testing.T) {
	base, srv := serve(t, envs.Guess(), openenvserver.Options{MaxSessions: 4})
	for range 4 {
		conn := dialWS(t, base, "/ws")
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_, _, err := conn.Read(ctx)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "sessions under the limit are silent")
	}
	// The reads above timed out, which closes those sockets: wait for their
	// slots to come back, then fill up again.
	require.Eventually(t, func() bool { return srv.Stats().Live == 0 }, 5*time.Second, 10*time.Millisecond)
	for range 4 {
		dialWS(t, base, "/ws")
	}
	require.Eventually(t, func() bool { return srv.Stats().Live == 4 }, 5*time.Second, 10*time.Millisecond)
	replay(t, dialWS(t, base, "/ws"), "testdata/capacity_ws.txt")
	assert.Equal(t, int64(1), srv.Stats().Refused)
}

func postMCP(t *testing.T, base, body string) map[string]any {
	t.Helper()
	resp, err := http.Post(base+"/mcp", "application/json", bytes.NewBufferString(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "JSON-RPC is always HTTP 200")
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return out
}

func jsonOf(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

// TestCapturedHTTPMCP replays the §2 POST /mcp and /mcp WebSocket captures
// (the session id is the server's own uuid).
func TestCapturedHTTPMCP(t *testing.T) {
	base, srv := serve(t, envs.MCPEcho(), openenvserver.Options{})
	created := postMCP(t, base, `{"jsonrpc":"2.0","id":3,"method":"openenv/session/create","params":{}}`)
	sid, _ := created["result"].(map[string]any)["session_id"].(string)
	require.Len(t, sid, 36)
	assert.JSONEq(t, `{"jsonrpc":"2.0","id":3,"result":{"session_id":"`+sid+`"}}`, jsonOf(t, created))
	assert.Equal(t, int64(1), srv.Stats().Live)

	got := postMCP(t, base, `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"echo_message","arguments":{"message":"s"},"session_id":"`+sid+`"}}`)
	assert.JSONEq(t, `{"jsonrpc":"2.0","id":4,"result":{"content":[{"type":"text","text":"s","annotations":null,"meta":null}],"structured_content":{"result":"s"},"meta":null,"data":"s","is_error":false}}`, jsonOf(t, got))
	got = postMCP(t, base, `{"jsonrpc":"2.0","id":5,"method":"openenv/session/close","params":{"session_id":"`+sid+`"}}`)
	assert.JSONEq(t, `{"jsonrpc":"2.0","id":5,"result":{"session_id":"`+sid+`","closed":true}}`, jsonOf(t, got))
	assert.Equal(t, int64(0), srv.Stats().Live)
	got = postMCP(t, base, `garbage`)
	assert.JSONEq(t, `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error","data":null}}`, jsonOf(t, got))

	conn := dialWS(t, base, "/mcp")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, conn.Write(ctx, 1, []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo_message","arguments":{"message":"y"}}}`)))
	_, reply, err := conn.Read(ctx)
	require.NoError(t, err)
	captured := `{"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": "y", "annotations": null, "meta": null}], "structured_content": {"result": "y"}, "meta": null, "data": "y", "is_error": false}}`
	assert.JSONEq(t, captured, string(reply))
	assert.Equal(t, captured, string(reply), "json.dumps layout, byte for byte")
}

// TestCapturedHTTP checks the HTTP endpoints of the §2 table.
func TestCapturedHTTP(t *testing.T) {
	base, _ := serve(t, envs.MCPEcho(), openenvserver.Options{})
	get := func(path string) (int, string, http.Header) {
		resp, err := http.Get(base + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b), resp.Header
	}
	code, body, _ := get("/health")
	assert.Equal(t, 200, code)
	assert.JSONEq(t, `{"status":"healthy"}`, body)
	_, body, _ = get("/metadata")
	assert.JSONEq(t, `{"name":"EchoEnvironment","description":"EchoEnvironment environment","readme_content":null,"version":"1.0.0","author":null,"documentation_url":null}`, body)
	_, body, _ = get("/state")
	assert.JSONEq(t, `{"episode_id":null,"step_count":0}`, body)
	code, body, _ = get("/nope")
	assert.Equal(t, 404, code)
	assert.JSONEq(t, `{"detail":"Not Found"}`, body)
	code, body, hdr := get("/reset")
	assert.Equal(t, 405, code)
	assert.JSONEq(t, `{"detail":"Method Not Allowed"}`, body)
	assert.Equal(t, "POST", hdr.Get("Allow"))
	_, body, _ = get("/schema")
	var schema map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(body), &schema))
	assert.Contains(t, schema, "action")
	assert.Contains(t, schema, "observation")
	assert.Contains(t, schema, "state")
}
