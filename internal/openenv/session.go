package openenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// socket is one WebSocket with a reader goroutine, a keepalive and strict
// request/reply pairing; Session (/ws) and MCPConn (/mcp) build on it.
type socket struct {
	conn *websocket.Conn
	opts Options
	op   string // "/ws" or "/mcp", for messages

	mu     sync.Mutex // one request at a time: replies come in order
	frames chan []byte
	// stray says which frames answer no request (and their kind, for the
	// log); the reader drops and counts them. Nil keeps every frame.
	stray   func([]byte) (string, bool)
	ignored atomic.Int64
	client  *Client
	done    chan struct{} // closed when the reader stops
	err     error         // why the reader stopped; read after done
	// fatal is set (under mu) once the session is unusable.
	fatal error

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (c *Client) dial(ctx context.Context, path string, stray func([]byte) (string, bool)) (*socket, error) {
	u := c.wsEndpoint(path)
	dctx, cancel := context.WithTimeout(ctx, c.opts.OpenTimeout)
	defer cancel()
	hdr := http.Header{}
	c.authorize(hdr)
	conn, resp, err := websocket.Dial(dctx, u, &websocket.DialOptions{HTTPClient: c.http, HTTPHeader: hdr})
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close()
	}
	if err != nil {
		if dctx.Err() != nil && ctx.Err() == nil {
			return nil, &TimeoutError{Op: "open " + path, After: c.opts.OpenTimeout}
		}
		if resp != nil && (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden) {
			return nil, c.authError("GET", u, resp.StatusCode)
		}
		if resp != nil && resp.StatusCode != 0 && resp.StatusCode != 101 {
			return nil, &HTTPError{Method: "GET", URL: u, Status: resp.StatusCode, Body: err.Error()}
		}
		return nil, &ConnectionError{Op: "open " + path, CloseCode: -1, Err: err}
	}
	conn.SetReadLimit(c.opts.MaxMessageBytes)
	life, stop := context.WithCancel(context.Background())
	s := &socket{conn: conn, opts: c.opts, op: path, frames: make(chan []byte, 8), done: make(chan struct{}), cancel: stop, stray: stray, client: c}
	s.wg.Add(1)
	go s.readLoop(life)
	if c.opts.KeepAlive > 0 {
		s.wg.Add(1)
		go s.keepAlive(life)
	}
	return s, nil
}

// readLoop owns every read: replies go to frames, frames that answer no
// request are dropped here (so they never pile up between requests or pass
// for a reply), control frames (pongs, close) are handled by the library
// as a side effect.
func (s *socket) readLoop(ctx context.Context) {
	defer s.wg.Done()
	defer close(s.done)
	for {
		_, data, err := s.conn.Read(ctx)
		if err != nil {
			s.err = err
			return
		}
		if s.stray != nil {
			if kind, ok := s.stray(data); ok {
				s.ignored.Add(1)
				s.client.noteIgnored(s.op, kind)
				continue
			}
		}
		select {
		case s.frames <- data:
		case <-ctx.Done():
			s.err = ctx.Err()
			return
		}
	}
}

// keepAlive pings every KeepAlive so idle sockets survive proxies; a ping
// without a pong in KeepAlive kills the socket.
func (s *socket) keepAlive(ctx context.Context) {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.KeepAlive)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.done:
			return
		case <-t.C:
			pctx, cancel := context.WithTimeout(ctx, s.opts.KeepAlive)
			err := s.conn.Ping(pctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				_ = s.conn.CloseNow()
				return
			}
		}
	}
}

// request writes one frame and waits for its reply, under the write and
// reply deadlines and ctx. Any failure other than a server error frame
// poisons the socket.
func (s *socket) request(ctx context.Context, what string, frame []byte) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fatal != nil {
		return nil, s.fatal
	}
	wctx, cancel := context.WithTimeout(ctx, s.opts.WriteTimeout)
	err := s.conn.Write(wctx, websocket.MessageText, frame)
	timedOut := wctx.Err() != nil && ctx.Err() == nil
	cancel()
	if err != nil {
		// A server that refused us (capacity) may have sent its error and
		// closed before our write: that frame is the answer. The reader
		// ends soon after a failed write; give it a moment to queue it.
		if !timedOut && ctx.Err() == nil {
			wait := time.NewTimer(min(s.opts.ReplyTimeout, time.Second))
			select {
			case <-s.done:
			case <-wait.C:
			}
			wait.Stop()
		}
		if data, ok := s.pending(); ok {
			return data, nil
		}
		if timedOut {
			return nil, s.fail(&TimeoutError{Op: "write " + what, After: s.opts.WriteTimeout})
		}
		if ctx.Err() != nil {
			return nil, s.fail(fmt.Errorf("openenv %s: %w", what, ctx.Err()))
		}
		select {
		case <-s.done: // the reader saw why: a close frame carries a status
			err = s.err
		default:
		}
		return nil, s.fail(s.connErr(what, err))
	}
	timer := time.NewTimer(s.opts.ReplyTimeout)
	defer timer.Stop()
	select {
	case data := <-s.frames:
		return data, nil
	case <-s.done:
		if data, ok := s.pending(); ok {
			return data, nil
		}
		return nil, s.fail(s.connErr(what, s.err))
	case <-timer.C:
		return nil, s.fail(&TimeoutError{Op: what, After: s.opts.ReplyTimeout})
	case <-ctx.Done():
		return nil, s.fail(fmt.Errorf("openenv %s: %w", what, ctx.Err()))
	}
}

func (s *socket) pending() ([]byte, bool) {
	select {
	case data := <-s.frames:
		return data, true
	default:
		return nil, false
	}
}

func (s *socket) connErr(what string, err error) error {
	if err == nil {
		err = errors.New("connection closed")
	}
	return &ConnectionError{Op: what + " on " + s.op, CloseCode: int(websocket.CloseStatus(err)), Err: err}
}

// fail marks the socket unusable and closes it at once (mu held).
func (s *socket) fail(err error) error {
	s.fatal = err
	_ = s.conn.CloseNow()
	return err
}

// close sends the protocol's goodbye (if any), waits up to CloseTimeout
// for the server to close, then closes the socket and stops the
// goroutines. It returns the server's close status, or -1.
func (s *socket) close(ctx context.Context, goodbye []byte) (int, error) {
	if !s.mu.TryLock() {
		// A call is waiting for its reply: cut the socket so it returns
		// now rather than at its deadline.
		_ = s.conn.CloseNow()
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	defer s.wg.Wait()
	defer s.cancel()
	if s.fatal != nil {
		// Closed already, or failed: the call that hit the failure
		// reported it; only release the socket.
		_ = s.conn.CloseNow()
		return -1, nil
	}
	s.fatal = ErrSessionClosed
	ctx, cancel := context.WithTimeout(ctx, s.opts.CloseTimeout)
	defer cancel()
	var werr error
	if goodbye != nil {
		werr = s.conn.Write(ctx, websocket.MessageText, goodbye)
		if werr == nil {
			// The server answers close with its own close frame (1000).
			select {
			case <-s.done:
			case <-ctx.Done():
			}
		}
	}
	code := -1
	select {
	case <-s.done:
		code = int(websocket.CloseStatus(s.err))
	default:
	}
	if code < 0 {
		_ = s.conn.Close(websocket.StatusNormalClosure, "")
	}
	_ = s.conn.CloseNow()
	if goodbye != nil && code != int(websocket.StatusNormalClosure) {
		reason := werr
		if reason == nil {
			reason = s.err
		}
		if reason == nil {
			reason = errors.New("the server did not close the socket")
		}
		return code, &ConnectionError{Op: "close " + s.op, CloseCode: code, Err: reason}
	}
	return code, nil
}

// Session is one /ws connection: one env instance on the server, one
// episode (or several resets) for the client. Calls are serialised; a
// Session is safe for concurrent use but replies come one at a time.
type Session struct {
	sock   *socket
	client *Client
}

// Open dials /ws. A server at capacity accepts the socket and then refuses
// it with CAPACITY_REACHED, which the first call returns; Start retries it.
func (c *Client) Open(ctx context.Context) (*Session, error) {
	sock, err := c.dial(ctx, "/ws", strayWSFrame)
	if err != nil {
		return nil, err
	}
	return &Session{sock: sock, client: c}, nil
}

// Start opens a session and resets it with kwargs, retrying capacity
// refusals with backoff for up to CapacityWait. It returns the reset
// observation.
func (c *Client) Start(ctx context.Context, kwargs any) (*Session, StepResult, error) {
	bo := c.opts.NewBackoff()
	bo.Name = "openenv capacity"
	bo.Logger = c.log
	deadline := time.Now().Add(c.opts.CapacityWait)
	for {
		s, err := c.Open(ctx)
		if err != nil {
			return nil, StepResult{}, err
		}
		obs, err := s.Reset(ctx, kwargs)
		if err == nil {
			return s, obs, nil
		}
		_ = s.Close(ctx)
		if !IsCapacity(err) || time.Now().After(deadline) {
			return nil, StepResult{}, err
		}
		c.noteCapacity(err)
		c.log.Debug().Err(err).Int("attempt", bo.Attempts()+1).Msg("openenv server at capacity; retrying")
		if werr := bo.Wait(ctx); werr != nil {
			return nil, StepResult{}, fmt.Errorf("wait for openenv capacity: %w (last: %w)", werr, err)
		}
	}
}

// SendRaw sends one frame as given (any bytes) and returns the reply, for
// debugging and protocol tests. A fatal error frame closes the session.
func (s *Session) SendRaw(ctx context.Context, frame []byte) (Frame, error) {
	raw, err := s.sock.request(ctx, "raw frame", frame)
	if err != nil {
		return Frame{}, err
	}
	return s.parseReply(raw)
}

func (s *Session) parseReply(raw []byte) (Frame, error) {
	f, err := ParseFrame(raw)
	if err != nil {
		var se *ServerError
		if !errors.As(err, &se) || se.Code.EndsSession() {
			s.sock.mu.Lock()
			if s.sock.fatal == nil {
				_ = s.sock.fail(err)
			}
			s.sock.mu.Unlock()
		}
		return Frame{}, err
	}
	return f, nil
}

// call sends {"type":typ,"data":data} (no data when data is nil) and
// returns the reply frame; an error frame becomes *ServerError, and a fatal
// one closes the socket.
func (s *Session) call(ctx context.Context, typ string, data any) (Frame, error) {
	msg := map[string]any{"type": typ}
	if data != nil {
		msg["data"] = data
	}
	frame, err := json.Marshal(msg)
	if err != nil {
		return Frame{}, fmt.Errorf("encode %s frame: %w", typ, err)
	}
	raw, err := s.sock.request(ctx, typ, frame)
	if err != nil {
		return Frame{}, err
	}
	return s.parseReply(raw)
}

func (s *Session) expect(f Frame, want string) error {
	if f.Type != want {
		return &ProtocolError{Detail: fmt.Sprintf("got a %s frame, want %s", f.Type, want), Frame: clip(f.Data)}
	}
	return nil
}

// Reset starts an episode. kwargs (an object, or nil) go as the frame's
// data: seed, episode_id and env-specific keys.
func (s *Session) Reset(ctx context.Context, kwargs any) (StepResult, error) {
	f, err := s.call(ctx, FrameReset, kwargs)
	if err != nil {
		return StepResult{}, err
	}
	if err := s.expect(f, FrameObservation); err != nil {
		return StepResult{}, err
	}
	return decodeStep(f.Data)
}

// Step sends one action (a JSON object).
func (s *Session) Step(ctx context.Context, action any) (StepResult, error) {
	if action == nil {
		action = struct{}{}
	}
	f, err := s.call(ctx, FrameStep, action)
	if err != nil {
		return StepResult{}, err
	}
	if err := s.expect(f, FrameObservation); err != nil {
		return StepResult{}, err
	}
	return decodeStep(f.Data)
}

// State returns the env's full state (subclass fields included).
func (s *Session) State(ctx context.Context) (json.RawMessage, error) {
	f, err := s.call(ctx, FrameState, nil)
	if err != nil {
		return nil, err
	}
	if err := s.expect(f, FrameState); err != nil {
		return nil, err
	}
	return f.Data, nil
}

// ListTools is the MCP list_tools step (it counts as a step on envs that
// count them).
func (s *Session) ListTools(ctx context.Context) ([]Tool, error) {
	r, err := s.Step(ctx, map[string]string{"type": "list_tools"})
	if err != nil {
		return nil, err
	}
	var obs struct {
		Tools []Tool `json:"tools"`
	}
	if err := json.Unmarshal(r.Observation, &obs); err != nil {
		return nil, &ProtocolError{Detail: "list_tools observation: " + err.Error(), Frame: clip(r.Observation)}
	}
	return obs.Tools, nil
}

// CallTool is the MCP call_tool step. A tool failure is not an error: it
// comes back in ToolCall.Error.
func (s *Session) CallTool(ctx context.Context, name string, args json.RawMessage) (ToolCall, error) {
	if len(args) == 0 {
		args = json.RawMessage(`{}`)
	}
	r, err := s.Step(ctx, map[string]any{"type": "call_tool", "tool_name": name, "arguments": args})
	if err != nil {
		return ToolCall{}, err
	}
	var tc ToolCall
	if err := json.Unmarshal(r.Observation, &tc); err != nil {
		return ToolCall{}, &ProtocolError{Detail: "call_tool observation: " + err.Error(), Frame: clip(r.Observation)}
	}
	tc.Reward, tc.Done = r.Reward, r.Done
	return tc, nil
}

// MCP sends one JSON-RPC request inside a {"type":"mcp"} frame and returns
// its result; a JSON-RPC error is *RPCError and keeps the socket.
func (s *Session) MCP(ctx context.Context, method string, params any) (json.RawMessage, error) {
	req, err := s.client.rpcRequest(method, params)
	if err != nil {
		return nil, err
	}
	f, err := s.call(ctx, FrameMCP, json.RawMessage(req))
	if err != nil {
		return nil, err
	}
	if err := s.expect(f, FrameMCP); err != nil {
		return nil, err
	}
	return rpcResult(f.Data)
}

// IgnoredFrames counts the frames of this session that answered no
// request: they were dropped (Client.IgnoredFrames sums every session).
func (s *Session) IgnoredFrames() int64 { return s.sock.ignored.Load() }

// Err is the failure that ended the session, or nil while it is usable.
func (s *Session) Err() error {
	s.sock.mu.Lock()
	defer s.sock.mu.Unlock()
	if errors.Is(s.sock.fatal, ErrSessionClosed) {
		return nil
	}
	return s.sock.fatal
}

// Close sends {"type":"close"} (which gets no reply), waits for the
// server's 1000 close, and always closes the socket. It is idempotent; on a
// session that already failed it only releases the socket.
func (s *Session) Close(ctx context.Context) error {
	_, err := s.sock.close(ctx, []byte(`{"type":"close"}`))
	return err
}

// MCPConn is one /mcp WebSocket: bare JSON-RPC frames, one server session.
type MCPConn struct {
	sock   *socket
	client *Client
}

// DialMCP opens the /mcp WebSocket. A server at capacity sends -32000 and
// closes; the first Call returns it as *RPCError.
func (c *Client) DialMCP(ctx context.Context) (*MCPConn, error) {
	sock, err := c.dial(ctx, "/mcp", strayRPCFrame)
	if err != nil {
		return nil, err
	}
	return &MCPConn{sock: sock, client: c}, nil
}

// Call sends one JSON-RPC request and returns its result.
func (m *MCPConn) Call(ctx context.Context, method string, params any) (json.RawMessage, error) {
	req, err := m.client.rpcRequest(method, params)
	if err != nil {
		return nil, err
	}
	raw, err := m.sock.request(ctx, method, req)
	if err != nil {
		return nil, err
	}
	res, err := rpcResult(raw)
	var re *RPCError
	if err != nil && (!errors.As(err, &re) || re.Code == RPCCapacity) {
		m.sock.mu.Lock()
		if m.sock.fatal == nil {
			_ = m.sock.fail(err)
		}
		m.sock.mu.Unlock()
	}
	return res, err
}

// Close closes the socket (normal closure) and stops its goroutines.
func (m *MCPConn) Close(ctx context.Context) error {
	_, err := m.sock.close(ctx, nil)
	return err
}
