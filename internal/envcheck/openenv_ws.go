package envcheck

import (
	"github.com/ortrain/ortrain/internal/jsonschema"

	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// oeMaxProbe bounds the capacity probe: a server that accepts this
// many sessions passes without a refusal being seen.
const oeMaxProbe = 16

// oeTeardownWait bounds the retries of a session refused while this
// run's own closed sessions are still being torn down.
const oeTeardownWait = 2 * time.Second

// oeMaxFrame is the largest frame read (the reference client's 100 MiB).
const oeMaxFrame = 100 << 20

// oeFrame is one server frame: {"type":..,"data":..}.
type oeFrame struct {
	Type string
	Data map[string]any
	Raw  []byte
}

// dial opens a WebSocket at path with the request deadline.
func (x *oe) dial(path string) (*websocket.Conn, error) {
	ctx, cancel := context.WithTimeout(x.ctx, x.o.RequestTimeout)
	defer cancel()
	hc := x.o.Client
	if hc.Timeout != 0 {
		// The library refuses clients with a global timeout; the deadline
		// above bounds the handshake instead.
		c := *hc
		c.Timeout = 0
		hc = &c
	}
	u := "ws" + strings.TrimPrefix(x.base, "http") + path
	conn, res, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: hc, HTTPHeader: x.o.Header.Clone()})
	if err != nil {
		if res != nil && res.StatusCode != 0 {
			return nil, fmt.Errorf("GET %s answered HTTP %d, not 101: %w", path, res.StatusCode, err)
		}
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	conn.SetReadLimit(oeMaxFrame)
	return conn, nil
}

// exchangeRaw sends msg and reads the next text message within timeout.
// The read starts first, so a message the server sends unsolicited (a
// capacity refusal) is read even when the send then fails on the closed
// socket.
func (x *oe) exchangeRaw(c *websocket.Conn, msg []byte, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(x.ctx, timeout)
	defer cancel()
	type result struct {
		b   []byte
		err error
	}
	got := make(chan result, 1)
	go func() {
		typ, b, err := c.Read(ctx)
		if err == nil && typ != websocket.MessageText {
			err = fmt.Errorf("a binary message, not JSON text: %s", brief(b))
		}
		got <- result{b, err}
	}()
	werr := c.Write(ctx, websocket.MessageText, msg)
	res := <-got
	switch {
	case res.err == nil:
		return res.b, nil
	case websocket.CloseStatus(res.err) != -1:
		return nil, fmt.Errorf("the server closed the socket (%d): %w", websocket.CloseStatus(res.err), res.err)
	case werr != nil:
		return nil, fmt.Errorf("send: %w", werr)
	}
	return nil, res.err
}

// exchange is exchangeRaw for /ws, whose replies are frames.
func (x *oe) exchange(c *websocket.Conn, msg []byte, timeout time.Duration) (oeFrame, error) {
	b, err := x.exchangeRaw(c, msg, timeout)
	if err != nil {
		return oeFrame{}, err
	}
	return oeParseFrame(b)
}

// oeParseFrame parses a /ws server frame: a JSON object with a type.
func oeParseFrame(b []byte) (oeFrame, error) {
	obj, err := oeObject(b)
	if err != nil {
		return oeFrame{}, fmt.Errorf("a frame that is not a JSON object: %s", brief(b))
	}
	t, _ := obj["type"].(string)
	data, isObj := obj["data"].(map[string]any)
	if t == "" || (obj["data"] != nil && !isObj) {
		return oeFrame{}, fmt.Errorf(`a frame that is not {"type":str,"data":{...}}: %s`, brief(b))
	}
	return oeFrame{Type: t, Data: data, Raw: b}, nil
}

// oeRefusal reads a capacity refusal (CAPACITY_REACHED on /ws, -32000
// on /mcp): the server's max_sessions; ok is false for any other reply.
func oeRefusal(b []byte) (limit int64, ok bool) {
	obj, _ := oeObject(b)
	data, _ := obj["data"].(map[string]any)
	if e, isErr := obj["error"].(map[string]any); isErr {
		if code, _ := oeInt(e["code"]); code != -32000 {
			return 0, false
		}
		data, _ = e["data"].(map[string]any)
	} else if obj["type"] != "error" || data["code"] != "CAPACITY_REACHED" {
		return 0, false
	}
	limit, _ = oeInt(data["max_sessions"])
	return limit, true
}

// oeAnyRefusal retries every capacity refusal.
func oeAnyRefusal(b []byte) bool { _, ok := oeRefusal(b); return ok }

// open dials path and exchanges first. A slot this run freed is released
// only after the server's teardown, a few ms after the close (§2
// Capacity), so while retry(reply) holds it tries again, for at most
// oeTeardownWait. c is nil when the dial failed; else the caller closes it.
func (x *oe) open(path string, first []byte, timeout time.Duration, retry func([]byte) bool) (c *websocket.Conn, reply []byte, err error) {
	deadline := time.Now().Add(oeTeardownWait)
	for delay := 10 * time.Millisecond; ; delay = min(2*delay, 200*time.Millisecond) {
		if c, err = x.dial(path); err != nil {
			return nil, nil, err
		}
		reply, err = x.exchangeRaw(c, first, timeout)
		if err != nil || !retry(reply) || time.Now().Add(delay).After(deadline) {
			return c, reply, err
		}
		_ = c.CloseNow()
		select {
		case <-x.ctx.Done():
			return nil, nil, x.ctx.Err()
		case <-time.After(delay):
		}
	}
}

// awaitClose reads until the server closes, returning the close status
// (-1: not a close) and what came instead.
func (x *oe) awaitClose(c *websocket.Conn) (websocket.StatusCode, string) {
	ctx, cancel := context.WithTimeout(x.ctx, x.o.RequestTimeout)
	defer cancel()
	_, b, err := c.Read(ctx)
	if err == nil {
		return -1, "a frame instead of the close: " + brief(b)
	}
	if st := websocket.CloseStatus(err); st != -1 {
		return st, fmt.Sprintf("closed with %d", st)
	}
	return -1, "no close frame: " + err.Error()
}

// oeErrorCode is an error frame's code ("" when f is no error frame).
func oeErrorCode(f oeFrame) string {
	if f.Type != "error" {
		return ""
	}
	code, _ := f.Data["code"].(string)
	return code
}

// oeSocket runs the cases of one socket: once the socket fails, the cases
// after it are skipped, naming the case that lost it.
type oeSocket struct {
	x    *oe
	c    *websocket.Conn
	dead string
}

func (s *oeSocket) check(name, expected string, needs []string, f func() (string, bool, error)) bool {
	if s.dead != "" {
		s.x.r.skip(name, s.dead)
		return false
	}
	return s.x.check(name, expected, needs, func() (string, bool) {
		obs, ok, err := f()
		if err != nil {
			s.dead = fmt.Sprintf("the socket stopped working in %s", name)
			if obs == "" {
				obs = err.Error()
			}
			return obs, false
		}
		return obs, ok
	})
}

// oeReplyIs checks that f is a frame of type want, and an observation
// frame's shape; observed and ok for a case.
func oeReplyIs(f oeFrame, want string) (string, bool) {
	if f.Type != want {
		return fmt.Sprintf("a %s frame, not %s: %s", f.Type, want, brief(f.Raw)), false
	}
	if want == "observation" {
		return oeStepShape(f.Data, f.Raw)
	}
	return brief(f.Raw), true
}

// reply exchanges msg on c and checks the reply with oeReplyIs; err is a
// socket failure (and observed its text).
func (x *oe) reply(c *websocket.Conn, msg []byte, timeout time.Duration, want string) (oeFrame, string, bool, error) {
	f, err := x.exchange(c, msg, timeout)
	if err != nil {
		return f, err.Error(), false, err
	}
	obs, ok := oeReplyIs(f, want)
	return f, obs, ok, nil
}

// wsMain walks one /ws session through reset, state, step, MCP, the
// malformed frames that must leave it open, and close.
func (x *oe) wsMain() {
	const connect = "openenv/ws connect"
	id := oeEpisodeID()
	// The reset is the socket's first exchange, so that a refusal while
	// an earlier session is torn down is retried (open).
	c, reply, err := x.open("/ws", oeResetFrame(id), x.o.CallTimeout, oeAnyRefusal)
	if c != nil {
		defer func() { _ = c.CloseNow() }()
	}
	x.check(connect, "GET /ws upgrades with HTTP 101, no subprotocol and no auth (§2 WebSocket /ws)", nil, func() (string, bool) {
		if c == nil {
			return err.Error(), false
		}
		return "HTTP 101", true
	})
	s := &oeSocket{x: x, c: c}
	s.check("openenv/ws reset", `{"type":"reset","data":{"episode_id":..}} answers {"type":"observation","data":{"observation":{...},"reward":float|null,"done":bool}}, no reward/done/metadata inside the observation (§2 WebSocket /ws)`, []string{connect}, func() (string, bool, error) {
		if err != nil {
			return "", false, err
		}
		f, err := oeParseFrame(reply)
		if err != nil {
			return err.Error(), false, nil
		}
		obs, ok := oeReplyIs(f, "observation")
		return obs, ok, nil
	})
	var before map[string]any
	s.check("openenv/ws state", `{"type":"state"} answers {"type":"state","data":{"episode_id":<the reset's>,"step_count":0,...}} after the reset (§2 WebSocket /ws)`, []string{"openenv/ws reset"}, func() (string, bool, error) {
		f, obs, ok, err := x.reply(c, []byte(`{"type":"state"}`), x.o.RequestTimeout, "state")
		if !ok {
			return obs, false, err
		}
		before = f.Data
		n, _ := oeInt(f.Data["step_count"])
		switch why := oeStateShape(f.Data); {
		case why != "":
			return why + ": " + brief(f.Raw), false, nil
		case f.Data["episode_id"] != id:
			return "episode_id is not the reset's: " + brief(f.Raw), false, nil
		case n != 0:
			return "step_count is not 0 after the reset: " + brief(f.Raw), false, nil
		}
		return brief(f.Raw), true, nil
	})
	stepped := x.wsSteps(s)
	s.check("openenv/ws state after step", "state keeps the episode_id and its step_count grows with the step (§2 WebSocket /ws)", []string{"openenv/ws state", stepped}, func() (string, bool, error) {
		f, obs, ok, err := x.reply(c, []byte(`{"type":"state"}`), x.o.RequestTimeout, "state")
		if !ok {
			return obs, false, err
		}
		n0, _ := oeInt(before["step_count"])
		n1, isInt := oeInt(f.Data["step_count"])
		return brief(f.Raw), f.Data["episode_id"] == id && isInt && n1 > n0, nil
	})
	// A frame that fails must get its error code and leave the socket
	// open: a state exchange after it proves the session still answers.
	stillOpen := func(name, expected string, msg []byte, want string, timeout time.Duration) {
		s.check(name, expected, []string{connect}, func() (string, bool, error) {
			f, err := x.exchange(c, msg, timeout)
			if err != nil {
				return "", false, err
			}
			obs := fmt.Sprintf("%s → %s", brief(msg), brief(f.Raw))
			if code := oeErrorCode(f); code != want {
				return fmt.Sprintf("%s (code %q, not %s)", obs, code, want), false, nil
			}
			g, err := x.exchange(c, []byte(`{"type":"state"}`), x.o.RequestTimeout)
			if err != nil {
				return obs + "; then the socket did not answer state: " + err.Error(), false, err
			}
			if g.Type != "state" {
				return obs + "; then state answered " + brief(g.Raw), false, nil
			}
			return obs + "; the socket stays open", true, nil
		})
	}
	stillOpen("openenv/ws step invalid action", `{"type":"step","data":{"envcheck_unexpected_field":1}} answers an error frame with code VALIDATION_ERROR; the socket stays open (§2 error codes)`,
		[]byte(`{"type":"step","data":{"envcheck_unexpected_field":1}}`), "VALIDATION_ERROR", x.o.CallTimeout)
	x.wsMCP(s)
	stillOpen("openenv/ws invalid JSON", "a frame that is not JSON answers an error frame with code INVALID_JSON; the socket stays open (§2 error codes)",
		[]byte(`{"type":"state"`), "INVALID_JSON", x.o.RequestTimeout)
	stillOpen("openenv/ws unknown type", `{"type":"nonsense"} answers an error frame with code UNKNOWN_TYPE; the socket stays open (§2 error codes)`,
		[]byte(`{"type":"nonsense"}`), "UNKNOWN_TYPE", x.o.RequestTimeout)
	stillOpen("openenv/ws envelope extra key", `{"type":"state","data":{}} answers an error frame with code VALIDATION_ERROR (extra="forbid"); the socket stays open (§2 Frames)`,
		[]byte(`{"type":"state","data":{}}`), "VALIDATION_ERROR", x.o.RequestTimeout)
	s.check("openenv/ws close", `{"type":"close"} gets no reply; the server closes the socket with 1000 (§2 Replies)`, []string{connect}, func() (string, bool, error) {
		ctx, cancel := context.WithTimeout(x.ctx, x.o.RequestTimeout)
		err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"close"}`))
		cancel()
		if err != nil {
			return "send: " + err.Error(), false, nil
		}
		st, obs := x.awaitClose(c)
		return obs, st == websocket.StatusNormalClosure, nil
	})
}

// wsSteps runs the step cases: the minimal action from /schema on a
// Gym-style env; list_tools then call_tool of the first tool on an MCP
// env. It returns the case a later state check depends on.
func (x *oe) wsSteps(s *oeSocket) string {
	if x.action == nil {
		x.r.skip("openenv/ws step", "needs openenv/schema (the action schema), which did not pass")
		return "openenv/ws step"
	}
	if !x.mcpEnv {
		action := jsonschema.Minimal(x.action)
		s.check("openenv/ws step", fmt.Sprintf(`{"type":"step","data":%s} (the minimal action of /schema's action schema) answers an observation frame (§2 WebSocket /ws)`, oeText(action)), []string{"openenv/ws reset"}, func() (string, bool, error) {
			_, obs, ok, err := x.reply(s.c, oeJSON(map[string]any{"type": "step", "data": action}), x.o.CallTimeout, "observation")
			return obs, ok, err
		})
		return "openenv/ws step"
	}
	var tools []oeTool
	s.check("openenv/ws step list_tools", `{"type":"step","data":{"type":"list_tools"}} answers an observation whose observation.tools each have name and input_schema (§2 Actions)`, []string{"openenv/ws reset"}, func() (string, bool, error) {
		f, obs, ok, err := x.reply(s.c, []byte(`{"type":"step","data":{"type":"list_tools"}}`), x.o.CallTimeout, "observation")
		if !ok {
			return obs, false, err
		}
		inner, _ := f.Data["observation"].(map[string]any)
		tools, obs, ok = oeToolList(inner, "input_schema")
		return obs, ok, nil
	})
	if x.ok["openenv/ws step list_tools"] && len(tools) == 0 {
		x.r.skip("openenv/ws step call_tool", "list_tools listed no tools")
		return "openenv/ws step list_tools"
	}
	var name string
	var args any = map[string]any{}
	if len(tools) > 0 {
		name = tools[0].Name
		if a, isObj := jsonschema.Minimal(tools[0].Schema).(map[string]any); isObj {
			args = a
		}
	}
	s.check("openenv/ws step call_tool", `{"type":"step","data":{"type":"call_tool","tool_name":<first tool>,"arguments":<minimal>}} answers an observation {"tool_name","result","error"}: a tool failure is an observation, not an error frame (§2 Actions)`, []string{"openenv/ws step list_tools"}, func() (string, bool, error) {
		f, obs, ok, err := x.reply(s.c, oeJSON(map[string]any{"type": "step", "data": map[string]any{"type": "call_tool", "tool_name": name, "arguments": args}}), x.o.CallTimeout, "observation")
		if !ok {
			return obs, false, err
		}
		inner, _ := f.Data["observation"].(map[string]any)
		_, hasRes := inner["result"]
		_, hasErr := inner["error"]
		return obs, inner["tool_name"] == name && hasRes && hasErr, nil
	})
	return "openenv/ws step list_tools"
}

// wsMCP: JSON-RPC inside {"type":"mcp"} frames.
func (x *oe) wsMCP(s *oeSocket) {
	s.check("openenv/ws mcp", `{"type":"mcp","data":{"jsonrpc":"2.0","id":"envcheck","method":"tools/list"}} answers {"type":"mcp","data":<JSON-RPC reply with that id>}: tools, or -32603 on a Gym-style env (§2 MCP JSON-RPC)`, []string{"openenv/ws connect"}, func() (string, bool, error) {
		f, obs, ok, err := x.reply(s.c, oeJSON(map[string]any{"type": "mcp", "data": json.RawMessage(oeRPCRequest("envcheck", "tools/list", map[string]any{}))}), x.o.RequestTimeout, "mcp")
		if !ok {
			return obs, false, err
		}
		rep, bad := oeParseRPC(oeJSON(f.Data))
		if bad != "" {
			return bad, false, nil
		}
		_, obs, ok = x.toolsReply(rep, "envcheck")
		return obs, ok, nil
	})
}

// wsSessionError: a JSON frame that is not an object ends the session.
func (x *oe) wsSessionError() {
	x.check("openenv/ws non-object frame", "the frame [1,2] answers an error frame with code SESSION_ERROR, then the server closes with 1000 (§2 error codes)", []string{"openenv/ws connect"}, func() (string, bool) {
		c, reply, err := x.open("/ws", []byte(`[1,2]`), x.o.RequestTimeout, oeAnyRefusal)
		if c != nil {
			defer func() { _ = c.CloseNow() }()
		}
		if err != nil {
			return err.Error(), false
		}
		f, err := oeParseFrame(reply)
		if err != nil {
			return err.Error(), false
		}
		if code := oeErrorCode(f); code != "SESSION_ERROR" {
			return fmt.Sprintf("code %q, not SESSION_ERROR: %s", code, brief(f.Raw)), false
		}
		st, obs := x.awaitClose(c)
		return brief(f.Raw) + "; " + obs, st == websocket.StatusNormalClosure
	})
}

// mcpSocket: bare JSON-RPC frames on the /mcp WebSocket.
func (x *oe) mcpSocket() {
	x.check("openenv/mcp websocket", `WS /mcp: {"jsonrpc":"2.0","id":9,"method":"tools/list"} answers a bare JSON-RPC reply with id 9: tools, or -32603 on a Gym-style env (§2 MCP JSON-RPC)`, nil, func() (string, bool) {
		c, b, err := x.open("/mcp", oeRPCRequest(9, "tools/list", map[string]any{}), x.o.RequestTimeout, oeAnyRefusal)
		if c != nil {
			defer x.closeAll(c)
		}
		if err != nil {
			return err.Error(), false
		}
		rep, bad := oeParseRPC(b)
		if bad != "" {
			return bad, false
		}
		_, obs, ok := x.toolsReply(rep, 9)
		return obs, ok
	})
}

// stepAction is the action the step cases send (list_tools on an MCP
// env), or the case it needs that did not pass.
func (x *oe) stepAction() (any, string) {
	switch {
	case x.action == nil:
		return nil, "openenv/schema"
	case x.mcpEnv:
		if !x.ok["openenv/ws step list_tools"] {
			return nil, "openenv/ws step list_tools"
		}
		return map[string]any{"type": "list_tools"}, ""
	case !x.ok["openenv/ws step"]:
		return nil, "openenv/ws step"
	}
	return jsonschema.Minimal(x.action), ""
}

// closeAll closes the sockets together, each close handshake bounded by
// the request timeout.
func (x *oe) closeAll(conns ...*websocket.Conn) {
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			t := time.AfterFunc(x.o.RequestTimeout, func() { _ = c.CloseNow() })
			defer t.Stop()
			if c.Close(websocket.StatusNormalClosure, "") != nil {
				_ = c.CloseNow()
			}
		})
	}
	wg.Wait()
}

// oeResetFrame is a /ws reset with the episode id.
func oeResetFrame(id string) []byte {
	return oeJSON(map[string]any{"type": "reset", "data": map[string]any{"episode_id": id}})
}

func oeJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("envcheck: encode %T: %v", v, err))
	}
	return b
}

// oeTool is a listed MCP tool.
type oeTool struct {
	Name   string
	Schema map[string]any
}

// oeToolList reads a tools list: each tool needs a name and an object
// schema under schemaKey.
func oeToolList(res map[string]any, schemaKey string) ([]oeTool, string, bool) {
	list, isList := res["tools"].([]any)
	if !isList {
		return nil, "the result has no tools list: " + oeText(res), false
	}
	var tools []oeTool
	var names []string
	for i, t := range list {
		tm, _ := t.(map[string]any)
		name, _ := tm["name"].(string)
		schema, isObj := tm[schemaKey].(map[string]any)
		if name == "" || !isObj {
			return nil, fmt.Sprintf("tool %d lacks a name or an object %s: %s", i, schemaKey, brief([]byte(oeText(t)))), false
		}
		tools = append(tools, oeTool{Name: name, Schema: schema})
		names = append(names, name)
	}
	return tools, fmt.Sprintf("%d tools: %s", len(tools), strings.Join(names, ", ")), true
}

// oeEpisodeID is a fresh episode id for a reset, unlikely to collide with
// another client's on a shared server.
func oeEpisodeID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "envcheck-" + hex.EncodeToString(b[:])
}
