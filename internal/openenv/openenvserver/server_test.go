package openenvserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/openenv"
	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
)

func post(t *testing.T, url, body string) (int, string, http.Header) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp.Header
}

// TestStatelessHTTP: /reset, /step and /state each build a fresh env;
// envelope errors are 422 with loc "body", action errors 422 without it,
// env exceptions 500 text/plain.
func TestStatelessHTTP(t *testing.T) {
	base, srv := serve(t, envs.Guess(), openenvserver.Options{MaxSessions: 1})
	tests := []struct {
		name, path, body string
		status           int
		want             string
	}{
		{"reset", "/reset", `{"target":42,"episode_id":"h","ignored":1}`, 200, `{"observation":{"hint":"start","guesses_left":6,"last_guess":null,"message":"Guess a number between 1 and 100."},"reward":0.0,"done":false}`},
		{"reset no body", "/reset", ``, 200, `{"observation":{"hint":"start","guesses_left":6,"last_guess":null,"message":"Guess a number between 1 and 100."},"reward":0.0,"done":false}`},
		{"negative seed", "/reset", `{"seed":-1}`, 422, `{"detail":[{"type":"greater_than_equal","loc":["body","seed"],"msg":"Input should be greater than or equal to 0","input":-1,"ctx":{"ge":0},"url":"https://errors.pydantic.dev/2.13/v/greater_than_equal"}]}`},
		{"long episode id", "/reset", `{"episode_id":"` + strings.Repeat("x", 256) + `"}`, 422, `{"detail":[{"type":"string_too_long","loc":["body","episode_id"],"msg":"String should have at most 255 characters","input":"` + strings.Repeat("x", 256) + `","ctx":{"max_length":255},"url":"https://errors.pydantic.dev/2.13/v/string_too_long"}]}`},
		{"reset raises", "/reset", `{"target":0}`, 500, `Internal Server Error`},
		{"step without action", "/step", `{}`, 422, `{"detail":[{"type":"missing","loc":["body","action"],"msg":"Field required","input":{},"url":"https://errors.pydantic.dev/2.13/v/missing"}]}`},
		{"step bad action", "/step", `{"action":{"guess":0}}`, 422, `{"detail":[{"type":"greater_than_equal","loc":["guess"],"msg":"Input should be greater than or equal to 1","input":0,"ctx":{"ge":1},"url":"https://errors.pydantic.dev/2.13/v/greater_than_equal"}]}`},
		{"step bad timeout", "/step", `{"action":{"guess":1},"timeout_s":0}`, 422, `{"detail":[{"type":"greater_than","loc":["body","timeout_s"],"msg":"Input should be greater than 0","input":0,"ctx":{"gt":0.0},"url":"https://errors.pydantic.dev/2.13/v/greater_than"}]}`},
		// A fresh env has not been reset: the step raises.
		{"step stateless", "/step", `{"action":{"guess":1},"request_id":"r"}`, 500, `Internal Server Error`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body, hdr := post(t, base+tt.path, tt.body)
			assert.Equal(t, tt.status, code)
			if code == 500 {
				assert.Equal(t, tt.want, body)
				assert.Equal(t, "text/plain; charset=utf-8", hdr.Get("Content-Type"))
				return
			}
			assert.JSONEq(t, tt.want, body)
		})
	}
	resp, err := http.Get(base + "/state")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.JSONEq(t, `{"episode_id":null,"step_count":0}`, string(b), "the base State drops subclass fields")
	assert.Equal(t, openenvserver.Stats{}, srv.Stats(), "stateless calls hold no session")

	// Stateless calls work while the only slot is taken.
	conn := dialWS(t, base, "/ws")
	require.Eventually(t, func() bool { return srv.Stats().Live == 1 }, 5*time.Second, 10*time.Millisecond)
	code, _, _ := post(t, base+"/reset", `{}`)
	assert.Equal(t, 200, code)
	_ = conn.CloseNow()
}

func TestGuessSchema(t *testing.T) {
	base, _ := serve(t, envs.Guess(), openenvserver.Options{})
	resp, err := http.Get(base + "/schema")
	require.NoError(t, err)
	defer resp.Body.Close()
	var s openenv.Schema
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&s))
	assert.JSONEq(t, `{"additionalProperties":false,"properties":{"metadata":{"additionalProperties":true,"description":"Additional metadata for the action","title":"Metadata","type":"object"},"guess":{"description":"Your guess, between 1 and 100","maximum":100,"minimum":1,"title":"Guess","type":"integer"}},"required":["guess"],"title":"GuessAction","type":"object"}`, string(s.Action))
	assert.False(t, s.IsMCP())
	assert.Contains(t, string(s.Observation), "guesses_left")
	assert.Contains(t, string(s.State), "max_guesses")
}

// TestJSONRPCRequests covers the request model: -32600 for a bad envelope
// (id null), ids echoed, a request without id answered with id null.
func TestJSONRPCRequests(t *testing.T) {
	base, _ := serve(t, envs.MCPEcho(), openenvserver.Options{})
	tests := []struct{ body, want string }{
		{`{"jsonrpc":"1.0","id":1,"method":"tools/list"}`, `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request","data":null}}`},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/list","extra":1}`, `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request","data":null}}`},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":[]}`, `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request","data":null}}`},
		{`{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}`, `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request","data":null}}`},
		{`{"jsonrpc":"2.0","id":{},"method":"tools/list"}`, `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request","data":null}}`},
		{`[1]`, `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request","data":null}}`},
		{`{"jsonrpc":"2.0","method":"nope"}`, `{"jsonrpc":"2.0","id":null,"error":{"code":-32601,"message":"Method not found: nope","data":null}}`},
		{`{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"echo_message","arguments":{"message":1}}}`, `{"jsonrpc":"2.0","id":"a","error":{"code":-32603,"message":"Invalid arguments for tool 'echo_message': message: Input should be a valid string","data":null}}`},
		{`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo_with_length","arguments":{"message":"ab"}}}`, `{"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"{\"message\":\"ab\",\"length\":2}","annotations":null,"meta":null}],"structured_content":{"message":"ab","length":2},"meta":null,"data":{"message":"ab","length":2},"is_error":false}}`},
	}
	for _, tt := range tests {
		t.Run(tt.body, func(t *testing.T) {
			code, body, _ := post(t, base+"/mcp", tt.body)
			assert.Equal(t, 200, code)
			assert.JSONEq(t, tt.want, body)
		})
	}
	_, body, _ := post(t, base+"/mcp", `{"jsonrpc":"2.0","id":9,"method":"tools/list"}`)
	var list struct {
		Result struct {
			Tools []map[string]json.RawMessage `json:"tools"`
		} `json:"result"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &list))
	require.Len(t, list.Result.Tools, 2)
	for _, key := range []string{"name", "title", "description", "inputSchema", "outputSchema", "icons", "annotations", "meta", "execution"} {
		assert.Contains(t, list.Result.Tools[0], key, "MCP SDK Tool dump")
	}
	assert.JSONEq(t, `{"fastmcp":{"tags":[]}}`, string(list.Result.Tools[0]["meta"]))

	// The /mcp socket adds the decoder's message to a parse error.
	conn := dialWS(t, base, "/mcp")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, conn.Write(ctx, websocket.MessageText, []byte(`nope`)))
	_, reply, err := conn.Read(ctx)
	require.NoError(t, err)
	assert.JSONEq(t, `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error: Expecting value: line 1 column 1 (char 0)","data":null}}`, string(reply))
}

// TestShutdownClosesSockets: Shutdown ends every socket with 1001 and
// every session, and waits for their handlers.
func TestShutdownClosesSockets(t *testing.T) {
	srv, err := openenvserver.New(openenvserver.Options{}, envs.MCPEcho())
	require.NoError(t, err)
	l := listen(t)
	go func() { _ = srv.Serve(l) }()
	url := "http://" + l.Addr().String()
	ws := dialWS(t, url, "/ws")
	mcp := dialWS(t, url, "/mcp")
	require.Eventually(t, func() bool { return srv.Stats().Live == 2 }, 5*time.Second, 10*time.Millisecond)
	_, body, _ := post(t, url+"/mcp", `{"jsonrpc":"2.0","id":1,"method":"openenv/session/create"}`)
	assert.Contains(t, body, "session_id")
	assert.Equal(t, int64(3), srv.Stats().Live)
	readErr := make(chan error, 2)
	for _, c := range []*websocket.Conn{ws, mcp} {
		go func() {
			_, _, err := c.Read(context.Background())
			readErr <- err
		}()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, srv.Shutdown(ctx))
	for range 2 {
		assert.Equal(t, websocket.StatusGoingAway, websocket.CloseStatus(<-readErr))
	}
	assert.Equal(t, openenvserver.Stats{Created: 3, Closed: 3}, srv.Stats())
	require.NoError(t, srv.Shutdown(ctx), "idempotent")
}

// panicky is an env whose instance panics: one env bug must not take the
// server down.
type panicky struct{}

func (panicky) Reset(context.Context, map[string]json.RawMessage) (openenvserver.Observation, error) {
	panic("reset exploded")
}
func (panicky) State(context.Context) (json.RawMessage, error) { return nil, errors.New("no state") }
func (panicky) Step(context.Context, json.RawMessage) (openenvserver.Observation, error) {
	return openenvserver.Observation{Fields: map[string]any{"reward": 1}}, nil
}

func TestEnvFailuresAreContained(t *testing.T) {
	env := &openenvserver.Env{Name: "Panicky", Action: []openenvserver.Field{{Name: "a", Type: openenvserver.String}},
		New: func(context.Context) (openenvserver.Instance, error) { return panicky{}, nil }}
	base, _ := serve(t, env, openenvserver.Options{MaxSessions: 1})
	conn := dialWS(t, base, "/ws")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, tt := range []struct{ frame, want string }{
		{`{"type":"reset"}`, `{"type":"error","data":{"message":"panic: reset exploded","code":"EXECUTION_ERROR"}}`},
		{`{"type":"state"}`, `{"type":"error","data":{"message":"no state","code":"EXECUTION_ERROR"}}`},
		{`{"type":"step","data":{}}`, `{"type":"error","data":{"message":"observation fields must not hold \"reward\"","code":"EXECUTION_ERROR"}}`},
		{`{"type":"mcp","data":{"jsonrpc":"2.0","id":1,"method":"tools/list"}}`, `{"type":"mcp","data":{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"Environment does not support MCP","data":null}}}`},
	} {
		require.NoError(t, conn.Write(ctx, websocket.MessageText, []byte(tt.frame)))
		_, got, err := conn.Read(ctx)
		require.NoError(t, err)
		assert.JSONEq(t, tt.want, string(got), tt.frame)
	}
	code, body, _ := post(t, base+"/reset", `{}`)
	assert.Equal(t, 500, code)
	assert.Equal(t, "Internal Server Error", body)
}

func TestNewRejectsBadEnvs(t *testing.T) {
	okNew := func(context.Context) (openenvserver.Instance, error) { return panicky{}, nil }
	tests := []struct {
		env  *openenvserver.Env
		opts openenvserver.Options
		err  string
	}{
		{nil, openenvserver.Options{}, "no environment"},
		{&openenvserver.Env{New: okNew, MCP: true}, openenvserver.Options{}, "env has no Name"},
		{&openenvserver.Env{Name: "x", MCP: true}, openenvserver.Options{}, "no New factory"},
		{&openenvserver.Env{Name: "x", New: okNew}, openenvserver.Options{}, "declares no Action fields"},
		{&openenvserver.Env{Name: "x", New: okNew, MCP: true}, openenvserver.Options{MaxSessions: 2}, "does not support concurrent sessions"},
		{&openenvserver.Env{Name: "x", New: okNew, ConcurrentSessions: true, Action: []openenvserver.Field{{Name: "metadata", Type: openenvserver.Object}}}, openenvserver.Options{}, "reserved"},
	}
	for _, tt := range tests {
		_, err := openenvserver.New(tt.opts, tt.env)
		require.ErrorContains(t, err, tt.err)
	}
	srv, err := openenvserver.New(openenvserver.Options{MaxSessions: 1}, &openenvserver.Env{Name: "x", New: okNew, MCP: true})
	require.NoError(t, err, "one session needs no concurrency support")
	require.NoError(t, srv.Shutdown(context.Background()))
}

type slowStep struct {
	openenvserver.GymInstance
	delay time.Duration
}

func (s slowStep) Step(ctx context.Context, a json.RawMessage) (openenvserver.Observation, error) {
	time.Sleep(s.delay)
	return s.GymInstance.Step(ctx, a)
}

// TestReaperSkipsBusySessions: a step longer than the idle timeout is not
// idleness; the session is reaped only once it is idle.
func TestReaperSkipsBusySessions(t *testing.T) {
	env := envs.Guess()
	inner := env.New
	env.New = func(ctx context.Context) (openenvserver.Instance, error) {
		inst, err := inner(ctx)
		return slowStep{inst.(openenvserver.GymInstance), 300 * time.Millisecond}, err
	}
	base, srv := serve(t, env, openenvserver.Options{IdleTimeout: 100 * time.Millisecond, ReapInterval: 10 * time.Millisecond})
	conn := dialWS(t, base, "/ws")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, frame := range []string{`{"type":"reset","data":{"target":3}}`, `{"type":"step","data":{"guess":3}}`} {
		require.NoError(t, conn.Write(ctx, websocket.MessageText, []byte(frame)))
		_, got, err := conn.Read(ctx)
		require.NoError(t, err)
		assert.Contains(t, string(got), `"type":"observation"`)
	}
	assert.Equal(t, int64(0), srv.Stats().Reaped)
	_, _, err := conn.Read(ctx)
	assert.Equal(t, websocket.StatusNormalClosure, websocket.CloseStatus(err), "reaped once idle")
	assert.Equal(t, int64(1), srv.Stats().Reaped)
}

// OpenEnv's `openenv validate --url` reads /openapi.json: info.version
// picks the API profile and the paths show simulation mode. Without it the
// real client's validation failed on every kit server.
func TestOpenAPIForValidate(t *testing.T) {
	base, _ := serve(t, envs.Guess(), openenvserver.Options{MaxSessions: 1})
	resp, err := http.Get(base + "/openapi.json")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var doc struct {
		Info struct {
			Version string `json:"version"`
		} `json:"info"`
		Paths map[string]map[string]any `json:"paths"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&doc))
	assert.Equal(t, "1.0.0", doc.Info.Version)
	for path, method := range map[string]string{"/reset": "post", "/step": "post", "/state": "get", "/mcp": "post"} {
		assert.Contains(t, doc.Paths[path], method, path)
	}
}
