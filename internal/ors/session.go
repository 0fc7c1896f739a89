package ors

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// SessionSpec chooses the task of a new session: Task (a spec, as returned
// by discovery) when set, else Split and Index.
type SessionSpec struct {
	Split string
	Index int
	Task  json.RawMessage
	// EnvName is sent as env_name in /create; empty means the URL target's
	// env segment, if any, else the server's default env.
	EnvName string
	// Secrets reach the env constructor (X-Secrets). Never logged.
	Secrets map[string]string
}

// Session is one open ORS episode. Its methods may be called concurrently;
// a background goroutine pings every PingInterval until Close, and a failed
// ping ends the session (later calls return *SessionTerminatedError).
type Session struct {
	c   *Client
	sid string

	life   context.Context // cancelled (with cause) on death or Close
	end    context.CancelCauseFunc
	pinged chan struct{} // closed when the ping goroutine exits

	toolsFallback atomic.Bool // /task_tools answered 404: use /tools
	closeOnce     sync.Once
	closeErr      error
}

// ID is the session id (X-Session-ID).
func (s *Session) ID() string { return s.sid }

// OpenSession creates a session (create_session, then /create) and starts
// pinging it.
func (c *Client) OpenSession(ctx context.Context, spec SessionSpec) (*Session, error) {
	secrets, err := c.secretsHeader(spec.Secrets)
	if err != nil {
		return nil, err
	}
	sid, err := c.createSession(ctx, secrets)
	if err != nil {
		return nil, err
	}
	body := map[string]any{}
	what := fmt.Sprintf("task %d of split %q", spec.Index, spec.Split)
	if spec.Task != nil {
		body["task_spec"] = spec.Task
		what = "task " + string(spec.Task)
	} else {
		body["split"], body["index"] = spec.Split, spec.Index
	}
	if name := spec.EnvName; name != "" {
		body["env_name"] = name
	} else if c.envPath != "" {
		body["env_name"] = c.envPath[1:]
	}
	if err := c.do(ctx, request{method: http.MethodPost, path: "/create", body: body, sid: sid, secrets: secrets}, nil); err != nil {
		// The server may have created the session before the error (a
		// cancelled or timed-out /create): delete it as Close would, on a
		// context of its own, so no session is left for the reaper.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		_ = c.do(cctx, request{method: http.MethodPost, path: "/delete", sid: sid, noDeployment: true, attempts: 1}, nil)
		c.deleteSession(cctx, sid)
		cancel()
		return nil, fmt.Errorf("create session for %s: %w", what, err)
	}
	life, end := context.WithCancelCause(context.Background())
	s := &Session{c: c, sid: sid, life: life, end: end, pinged: make(chan struct{})}
	go s.pingLoop()
	return s, nil
}

// secretsHeader encodes X-Secrets as the openreward client does: each value
// under "value" with the hosts allowed to receive it. Catalog sessions also
// carry the API key as api_key and OPENREWARD_API_KEY.
func (c *Client) secretsHeader(user map[string]string) (string, error) {
	all := map[string]string{}
	if c.catalog {
		all["api_key"] = c.apiKey
		all["OPENREWARD_API_KEY"] = c.apiKey
	}
	for k, v := range user {
		all[k] = v
	}
	if len(all) == 0 {
		return "", nil
	}
	var hosts []string
	for _, base := range []string{c.sessions, c.api} {
		if u, err := url.Parse(base); err == nil && u.Hostname() != "" {
			hosts = append(hosts, u.Hostname())
		}
	}
	hosts = dedupe(hosts)
	type entry struct {
		Value          string   `json:"value"`
		AllowedDomains []string `json:"allowed_domains"`
	}
	obj := map[string]entry{}
	for k, v := range all {
		obj[k] = entry{Value: v, AllowedDomains: hosts}
	}
	b, err := MarshalJSON(obj)
	if err != nil {
		return "", fmt.Errorf("encode secrets: %w", err)
	}
	return base64.StdEncoding.EncodeToString(b), nil
}

func dedupe(s []string) []string {
	sort.Strings(s)
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// pingLoop keeps the session alive; a ping that fails all its attempts, or
// a 404, ends the session.
func (s *Session) pingLoop() {
	defer close(s.pinged)
	t := time.NewTicker(s.c.opts.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-s.life.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(s.life, s.c.opts.PingTimeout)
		err := s.c.do(ctx, request{method: http.MethodPost, path: "/ping", sid: s.sid}, nil)
		cancel()
		if err != nil && s.life.Err() == nil {
			s.c.log.Warn().Err(err).Str("sid", s.sid).Msg("session ping failed; the session is over")
			s.end(&SessionTerminatedError{SID: s.sid, Reason: "keep-alive ping failed", Err: err})
			return
		}
	}
}

// Err reports why the session ended, or nil while it is alive.
func (s *Session) Err() error {
	if s.life.Err() == nil {
		return nil
	}
	return context.Cause(s.life)
}

// bind derives a request context that also ends when the session does.
func (s *Session) bind(ctx context.Context) (context.Context, func(), error) {
	if err := s.Err(); err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(s.life, func() { cancel(context.Cause(s.life)) })
	return ctx, func() { stop(); cancel(nil) }, nil
}

// sessionErr prefers the session's own end over a bare cancellation.
func (s *Session) sessionErr(err error) error {
	if err != nil && errors.Is(err, context.Canceled) {
		if cause := s.Err(); cause != nil {
			return cause
		}
	}
	return err
}

// Prompt returns the task's prompt blocks (waits for the env's setup).
func (s *Session) Prompt(ctx context.Context) ([]Block, error) {
	ctx, done, err := s.bind(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	var raw []Block
	if err := s.c.do(ctx, request{method: http.MethodGet, path: s.c.envPath + "/prompt", sid: s.sid}, &raw); err != nil {
		return nil, fmt.Errorf("prompt of session %s: %w", s.sid, s.sessionErr(err))
	}
	blocks := raw[:0]
	for _, b := range raw {
		if b.Type == "text" || b.Type == "image" {
			blocks = append(blocks, b)
		}
	}
	return blocks, nil
}

// Tools lists the tools this session can call: shared and task-scoped
// (/task_tools). A server without /task_tools (404) is asked for /tools
// from then on.
func (s *Session) Tools(ctx context.Context) ([]ToolSpec, error) {
	ctx, done, err := s.bind(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	var out struct {
		Tools []ToolSpec `json:"tools"`
	}
	if !s.toolsFallback.Load() {
		err := s.c.do(ctx, request{method: http.MethodGet, path: s.c.envPath + "/task_tools", sid: s.sid}, &out)
		var nf *NotFoundError
		var term *SessionTerminatedError
		if err == nil {
			return out.Tools, nil
		}
		if !errors.As(err, &nf) || errors.As(err, &term) {
			return nil, fmt.Errorf("tools of session %s: %w", s.sid, s.sessionErr(err))
		}
		s.toolsFallback.Store(true)
	}
	if err := s.c.do(ctx, request{method: http.MethodGet, path: s.c.envPath + "/tools", sid: s.sid}, &out); err != nil {
		return nil, fmt.Errorf("tools of session %s: %w", s.sid, s.sessionErr(err))
	}
	return out.Tools, nil
}

// CallTool calls a tool with input (a JSON object; nil means {}). A dropped
// stream is resumed by task id, so the tool runs once. ok:false results are
// *ToolCallError; an SSE error event is *ToolFailedError.
func (s *Session) CallTool(ctx context.Context, name string, input json.RawMessage) (*ToolOutput, error) {
	if len(bytes.TrimSpace(input)) == 0 {
		input = json.RawMessage("{}")
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(input, &probe); err != nil || probe == nil {
		return nil, &ToolCallError{Tool: name, Reason: "bad_input_shape", Message: "tool input must be a JSON object"}
	}
	ctx, done, err := s.bind(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	st, err := s.c.sseLoop(ctx, s.c.envPath+"/call", s.sid, "", s.c.opts.CallRetries, func(taskID string) any {
		body := map[string]any{"name": name, "input": input}
		if taskID != "" {
			body["task_id"] = taskID
		}
		return body
	})
	if err != nil {
		var ev *errorEvent
		if errors.As(err, &ev) {
			return nil, &ToolFailedError{Tool: name, Message: ev.msg}
		}
		return nil, fmt.Errorf("call tool %q in session %s: %w", name, s.sid, s.sessionErr(err))
	}
	payload := st.buf.String()
	if st.jsonBody != nil {
		payload = string(st.jsonBody)
	}
	var res RunToolOutput
	if err := json.Unmarshal([]byte(payload), &res); err != nil {
		return nil, &ProtocolError{URL: s.c.sessions + s.c.envPath + "/call", Detail: fmt.Sprintf("tool %q result is not a RunToolOutput: %v", name, err)}
	}
	if !res.OK {
		reason := res.Reason
		if reason == "" {
			reason = inferReason(res.Error)
		}
		return nil, &ToolCallError{Tool: name, Reason: reason, Message: res.Error}
	}
	if res.Output == nil {
		return nil, &ProtocolError{URL: s.c.sessions + s.c.envPath + "/call", Detail: "ok result without output"}
	}
	return res.Output, nil
}

// Close stops pinging and deletes the session (/delete, then
// /delete_session). It is idempotent; later calls return the first result.
// Pass a live context (not one already cancelled by a shutdown): the
// deletes are requests too.
func (s *Session) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.end(&SessionTerminatedError{SID: s.sid, Reason: "closed"})
		<-s.pinged
		err := s.c.do(ctx, request{method: http.MethodPost, path: "/delete", sid: s.sid, noDeployment: true}, nil)
		s.c.deleteSession(ctx, s.sid)
		if err != nil {
			s.closeErr = fmt.Errorf("delete session %s: %w", s.sid, err)
		}
	})
	return s.closeErr
}
