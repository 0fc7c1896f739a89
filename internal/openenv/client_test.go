package openenv_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/openenv"
	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
)

func TestGuessEpisodeOverWS(t *testing.T) {
	ctx := context.Background()
	k := serveKit(t, envs.Guess(), openenvserver.Options{})
	c := newClient(t, k.url, fastOptions())
	s, obs, err := c.Start(ctx, map[string]any{"target": 42, "episode_id": "g-1"})
	require.NoError(t, err)
	assert.JSONEq(t, `{"hint":"start","guesses_left":6,"last_guess":null,"message":"Guess a number between 1 and 100."}`, string(obs.Observation))
	require.NotNil(t, obs.Reward)
	assert.Equal(t, 0.0, *obs.Reward)
	assert.False(t, obs.Done)

	r, err := s.Step(ctx, map[string]int{"guess": 50})
	require.NoError(t, err)
	assert.JSONEq(t, `{"hint":"lower","guesses_left":5,"last_guess":50,"message":"Go lower."}`, string(r.Observation))

	// A rejected action keeps the socket and carries the pydantic issues.
	_, err = s.Step(ctx, json.RawMessage(`{"guess":0}`))
	var se *openenv.ServerError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, openenv.CodeValidationError, se.Code)
	require.Len(t, se.Errors, 1)
	assert.Equal(t, "greater_than_equal", se.Errors[0].Type)
	assert.Equal(t, []any{"guess"}, se.Errors[0].Loc)
	assert.False(t, openenv.IsInfrastructure(err), "the model's fault")
	assert.NoError(t, s.Err())

	r, err = s.Step(ctx, map[string]int{"guess": 42})
	require.NoError(t, err)
	assert.Equal(t, 1.0, *r.Reward)
	assert.True(t, r.Done)

	_, err = s.Step(ctx, map[string]int{"guess": 42})
	require.ErrorAs(t, err, &se)
	assert.Equal(t, openenv.CodeExecutionError, se.Code)
	assert.Equal(t, "episode is over; call reset", se.Message)
	assert.EqualError(t, err, "openenv server error: episode is over; call reset (code: EXECUTION_ERROR)")

	st, err := s.State(ctx)
	require.NoError(t, err)
	assert.JSONEq(t, `{"episode_id":"g-1","step_count":2,"max_guesses":6,"guesses":[50,42],"solved":true}`, string(st))
	assert.Equal(t, int64(1), k.srv.Stats().Live)
	require.NoError(t, s.Close(ctx))
	require.NoError(t, s.Close(ctx), "idempotent")
	require.Eventually(t, func() bool { return k.srv.Stats().Live == 0 }, 5*time.Second, 10*time.Millisecond)
	_, err = s.Step(ctx, map[string]int{"guess": 1})
	require.ErrorIs(t, err, openenv.ErrSessionClosed)
}

// TestErrorCodes sends every kind of bad frame: the first four keep the
// socket, SESSION_ERROR ends it.
func TestErrorCodes(t *testing.T) {
	ctx := context.Background()
	k := serveKit(t, envs.Guess(), openenvserver.Options{})
	c := newClient(t, k.url, fastOptions())
	s, err := c.Open(ctx)
	require.NoError(t, err)
	defer s.Close(ctx)
	tests := []struct {
		frame string
		code  openenv.ErrorCode
		msg   string
	}{
		{`not json`, openenv.CodeInvalidJSON, "Invalid JSON: Expecting value: line 1 column 1 (char 0)"},
		{`{"type":"bogus"}`, openenv.CodeUnknownType, "Unknown message type: bogus"},
		{`{"type":"close","data":{}}`, openenv.CodeValidationError, "Invalid message"},
		{`{"type":"step"}`, openenv.CodeValidationError, "Invalid message"},
		{`{"type":"step","data":{"guess":5}}`, openenv.CodeExecutionError, "call reset before step"},
		{`{"type":"reset","data":{"target":101}}`, openenv.CodeExecutionError, "target must be between 1 and 100, got 101"},
		{`{"type":"reset","data":{"max_guesses":0}}`, openenv.CodeExecutionError, "max_guesses must be at least 1, got 0"},
	}
	for _, tt := range tests {
		_, err := s.SendRaw(ctx, []byte(tt.frame))
		var se *openenv.ServerError
		require.ErrorAs(t, err, &se, tt.frame)
		assert.Equal(t, tt.code, se.Code, tt.frame)
		assert.Equal(t, tt.msg, se.Message, tt.frame)
		assert.False(t, tt.code.EndsSession())
		require.NoError(t, s.Err(), "%s keeps the socket", tt.frame)
	}
	// The socket still works after all of them.
	_, err = s.Reset(ctx, map[string]int{"seed": 7})
	require.NoError(t, err)

	_, err = s.SendRaw(ctx, []byte(`[1,2]`))
	var se *openenv.ServerError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, openenv.CodeSessionError, se.Code)
	assert.Equal(t, "'list' object has no attribute 'get'", se.Message)
	assert.True(t, openenv.IsInfrastructure(err))
	require.Error(t, s.Err(), "SESSION_ERROR ends the session")
	_, err = s.State(ctx)
	require.ErrorAs(t, err, &se, "later calls return the fatal error")
	require.Eventually(t, func() bool { return k.srv.Stats().Live == 0 }, 5*time.Second, 10*time.Millisecond)
}

func TestFactoryError(t *testing.T) {
	ctx := context.Background()
	env := envs.Guess()
	env.New = func(context.Context) (openenvserver.Instance, error) { return nil, errors.New("no GPU") }
	k := serveKit(t, env, openenvserver.Options{})
	c := newClient(t, k.url, fastOptions())
	_, _, err := c.Start(ctx, nil)
	var se *openenv.ServerError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, openenv.CodeFactoryError, se.Code)
	assert.Equal(t, "GuessEnvironment", se.FactoryName)
	assert.Equal(t, "Failed to create environment using factory 'GuessEnvironment': no GPU", se.Message)
	assert.True(t, openenv.IsInfrastructure(err))
	assert.Equal(t, int64(0), k.srv.Stats().Live)
}

// TestCapacity: the limit is shared by /ws, the /mcp socket and HTTP
// sessions; refusals are typed; stateless HTTP works when full; Start
// waits for a free slot.
func TestCapacity(t *testing.T) {
	ctx := context.Background()
	k := serveKit(t, envs.MCPEcho(), openenvserver.Options{MaxSessions: 3})
	c := newClient(t, k.url, fastOptions())
	s1, _, err := c.Start(ctx, nil)
	require.NoError(t, err)
	m, err := c.DialMCP(ctx)
	require.NoError(t, err)
	_, err = m.Call(ctx, "tools/list", nil)
	require.NoError(t, err)
	sid, err := c.CreateMCPSession(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(3), k.srv.Stats().Live)

	// /ws: CAPACITY_REACHED with the counts, socket closed. The refusal
	// and the close come before the client writes: the queued frame is
	// still the answer, not a bare "connection closed".
	s, err := c.Open(ctx)
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond)
	_, err = s.Reset(ctx, nil)
	var se *openenv.ServerError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, openenv.CodeCapacityReached, se.Code)
	assert.Equal(t, 3, se.ActiveSessions)
	assert.Equal(t, 3, se.MaxSessions)
	assert.True(t, openenv.IsCapacity(err))
	assert.True(t, openenv.IsInfrastructure(err))
	require.Error(t, s.Err())
	require.NoError(t, s.Close(ctx))

	// The /mcp socket: -32000, sent unsolicited.
	m2, err := c.DialMCP(ctx)
	require.NoError(t, err)
	_, err = m2.Call(ctx, "tools/list", nil)
	var re *openenv.RPCError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, openenv.RPCCapacity, re.Code)
	assert.JSONEq(t, `{"active_sessions":3,"max_sessions":3}`, string(re.Data))
	assert.True(t, openenv.IsCapacity(err))
	require.NoError(t, m2.Close(ctx))

	// HTTP session/create: -32000.
	_, err = c.CreateMCPSession(ctx)
	require.ErrorAs(t, err, &re)
	assert.Equal(t, openenv.RPCCapacity, re.Code)

	// Stateless HTTP still works.
	res, err := c.MCP(ctx, "tools/call", map[string]any{"name": "echo_message", "arguments": map[string]string{"message": "full"}})
	require.NoError(t, err)
	assert.Contains(t, string(res), `"data":"full"`)

	// Start retries the refusal and gets the slot s1 frees.
	type started struct {
		s   *openenv.Session
		err error
	}
	got := make(chan started, 1)
	go func() {
		s, _, err := c.Start(ctx, nil)
		got <- started{s, err}
	}()
	require.Eventually(t, func() bool { return k.srv.Stats().Refused >= 4 }, 5*time.Second, 5*time.Millisecond, "Start keeps retrying")
	require.NoError(t, s1.Close(ctx))
	r := <-got
	require.NoError(t, r.err)
	require.NoError(t, r.s.Close(ctx))
	require.NoError(t, m.Close(ctx))
	require.NoError(t, c.CloseMCPSession(ctx, sid))
	require.Eventually(t, func() bool { return k.srv.Stats().Live == 0 }, 5*time.Second, 10*time.Millisecond)
}

// TestCapacityOneManyRollouts: capacity 1, 8 concurrent episodes; all
// finish, none is lost.
func TestCapacityOneManyRollouts(t *testing.T) {
	ctx := context.Background()
	env := envs.Guess()
	env.ConcurrentSessions = false
	k := serveKit(t, env, openenvserver.Options{MaxSessions: 1})
	c := newClient(t, k.url, fastOptions())
	var wg sync.WaitGroup
	rewards := make([]float64, 8)
	errs := make([]error, 8)
	for i := range 8 {
		wg.Go(func() {
			s, _, err := c.Start(ctx, map[string]int{"target": i + 1})
			if err != nil {
				errs[i] = err
				return
			}
			defer s.Close(ctx)
			r, err := s.Step(ctx, map[string]int{"guess": i + 1})
			if err != nil {
				errs[i] = err
				return
			}
			rewards[i] = *r.Reward
		})
	}
	wg.Wait()
	for i := range 8 {
		require.NoError(t, errs[i], "episode %d", i)
		assert.Equal(t, 1.0, rewards[i], "episode %d", i)
	}
	assert.Equal(t, int64(8), k.srv.Stats().Created)
}

func TestCloseSemantics(t *testing.T) {
	ctx := context.Background()
	k := serveKit(t, envs.Guess(), openenvserver.Options{})
	// Raw: close gets no reply, the server closes with 1000.
	conn, _, err := websocket.Dial(ctx, "ws"+k.url[4:]+"/ws", nil)
	require.NoError(t, err)
	defer conn.CloseNow()
	require.NoError(t, conn.Write(ctx, websocket.MessageText, []byte(`{"type":"close"}`)))
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, frame, err := conn.Read(rctx)
	require.Error(t, err, "no reply to close, got %s", frame)
	assert.Equal(t, websocket.StatusNormalClosure, websocket.CloseStatus(err))

	// The client: Close returns once the server closed with 1000.
	c := newClient(t, k.url, fastOptions())
	s, _, err := c.Start(ctx, map[string]int{"seed": 1})
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, s.Close(ctx))
	assert.Less(t, time.Since(start), time.Second)
	require.Eventually(t, func() bool { return k.srv.Stats().Live == 0 }, 5*time.Second, 10*time.Millisecond)
}

func TestMCPOverWS(t *testing.T) {
	ctx := context.Background()
	k := serveKit(t, envs.MCPEcho(), openenvserver.Options{})
	c := newClient(t, k.url, fastOptions())
	s, _, err := c.Start(ctx, map[string]string{"episode_id": "e"})
	require.NoError(t, err)
	defer s.Close(ctx)

	tools, err := s.ListTools(ctx)
	require.NoError(t, err)
	require.Len(t, tools, 2)
	assert.Equal(t, "echo_message", tools[0].Name)
	assert.JSONEq(t, `{"additionalProperties":false,"properties":{"message":{"type":"string"}},"required":["message"],"type":"object"}`, string(tools[0].InputSchema))

	call, err := s.CallTool(ctx, "echo_with_length", json.RawMessage(`{"message":"héllo"}`))
	require.NoError(t, err)
	require.Nil(t, call.Error)
	assert.JSONEq(t, `{"message":"héllo","length":5}`, string(call.Result.Data))
	assert.Equal(t, `{"message":"héllo","length":5}`, call.Text())
	assert.Nil(t, call.Reward)

	call, err = s.CallTool(ctx, "nope", nil)
	require.NoError(t, err, "a tool failure is an observation")
	assert.Equal(t, &openenv.ToolFailure{Type: openenv.ToolNotFound, Message: "Unknown tool: 'nope'"}, call.Error)
	assert.Equal(t, "Tool 'nope' failed: Unknown tool: 'nope' (type: tool_not_found)", call.Text())
	call, err = s.CallTool(ctx, "echo_message", json.RawMessage(`{}`))
	require.NoError(t, err)
	assert.Equal(t, openenv.ToolInvalidArgs, call.Error.Type)

	// JSON-RPC inside {"type":"mcp"} frames.
	res, err := s.MCP(ctx, "tools/list", nil)
	require.NoError(t, err)
	var listed struct{ Tools []openenv.Tool }
	require.NoError(t, json.Unmarshal(res, &listed))
	require.Len(t, listed.Tools, 2)
	assert.Equal(t, tools[1].Name, listed.Tools[1].Name)
	assert.JSONEq(t, string(tools[1].InputSchema), string(listed.Tools[1].InputSchema), "camelCase inputSchema decodes")
	res, err = s.MCP(ctx, "tools/call", map[string]any{"name": "echo_message", "arguments": map[string]string{"message": "m"}})
	require.NoError(t, err)
	var tr openenv.ToolResult
	require.NoError(t, json.Unmarshal(res, &tr))
	assert.Equal(t, "m", tr.Text())

	rpcTests := []struct {
		method string
		params any
		code   int
		msg    string
	}{
		{"nope/x", nil, openenv.RPCMethodNotFound, "Method not found: nope/x"},
		{"tools/call", map[string]any{}, openenv.RPCInvalidParams, "Missing required parameter: name"},
		{"tools/call", map[string]any{"name": "nope"}, openenv.RPCInternalError, "Unknown tool: 'nope'"},
		{"tools/call", map[string]any{"name": "echo_message", "session_id": "missing"}, openenv.RPCInvalidParams, "Session not found: missing"},
		{"openenv/session/close", map[string]any{}, openenv.RPCInvalidParams, "Missing required parameter: session_id"},
	}
	for _, tt := range rpcTests {
		_, err := s.MCP(ctx, tt.method, tt.params)
		var re *openenv.RPCError
		require.ErrorAs(t, err, &re, tt.method)
		assert.Equal(t, tt.code, re.Code, tt.method)
		assert.Equal(t, tt.msg, re.Message, tt.method)
		require.NoError(t, s.Err(), "JSON-RPC errors keep the socket")
	}
	// session/create on a socket is the socket's own session, which cannot
	// be closed that way.
	res, err = s.MCP(ctx, "openenv/session/create", nil)
	require.NoError(t, err)
	var own struct {
		SessionID string `json:"session_id"`
	}
	require.NoError(t, json.Unmarshal(res, &own))
	_, err = s.MCP(ctx, "openenv/session/close", map[string]string{"session_id": own.SessionID})
	var re *openenv.RPCError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, openenv.RPCInvalidRequest, re.Code)

	// Every step counts, list_tools included; JSON-RPC tool calls reach the
	// same instance (4 steps, 3 JSON-RPC tool calls).
	st, err := s.State(ctx)
	require.NoError(t, err)
	assert.JSONEq(t, `{"episode_id":"e","step_count":7}`, string(st))
}

func TestMCPOverHTTPAndSocket(t *testing.T) {
	ctx := context.Background()
	k := serveKit(t, envs.MCPEcho(), openenvserver.Options{})
	c := newClient(t, k.url, fastOptions())
	sid, err := c.CreateMCPSession(ctx)
	require.NoError(t, err)
	for range 2 {
		_, err := c.MCP(ctx, "tools/call", map[string]any{"name": "echo_message", "arguments": map[string]string{"message": "x"}, "session_id": sid})
		require.NoError(t, err)
	}
	_, err = c.MCP(ctx, "tools/list", map[string]any{"session_id": sid})
	require.NoError(t, err)
	require.NoError(t, c.CloseMCPSession(ctx, sid))
	err = c.CloseMCPSession(ctx, sid)
	var re *openenv.RPCError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, openenv.RPCInvalidParams, re.Code)

	m, err := c.DialMCP(ctx)
	require.NoError(t, err)
	res, err := m.Call(ctx, "tools/call", map[string]any{"name": "echo_with_length", "arguments": map[string]string{"message": "abc"}})
	require.NoError(t, err)
	var tr openenv.ToolResult
	require.NoError(t, json.Unmarshal(res, &tr))
	assert.JSONEq(t, `{"message":"abc","length":3}`, string(tr.Data))
	_, err = m.Call(ctx, "tools/call", map[string]any{"name": "nope"})
	require.ErrorAs(t, err, &re)
	assert.Equal(t, openenv.RPCInternalError, re.Code)
	_, err = m.Call(ctx, "tools/list", nil)
	require.NoError(t, err, "a tool error keeps the /mcp socket")
	require.NoError(t, m.Close(ctx))
	require.Eventually(t, func() bool { return k.srv.Stats().Live == 0 }, 5*time.Second, 10*time.Millisecond)

	// A Gym-style env has no MCP.
	g := serveKit(t, envs.Guess(), openenvserver.Options{})
	_, err = newClient(t, g.url, fastOptions()).MCP(ctx, "tools/list", nil)
	require.ErrorAs(t, err, &re)
	assert.Equal(t, "Environment does not support MCP", re.Message)
}

func TestConcurrentSessionsAreIsolated(t *testing.T) {
	ctx := context.Background()
	k := serveKit(t, envs.Guess(), openenvserver.Options{})
	c := newClient(t, k.url, fastOptions())
	a, _, err := c.Start(ctx, map[string]any{"target": 10, "episode_id": "a"})
	require.NoError(t, err)
	defer a.Close(ctx)
	b, _, err := c.Start(ctx, map[string]any{"target": 90, "episode_id": "b", "max_guesses": 2})
	require.NoError(t, err)
	defer b.Close(ctx)
	var wg sync.WaitGroup
	hints := make([][]string, 2)
	for i, s := range []*openenv.Session{a, b} {
		wg.Go(func() {
			for _, g := range []int{50, 10} {
				r, err := s.Step(ctx, map[string]int{"guess": g})
				if !assert.NoError(t, err) {
					return
				}
				var obs struct{ Hint string }
				_ = json.Unmarshal(r.Observation, &obs)
				hints[i] = append(hints[i], obs.Hint)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, []string{"lower", "correct"}, hints[0])
	assert.Equal(t, []string{"higher", "higher"}, hints[1])
	sa, err := a.State(ctx)
	require.NoError(t, err)
	assert.JSONEq(t, `{"episode_id":"a","step_count":2,"max_guesses":6,"guesses":[50,10],"solved":true}`, string(sa))
	sb, err := b.State(ctx)
	require.NoError(t, err)
	assert.JSONEq(t, `{"episode_id":"b","step_count":2,"max_guesses":2,"guesses":[50,10],"solved":false}`, string(sb))
}

// TestServerKilledMidEpisode: the next call fails with a typed
// infrastructure error, the socket is closed and no goroutine leaks.
func TestServerKilledMidEpisode(t *testing.T) {
	ctx := context.Background()
	base := runtime.NumGoroutine()
	// Registered first, so it runs after the kit's own cleanup.
	t.Cleanup(func() { settleGoroutines(t, base) })
	func() {
		k := serveKit(t, envs.Guess(), openenvserver.Options{})
		c := newClient(t, k.url, fastOptions())
		s, _, err := c.Start(ctx, map[string]int{"target": 5})
		require.NoError(t, err)
		k.kill()
		_, err = s.Step(ctx, map[string]int{"guess": 1})
		var ce *openenv.ConnectionError
		require.ErrorAs(t, err, &ce)
		assert.True(t, openenv.IsInfrastructure(err))
		require.Error(t, s.Err())
		start := time.Now()
		require.NoError(t, s.Close(ctx), "the failure was already reported")
		assert.Less(t, time.Since(start), time.Second)
		_, err = s.Step(ctx, map[string]int{"guess": 1})
		require.ErrorAs(t, err, &ce)
		c.CloseIdleConnections()
	}()
}

// TestKilledBeforeReply: the server dies while a step is in flight.
func TestKilledBeforeReply(t *testing.T) {
	ctx := context.Background()
	env := envs.Guess()
	stepping := make(chan struct{})
	release := make(chan struct{})
	inner := env.New
	env.New = func(ctx context.Context) (openenvserver.Instance, error) {
		inst, err := inner(ctx)
		return &blockingStep{GymInstance: inst.(openenvserver.GymInstance), stepping: stepping, release: release}, err
	}
	k := serveKit(t, env, openenvserver.Options{})
	c := newClient(t, k.url, fastOptions())
	s, _, err := c.Start(ctx, map[string]int{"target": 5})
	require.NoError(t, err)
	go func() {
		<-stepping
		k.kill()
		close(release)
	}()
	_, err = s.Step(ctx, map[string]int{"guess": 1})
	var ce *openenv.ConnectionError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, -1, ce.CloseCode, "no close frame from a dead server")
	require.NoError(t, s.Close(ctx))
}

type blockingStep struct {
	openenvserver.GymInstance
	stepping, release chan struct{}
}

func (b *blockingStep) Step(ctx context.Context, action json.RawMessage) (openenvserver.Observation, error) {
	close(b.stepping)
	<-b.release
	return b.GymInstance.Step(ctx, action)
}

// TestServerNeverAnswers: a socket that never replies, a handshake that
// never completes, an HTTP request that never returns: every one ends at
// its deadline with *TimeoutError.
func TestServerNeverAnswers(t *testing.T) {
	ctx := context.Background()
	silent := make(chan struct{})
	t.Cleanup(func() { close(silent) })
	mux := http.NewServeMux()
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer conn.CloseNow()
		go func() { _, _, _ = conn.Read(context.Background()) }() // read, never answer
		<-silent
	})
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-silent:
		case <-r.Context().Done():
		}
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := &http.Server{Handler: mux}
	go func() { _ = hs.Serve(l) }()
	t.Cleanup(func() { _ = hs.Close() })
	url := "http://" + l.Addr().String()

	opts := fastOptions()
	opts.ReplyTimeout = 200 * time.Millisecond
	opts.RequestTimeout = 200 * time.Millisecond
	c := newClient(t, url, opts)
	s, err := c.Open(ctx)
	require.NoError(t, err)
	start := time.Now()
	_, err = s.Reset(ctx, nil)
	var te *openenv.TimeoutError
	require.ErrorAs(t, err, &te)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 2*time.Second)
	assert.True(t, openenv.IsInfrastructure(err))
	require.Error(t, s.Err(), "replies would no longer line up: the session is over")
	require.NoError(t, s.Close(ctx))

	// Close does not wait for a call's reply deadline: it cuts the socket.
	slow := fastOptions()
	slow.ReplyTimeout = time.Minute
	s, err = newClient(t, url, slow).Open(ctx)
	require.NoError(t, err)
	resetErr := make(chan error, 1)
	go func() {
		_, err := s.Reset(ctx, nil)
		resetErr <- err
	}()
	time.Sleep(50 * time.Millisecond)
	start = time.Now()
	// Nil when the Reset was in flight (the usual case); if the machine
	// was too slow to start it, Close ran first and reports the silent
	// server after CloseTimeout, and the Reset finds the session closed.
	closeErr := s.Close(ctx)
	err = <-resetErr
	var ce *openenv.ConnectionError
	if closeErr == nil {
		require.ErrorAs(t, err, &ce)
		assert.Less(t, time.Since(start), time.Second)
	} else {
		require.ErrorIs(t, err, openenv.ErrSessionClosed)
	}

	err = c.Health(ctx)
	require.ErrorAs(t, err, &te)

	// A TCP listener that accepts and never speaks HTTP.
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = mute.Close() })
	go func() {
		for {
			conn, err := mute.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = conn.Close() })
		}
	}()
	opts.OpenTimeout = 200 * time.Millisecond
	_, err = newClient(t, "http://"+mute.Addr().String(), opts).Open(ctx)
	require.ErrorAs(t, err, &te)
}

func TestKeepAliveAndReaping(t *testing.T) {
	ctx := context.Background()
	// Pings both ways keep an idle socket open.
	k := serveKit(t, envs.Guess(), openenvserver.Options{PingInterval: 20 * time.Millisecond})
	opts := fastOptions()
	opts.KeepAlive = 20 * time.Millisecond
	c := newClient(t, k.url, opts)
	s, _, err := c.Start(ctx, map[string]int{"target": 3})
	require.NoError(t, err)
	time.Sleep(200 * time.Millisecond)
	_, err = s.Step(ctx, map[string]int{"guess": 3})
	require.NoError(t, err)
	require.NoError(t, s.Close(ctx))

	// Idle sessions of every kind are reaped.
	r := serveKit(t, envs.MCPEcho(), openenvserver.Options{IdleTimeout: 100 * time.Millisecond, ReapInterval: 10 * time.Millisecond})
	c = newClient(t, r.url, fastOptions())
	s, _, err = c.Start(ctx, nil)
	require.NoError(t, err)
	sid, err := c.CreateMCPSession(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return r.srv.Stats().Reaped == 2 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, int64(0), r.srv.Stats().Live)
	_, err = s.ListTools(ctx)
	var ce *openenv.ConnectionError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, int(websocket.StatusNormalClosure), ce.CloseCode)
	require.NoError(t, s.Close(ctx))
	_, err = c.MCP(ctx, "tools/list", map[string]string{"session_id": sid})
	var re *openenv.RPCError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, openenv.RPCInvalidParams, re.Code)
}

func TestProbe(t *testing.T) {
	ctx := context.Background()
	guess := serveKit(t, envs.Guess(), openenvserver.Options{})
	info, err := openenv.Probe(ctx, guess.url+"/", fastOptions())
	require.NoError(t, err)
	assert.False(t, info.MCP)
	assert.Equal(t, guess.url, info.URL)
	assert.Contains(t, string(info.Schema.Action), `"guess"`)

	echo := serveKit(t, envs.MCPEcho(), openenvserver.Options{})
	info, err = openenv.Probe(ctx, echo.url, fastOptions())
	require.NoError(t, err)
	assert.True(t, info.MCP)

	// An ORS server is not OpenEnv.
	orsURL, _, stop, err := envs.ServeLocal(ctx, "echo", orsOptions())
	require.NoError(t, err)
	t.Cleanup(func() { _ = stop(context.Background()) })
	_, err = openenv.Probe(ctx, orsURL, fastOptions())
	var ne *openenv.NotOpenEnvError
	require.ErrorAs(t, err, &ne)
	assert.Contains(t, err.Error(), "is not an OpenEnv server: GET /health")

	// Nothing listening.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := "http://" + l.Addr().String()
	require.NoError(t, l.Close())
	_, err = openenv.Probe(ctx, dead, fastOptions())
	require.ErrorAs(t, err, &ne)
	var ce *openenv.ConnectionError
	require.ErrorAs(t, err, &ce)

	_, err = openenv.Probe(ctx, "ftp://x", fastOptions())
	require.ErrorContains(t, err, "scheme must be http or https")
}

func TestHTTPEndpoints(t *testing.T) {
	ctx := context.Background()
	k := serveKit(t, envs.MCPEcho(), openenvserver.Options{})
	c := newClient(t, k.url, fastOptions())
	require.NoError(t, c.Health(ctx))
	md, err := c.Metadata(ctx)
	require.NoError(t, err)
	assert.Equal(t, openenv.Metadata{Name: "EchoEnvironment", Description: "EchoEnvironment environment", Version: "1.0.0"}, md)
	sc, err := c.Schema(ctx)
	require.NoError(t, err)
	assert.True(t, sc.IsMCP())
	assert.Contains(t, string(sc.State), "step_count")
}

func TestNewClientURLs(t *testing.T) {
	for _, tt := range []struct{ in, want, err string }{
		{"http://h:1/", "http://h:1", ""},
		{"https://h.hf.space", "https://h.hf.space", ""},
		{"ws://h:1", "http://h:1", ""},
		{"wss://h", "https://h", ""},
		{"h:1", "", "scheme must be http or https"},
		{"http://", "", "no host"},
	} {
		c, err := openenv.NewClient(tt.in, openenv.Options{})
		if tt.err != "" {
			require.ErrorContains(t, err, tt.err, tt.in)
			continue
		}
		require.NoError(t, err, tt.in)
		assert.Equal(t, tt.want, c.BaseURL(), tt.in)
	}
}

func ExampleClient_Start() {
	ctx := context.Background()
	served, err := envs.ServeLocalProtocol(ctx, "guess", envs.ProtocolOpenEnv, envs.ServeOptions{})
	if err != nil {
		panic(err)
	}
	defer served.Stop(ctx)
	c, _ := openenv.NewClient(served.URL, openenv.Options{})
	s, _, err := c.Start(ctx, map[string]int{"target": 30, "max_guesses": 7})
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)
	lo, hi := 1, 100
	for {
		g := (lo + hi) / 2
		r, err := s.Step(ctx, map[string]int{"guess": g})
		if err != nil {
			panic(err)
		}
		var obs struct{ Hint, Message string }
		_ = json.Unmarshal(r.Observation, &obs)
		fmt.Println(g, obs.Message)
		if r.Done {
			return
		}
		if obs.Hint == "lower" {
			hi = g - 1
		} else {
			lo = g + 1
		}
	}
	// Output:
	// 50 Go lower.
	// 25 Go higher.
	// 37 Go lower.
	// 31 Go lower.
	// 28 Go higher.
	// 29 Go higher.
	// 30 You got it!
}
