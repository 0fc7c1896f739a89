package envmcp_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envmcp"
	"github.com/ortrain/ortrain/internal/envtarget"
)

// stubSession is a Session whose CallTool is scripted: for the failures a
// built-in env does not produce (infrastructure errors, hangs) and for
// counting concurrency.
type stubSession struct {
	call    func(ctx context.Context, name string, input json.RawMessage) (*envtarget.ToolOutput, error)
	active  atomic.Int32
	maxSeen atomic.Int32
}

func (s *stubSession) Prompt(context.Context) (string, error) { return "stub", nil }
func (s *stubSession) Tools(context.Context) ([]envtarget.ToolSpec, error) {
	return nil, nil
}
func (s *stubSession) Close(context.Context) error { return nil }

func (s *stubSession) CallTool(ctx context.Context, name string, input json.RawMessage) (*envtarget.ToolOutput, error) {
	n := s.active.Add(1)
	defer s.active.Add(-1)
	for {
		m := s.maxSeen.Load()
		if n <= m || s.maxSeen.CompareAndSwap(m, n) {
			break
		}
	}
	if s.call == nil {
		return &envtarget.ToolOutput{Text: "ok"}, nil
	}
	return s.call(ctx, name, input)
}

// attachStub serves one rollout on a stub session and returns an
// initialized client.
func attachStub(t *testing.T, opts envmcp.Options, sess *stubSession) (*envmcp.Server, *envmcp.Episode, *mcpClient) {
	t.Helper()
	srv, base := serve(t, opts)
	tools := []envtarget.ToolSpec{{Name: "echo", Description: "Echo.", InputSchema: json.RawMessage(`null`)}}
	ep := srv.Attach("r", "k", sess, tools)
	c := newClient(t, base, "r", "k")
	c.initialize("2025-06-18")
	return srv, ep, c
}

func TestJSONRPCErrors(t *testing.T) {
	_, _, c := attachStub(t, envmcp.Options{}, &stubSession{})
	tests := []struct {
		name, body string
		status     int
		code       int // 0: a result
	}{
		{"bad JSON", `{"jsonrpc":"2.0",`, http.StatusBadRequest, -32700},
		{"empty body", ``, http.StatusBadRequest, -32700},
		{"trailing data", `{"jsonrpc":"2.0","id":1,"method":"ping"} {}`, http.StatusBadRequest, -32700},
		{"batch", `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, http.StatusBadRequest, -32600},
		{"not an object", `"ping"`, http.StatusBadRequest, -32600},
		{"wrong jsonrpc version", `{"jsonrpc":"1.0","id":1,"method":"ping"}`, http.StatusBadRequest, -32600},
		{"no method", `{"jsonrpc":"2.0","id":1}`, http.StatusBadRequest, -32600},
		{"method not a string", `{"jsonrpc":"2.0","id":1,"method":7}`, http.StatusBadRequest, -32600},
		{"null id", `{"jsonrpc":"2.0","id":null,"method":"ping"}`, http.StatusBadRequest, -32600},
		{"object id", `{"jsonrpc":"2.0","id":{},"method":"ping"}`, http.StatusBadRequest, -32600},
		{"unknown method", `{"jsonrpc":"2.0","id":1,"method":"resources/list"}`, http.StatusOK, -32601},
		{"params not an object", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":["echo"]}`, http.StatusOK, -32602},
		{"call without name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{}}}`, http.StatusOK, -32602},
		{"arguments not an object", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":[1]}}`, http.StatusOK, -32602},
		{"ping", `{"jsonrpc":"2.0","id":"p-1","method":"ping"}`, http.StatusOK, 0},
		{"ping with null params", `{"jsonrpc":"2.0","id":2,"method":"ping","params":null}`, http.StatusOK, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := c.post(tt.body)
			require.Equal(t, tt.status, r.Status, "%s", r.Body)
			if tt.code == 0 {
				require.Nil(t, r.RPC.Error, "%s", r.Body)
				assert.JSONEq(t, `{}`, string(r.RPC.Result))
				return
			}
			require.NotNil(t, r.RPC.Error, "%s", r.Body)
			assert.Equal(t, tt.code, r.RPC.Error.Code, r.RPC.Error.Message)
			if tt.status == http.StatusOK {
				assert.JSONEq(t, `1`, string(r.RPC.ID), "an error answers the request's id")
			} else {
				assert.JSONEq(t, `null`, string(r.RPC.ID))
			}
		})
	}
}

// Messages that need no answer (notifications, responses) get 202 and no
// body.
func TestNotificationsAccepted(t *testing.T) {
	_, ep, c := attachStub(t, envmcp.Options{}, &stubSession{})
	for _, body := range []string{
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3}}`,
		`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"echo"}}`,
		`{"jsonrpc":"2.0","id":9,"result":{}}`,
	} {
		r := c.post(body)
		assert.Equal(t, http.StatusAccepted, r.Status, body)
		assert.Empty(t, r.Body, body)
	}
	assert.Empty(t, ep.Calls(), "a tools/call notification runs nothing")
}

// The spec's session and version rules: 400 without a session id or with
// an unsupported MCP-Protocol-Version, 404 for an unknown or deleted
// session; initialize negotiates the version.
func TestSessions(t *testing.T) {
	srv, base := serve(t, envmcp.Options{})
	srv.Attach("r", "k", &stubSession{}, nil)
	c := newClient(t, base, "r", "k")
	c.initialize("2025-03-26")
	assert.Equal(t, "2025-03-26", c.version)

	ping := `{"jsonrpc":"2.0","id":1,"method":"ping"}`
	for _, tt := range []struct {
		name    string
		headers map[string]string
		want    int
	}{
		{"session", nil, http.StatusOK},
		{"no version header", map[string]string{"MCP-Protocol-Version": ""}, http.StatusOK},
		{"other supported version", map[string]string{"MCP-Protocol-Version": "2025-06-18"}, http.StatusOK},
		{"unsupported version", map[string]string{"MCP-Protocol-Version": "1900-01-01"}, http.StatusBadRequest},
		{"no session id", map[string]string{"Mcp-Session-Id": ""}, http.StatusBadRequest},
		{"unknown session id", map[string]string{"Mcp-Session-Id": "0123abcd"}, http.StatusNotFound},
		{"foreign origin", map[string]string{"Origin": "http://evil.example"}, http.StatusForbidden},
		{"loopback origin", map[string]string{"Origin": "http://localhost:5173"}, http.StatusOK},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := c.do(http.MethodPost, []byte(ping), tt.headers)
			assert.Equal(t, tt.want, r.Status, "%s", r.Body)
		})
	}

	t.Run("negotiation", func(t *testing.T) {
		for client, want := range map[string]string{
			"2025-11-25": "2025-11-25", "2025-06-18": "2025-06-18", "2025-03-26": "2025-03-26", "2024-11-05": "2024-11-05",
			"2099-01-01": "2025-11-25", "2026-07-28": "2025-11-25", "": "2025-11-25",
		} {
			other := newClient(t, base, "r", "k")
			assert.Equal(t, want, other.initialize(client).ProtocolVersion, client)
			assert.NotEqual(t, c.session, other.session, "each initialize opens its own session")
		}
	})

	t.Run("GET is 405", func(t *testing.T) {
		r := c.do(http.MethodGet, nil, nil)
		assert.Equal(t, http.StatusMethodNotAllowed, r.Status)
		assert.Equal(t, "POST, DELETE", r.Header.Get("Allow"))
	})

	t.Run("DELETE ends the MCP session only", func(t *testing.T) {
		other := newClient(t, base, "r", "k")
		other.initialize("2025-06-18")
		assert.Equal(t, http.StatusBadRequest, other.do(http.MethodDelete, nil, map[string]string{"Mcp-Session-Id": ""}).Status)
		assert.Equal(t, http.StatusOK, other.do(http.MethodDelete, nil, nil).Status)
		assert.Equal(t, http.StatusNotFound, other.post(ping).Status)
		assert.Equal(t, http.StatusNotFound, other.do(http.MethodDelete, nil, nil).Status)
		assert.Equal(t, http.StatusOK, c.post(ping).Status, "other sessions of the rollout live on")
	})
}

func TestBodyCap(t *testing.T) {
	_, _, c := attachStub(t, envmcp.Options{}, &stubSession{})
	pad := strings.Repeat("x", envmcp.MaxBodyBytes)
	r := c.post(`{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":"` + pad + `"}}`)
	assert.Equal(t, http.StatusRequestEntityTooLarge, r.Status)
	assert.Equal(t, http.StatusOK, c.post(`{"jsonrpc":"2.0","id":1,"method":"ping"}`).Status)
}

// A tool's own error is an isError result; any other error is JSON-RPC
// -32603; both are recorded, and the call deadline holds.
func TestCallErrors(t *testing.T) {
	reward := 0.5
	tests := []struct {
		name    string
		call    func(ctx context.Context) (*envtarget.ToolOutput, error)
		isError bool
		rpcCode int // 0: a tools/call result
		text    string
		err     string
		reward  *float64
	}{
		{name: "output", call: func(context.Context) (*envtarget.ToolOutput, error) {
			return &envtarget.ToolOutput{Text: "fine", Reward: &reward, Finished: true}, nil
		}, text: "fine\n\n[episode finished: reward 0.5 — no more tool calls are needed]", reward: &reward},
		{name: "tool error", call: func(context.Context) (*envtarget.ToolOutput, error) {
			return nil, &envtarget.ToolError{Tool: "echo", Err: errors.New("bad input: want text")}
		}, isError: true, text: "bad input: want text", err: "bad input: want text"},
		{name: "unknown tool (the env's tool error)", call: func(context.Context) (*envtarget.ToolOutput, error) {
			return nil, &envtarget.ToolError{Tool: "nope", Err: errors.New(`unknown tool "nope"`)}
		}, isError: true, text: `unknown tool "nope"`, err: `unknown tool "nope"`},
		{name: "infrastructure error", call: func(context.Context) (*envtarget.ToolOutput, error) {
			return nil, &envtarget.SessionLostError{Target: "x", Err: errors.New("connection reset")}
		}, rpcCode: -32603, err: "connection reset"},
		{name: "no output", call: func(context.Context) (*envtarget.ToolOutput, error) {
			return nil, nil
		}, rpcCode: -32603, err: "no output"},
		{name: "timeout", call: func(ctx context.Context) (*envtarget.ToolOutput, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		}, rpcCode: -32603, err: "timed out after 50ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sess := &stubSession{call: func(ctx context.Context, _ string, _ json.RawMessage) (*envtarget.ToolOutput, error) {
				return tt.call(ctx)
			}}
			_, ep, c := attachStub(t, envmcp.Options{CallTimeout: 50 * time.Millisecond}, sess)
			r := c.request("tools/call", map[string]any{"name": "echo", "arguments": map[string]string{"text": "hi"}})
			require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
			if tt.rpcCode != 0 {
				require.NotNil(t, r.RPC.Error, "%s", r.Body)
				assert.Equal(t, tt.rpcCode, r.RPC.Error.Code)
				assert.Contains(t, r.RPC.Error.Message, tt.err)
			} else {
				require.Nil(t, r.RPC.Error, "%s", r.Body)
				var res toolResult
				require.NoError(t, json.Unmarshal(r.RPC.Result, &res))
				assert.Equal(t, tt.isError, res.IsError)
				assert.Equal(t, tt.text, res.text(t))
			}
			calls := ep.Calls()
			require.Len(t, calls, 1, "every call is recorded")
			assert.Equal(t, "echo", calls[0].Name)
			assert.JSONEq(t, `{"text":"hi"}`, string(calls[0].Arguments))
			assert.Equal(t, tt.isError, calls[0].IsError)
			if tt.err == "" {
				assert.Empty(t, calls[0].Err)
				assert.Equal(t, "fine", calls[0].Result, "the record keeps the env's own text")
			} else {
				assert.Contains(t, calls[0].Err, tt.err)
			}
			assert.Equal(t, tt.reward, calls[0].Reward)
			assert.Equal(t, tt.reward != nil, ep.Finished())
		})
	}
}

// Calls to one session go one at a time, whatever the agent sends at once.
func TestCallsSerialized(t *testing.T) {
	sess := &stubSession{call: func(ctx context.Context, _ string, _ json.RawMessage) (*envtarget.ToolOutput, error) {
		select {
		case <-time.After(20 * time.Millisecond):
			return &envtarget.ToolOutput{Text: "ok"}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}}
	_, ep, c := attachStub(t, envmcp.Options{}, sess)
	var wg sync.WaitGroup
	results := make([]toolResult, 4)
	for i := range results {
		wg.Go(func() { results[i] = c.callTool("echo", map[string]int{"i": i}) })
	}
	wg.Wait()
	for _, res := range results {
		assert.False(t, res.IsError)
	}
	assert.Equal(t, int32(1), sess.maxSeen.Load(), "never two calls in the session at once")
	calls := ep.Calls()
	require.Len(t, calls, 4)
	for i := 1; i < len(calls); i++ {
		assert.False(t, calls[i].Start.Before(calls[i-1].End), "call %d started before call %d ended", i, i-1)
	}
}

// Detach cancels a call in flight and waits until it is recorded.
func TestDetachCancelsCalls(t *testing.T) {
	entered := make(chan struct{})
	sess := &stubSession{call: func(ctx context.Context, _ string, _ json.RawMessage) (*envtarget.ToolOutput, error) {
		close(entered)
		<-ctx.Done()
		return nil, ctx.Err()
	}}
	srv, ep, c := attachStub(t, envmcp.Options{}, sess)
	done := make(chan *reply, 1)
	go func() { done <- c.request("tools/call", map[string]any{"name": "echo"}) }()
	<-entered
	srv.Detach("r")
	calls := ep.Calls()
	require.Len(t, calls, 1, "the cancelled call is recorded before Detach returns")
	assert.Contains(t, calls[0].Err, "detached")
	r := <-done
	require.NotNil(t, r.RPC.Error, "%s", r.Body)
	assert.Equal(t, -32603, r.RPC.Error.Code)
}
