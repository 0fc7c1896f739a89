package orsserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/ors"
)

// Options tune a Server. Zero values take the reference defaults.
type Options struct {
	Logger zerolog.Logger
	// IdleTimeout reaps sessions with no request and no ping for this long
	// (default 900 s); ReapInterval is how often the sweep runs (default 5 s).
	IdleTimeout  time.Duration
	ReapInterval time.Duration
	// ResumeLinger keeps finished /call results resumable (default 60 s).
	ResumeLinger time.Duration
	// Heartbeat is the SSE comment interval on /call (default 10 s).
	Heartbeat time.Duration
	// TeardownTimeout bounds each Teardown (default 30 s).
	TeardownTimeout time.Duration
	// Version is reported by /version.
	Version string
	// MaxSessions caps the sessions open at once; /create past it answers
	// 503 with Retry-After, the busy answer ORS clients wait out and
	// retry. 0 (the default) is unlimited, as in the reference server:
	// the idle reaper alone bounds how long a session lives, so set a cap
	// where the server is reachable by clients you do not control.
	MaxSessions int
	// Hooks are for tests that need a misbehaving server.
	Hooks Hooks
}

// Hooks inject faults. Leave nil in production.
type Hooks struct {
	// Intercept sees every request first; returning true means it answered.
	Intercept func(w http.ResponseWriter, r *http.Request) bool
	// DropCallStream runs after a /call stream sent its task_id; returning
	// true aborts the connection there (the tool keeps running).
	DropCallStream func(r *http.Request, taskID string) bool
}

// Stats counts sessions; Live is the number open now.
type Stats struct {
	Live      int64
	Created   int64
	Deleted   int64 // all removals, reaped and shutdown included
	Reaped    int64
	ToolCalls int64 // tool invocations started (resumes excluded)
}

// Server serves a set of environments; the first is the default one that
// bare paths reach.
type Server struct {
	opts   Options
	log    zerolog.Logger
	envs   []*servedEnv
	byName map[string]*servedEnv

	sessions sync.Map // sid → *session
	calls    sync.Map // task id → *invocation

	live, created, deleted, reaped, toolCalls atomic.Int64

	baseCtx    context.Context // parent of setups and tool runs; cancelled by Shutdown
	cancelBase context.CancelFunc
	reaperDone chan struct{}
	teardowns  sync.WaitGroup

	mu      sync.Mutex
	httpSrv []*http.Server
	closed  bool
	// freshConns holds accepted connections that have not sent a request
	// yet; net/http's Shutdown waits up to 5 s for those, so Shutdown
	// closes them itself.
	freshConns sync.Map // net.Conn → struct{}
}

type servedEnv struct {
	*Env
	name   string
	tools  map[string]Tool
	listed []ors.ToolSpec // shared tools in name order
}

// New validates the envs and starts the idle reaper; call Shutdown to stop.
func New(opts Options, envs ...*Env) (*Server, error) {
	if len(envs) == 0 {
		return nil, errors.New("orsserver: no environments to serve")
	}
	setDefault(&opts.IdleTimeout, 900*time.Second)
	setDefault(&opts.ReapInterval, 5*time.Second)
	setDefault(&opts.ResumeLinger, 60*time.Second)
	setDefault(&opts.Heartbeat, 10*time.Second)
	setDefault(&opts.TeardownTimeout, 30*time.Second)
	if opts.Version == "" {
		opts.Version = "dev"
	}
	s := &Server{opts: opts, log: opts.Logger.With().Str("component", "orsserver").Logger(), byName: map[string]*servedEnv{}}
	for _, e := range envs {
		if err := e.validate(); err != nil {
			return nil, fmt.Errorf("orsserver: %w", err)
		}
		name := strings.ToLower(e.Name)
		if _, dup := s.byName[name]; dup || isRootEndpoint(name) {
			return nil, fmt.Errorf("orsserver: env name %q is duplicated or reserved", name)
		}
		se := &servedEnv{Env: e, name: name, tools: map[string]Tool{}}
		for _, t := range e.Tools {
			se.tools[t.Name] = t
			se.listed = append(se.listed, t.Spec())
		}
		slices.SortFunc(se.listed, func(a, b ors.ToolSpec) int { return strings.Compare(a.Name, b.Name) })
		s.envs = append(s.envs, se)
		s.byName[name] = se
	}
	s.baseCtx, s.cancelBase = context.WithCancel(context.Background())
	s.reaperDone = make(chan struct{})
	go s.reap()
	return s, nil
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d <= 0 {
		*d = v
	}
}

// EnvNames lists the served env names; the first is the default.
func (s *Server) EnvNames() []string {
	names := make([]string, len(s.envs))
	for i, e := range s.envs {
		names[i] = e.name
	}
	return names
}

// Stats returns the session counters.
func (s *Server) Stats() Stats {
	return Stats{Live: s.live.Load(), Created: s.created.Load(), Deleted: s.deleted.Load(),
		Reaped: s.reaped.Load(), ToolCalls: s.toolCalls.Load()}
}

// Serve accepts connections on l until Shutdown. It returns nil after a
// Shutdown and the accept error otherwise.
func (s *Server) Serve(l net.Listener) error {
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       60 * time.Second, // the reference's uvicorn keep-alive
		ConnState: func(c net.Conn, st http.ConnState) {
			if st == http.StateNew {
				s.freshConns.Store(c, struct{}{})
			} else {
				s.freshConns.Delete(c)
			}
		},
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return l.Close()
	}
	s.httpSrv = append(s.httpSrv, hs)
	s.mu.Unlock()
	if err := hs.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown stops accepting requests, waits (until ctx ends) for requests in
// flight, then tears down every live session.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	servers := s.httpSrv
	s.mu.Unlock()

	var errs []error
	for _, hs := range servers {
		if err := s.shutdownHTTP(ctx, hs); err != nil {
			errs = append(errs, fmt.Errorf("http shutdown: %w", err))
			_ = hs.Close()
		}
	}
	s.cancelBase()
	<-s.reaperDone
	s.sessions.Range(func(key, _ any) bool {
		s.deleteSession(key.(string), "shutdown")
		return true
	})
	done := make(chan struct{})
	go func() { s.teardowns.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("waiting for session teardowns: %w", ctx.Err()))
	}
	return errors.Join(errs...)
}

// shutdownHTTP runs hs.Shutdown, closing connections that never sent a
// request (clients' spare pooled connections) as it goes.
func (s *Server) shutdownHTTP(ctx context.Context, hs *http.Server) error {
	done := make(chan error, 1)
	go func() { done <- hs.Shutdown(ctx) }()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-t.C:
			s.freshConns.Range(func(c, _ any) bool {
				_ = c.(net.Conn).Close()
				s.freshConns.Delete(c)
				return true
			})
		}
	}
}

// reap deletes idle sessions every ReapInterval.
func (s *Server) reap() {
	defer close(s.reaperDone)
	t := time.NewTicker(s.opts.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-s.baseCtx.Done():
			return
		case now := <-t.C:
			cutoff := now.Add(-s.opts.IdleTimeout).UnixNano()
			s.sessions.Range(func(key, v any) bool {
				if v.(*session).lastActive.Load() < cutoff {
					if s.deleteSession(key.(string), "idle") {
						s.reaped.Add(1)
					}
				}
				return true
			})
		}
	}
}

// ServeHTTP routes a request: root endpoints, /{env}/{endpoint}, and a 308
// to the default env for anything else.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h := s.opts.Hooks.Intercept; h != nil && h(w, r) {
		return
	}
	path := collapseSlashes(r.URL.Path)
	segs := strings.Split(strings.TrimPrefix(path, "/"), "/")
	first := strings.ToLower(segs[0])
	if isRootEndpoint(first) {
		if len(segs) != 1 {
			writeDetail(w, http.StatusNotFound, "Not Found")
			return
		}
		s.serveRoot(w, r, first)
		return
	}
	if env, ok := s.byName[first]; ok {
		if len(segs) != 2 {
			writeDetail(w, http.StatusNotFound, "Not Found")
			return
		}
		s.serveEnv(w, r, env, segs[0], segs[1])
		return
	}
	target := "/" + s.envs[0].name + path
	if r.URL.RawQuery != "" {
		target += "?" + r.URL.RawQuery
	}
	w.Header().Set("Location", target)
	writeDetail(w, http.StatusPermanentRedirect, "Redirecting to "+target)
}

func isRootEndpoint(name string) bool {
	switch name {
	case "health", "version", "ping", "list_environments", "create", "delete", "create_session", "delete_session":
		return true
	}
	return false
}

func collapseSlashes(p string) string {
	if !strings.Contains(p, "//") {
		if p == "" {
			return "/"
		}
		return p
	}
	var b strings.Builder
	prevSlash := false
	for i := 0; i < len(p); i++ {
		if p[i] == '/' {
			if prevSlash {
				continue
			}
			prevSlash = true
		} else {
			prevSlash = false
		}
		b.WriteByte(p[i])
	}
	return b.String()
}

func (s *Server) serveRoot(w http.ResponseWriter, r *http.Request, name string) {
	method := http.MethodPost
	switch name {
	case "health", "version", "list_environments":
		method = http.MethodGet
	}
	if !methodOK(w, r, method) {
		return
	}
	switch name {
	case "health":
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	case "version":
		writeJSON(w, http.StatusOK, struct {
			Version  string  `json:"version"`
			BuildSHA *string `json:"build_sha"`
		}{Version: s.opts.Version})
	case "list_environments":
		writeJSON(w, http.StatusOK, s.EnvNames())
	case "ping":
		s.handlePing(w, r)
	case "create":
		s.handleCreate(w, r)
	case "delete":
		s.handleDelete(w, r)
	case "create_session":
		s.handleCreateSession(w, r)
	case "delete_session":
		sid, ok := requireSID(w, r)
		if ok {
			writeJSON(w, http.StatusOK, map[string]string{"sid": sid})
		}
	}
}

func (s *Server) serveEnv(w http.ResponseWriter, r *http.Request, env *servedEnv, segment, endpoint string) {
	get := map[string]bool{"tools": true, "splits": true, "prompt": true, "task_tools": true}
	post := map[string]bool{"tasks": true, "num_tasks": true, "task": true, "task_range": true, "call": true}
	switch {
	case get[endpoint]:
		if !methodOK(w, r, http.MethodGet) {
			return
		}
	case post[endpoint]:
		if !methodOK(w, r, http.MethodPost) {
			return
		}
	default:
		writeDetail(w, http.StatusNotFound, "Not Found")
		return
	}
	switch endpoint {
	case "tools":
		writeJSON(w, http.StatusOK, map[string]any{"tools": nonNil(env.listed)})
	case "splits":
		writeJSON(w, http.StatusOK, env.splits())
	case "tasks", "num_tasks", "task", "task_range":
		s.handleDiscovery(w, r, env, segment, endpoint)
	case "prompt":
		s.handlePrompt(w, r)
	case "task_tools":
		s.handleTaskTools(w, r)
	case "call":
		s.handleCall(w, r)
	}
}

func methodOK(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method == method || (method == http.MethodGet && r.Method == http.MethodHead) {
		return true
	}
	w.Header().Set("Allow", method)
	writeDetail(w, http.StatusMethodNotAllowed, "Method Not Allowed")
	return false
}

// maxSIDBytes bounds a session id: ids are caller-chosen and kept for the
// session's life (the reference's are 36-byte UUIDs).
const maxSIDBytes = 256

func requireSID(w http.ResponseWriter, r *http.Request) (string, bool) {
	sid := strings.TrimSpace(r.Header.Get("X-Session-ID"))
	switch {
	case sid == "":
		writeDetail(w, http.StatusBadRequest, "X-Session-ID header is required")
		return "", false
	case len(sid) > maxSIDBytes:
		writeDetail(w, http.StatusBadRequest, fmt.Sprintf("X-Session-ID header is %d bytes long; the limit is %d", len(sid), maxSIDBytes))
		return "", false
	}
	return sid, true
}

// writeJSON answers with compact JSON, HTML characters unescaped, and
// Content-Type application/json (the Python clients require it).
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := ors.MarshalJSON(v)
	if err != nil {
		status = http.StatusInternalServerError
		body, _ = ors.MarshalJSON(map[string]string{"detail": "encode response: " + err.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func writeDetail(w http.ResponseWriter, status int, detail string) {
	writeJSON(w, status, map[string]string{"detail": detail})
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// newID returns 16 random bytes as 32 hex digits.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80
	return hex.EncodeToString(b[:])
}

// newSID returns a dashed UUID4 like the reference's session ids.
func newSID() string {
	h := newID()
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
