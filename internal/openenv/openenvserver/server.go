package openenvserver

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/openenv"
	"github.com/ortrain/ortrain/internal/ors"
)

// Options tune a Server. Zero values take the reference defaults.
type Options struct {
	Logger zerolog.Logger
	// MaxSessions is the capacity shared by /ws, the /mcp WebSocket and
	// openenv/session/create (default 8, the echo app's
	// MAX_CONCURRENT_ENVS default). A socket's slot is free before the
	// peer sees its close frame; the instance's Close may run on after.
	MaxSessions int
	// IdleTimeout closes sessions with no request for this long (default
	// 900 s); ReapInterval is how often the sweep runs (default 5 s).
	IdleTimeout  time.Duration
	ReapInterval time.Duration
	// PingInterval pings every socket (default 20 s, like uvicorn; negative
	// disables); a ping unanswered for as long closes it.
	PingInterval time.Duration
	// WriteTimeout bounds each frame write (default 10 s).
	WriteTimeout time.Duration
	// CloseTimeout bounds an instance's Close (default 30 s).
	CloseTimeout time.Duration
	// MaxMessageBytes is the largest frame read (default 16 MiB, uvicorn's
	// ws_max_size).
	MaxMessageBytes int64
}

// Stats counts sessions of every kind; Live is the number open now.
type Stats struct {
	Live, Created, Closed, Reaped, Refused int64
}

// Server serves one environment.
type Server struct {
	env    *Env
	opts   Options
	log    zerolog.Logger
	schema json.RawMessage // GET /schema body
	// actionFields validate Gym-style actions (nil for MCP envs).
	actionFields []Field

	mu sync.Mutex
	// active counts slots taken. A slot is freed when its session ends,
	// before the peer hears of it (wswatch.go); the instance's Close may
	// still be running then, so live instances can briefly exceed it.
	active   int
	sessions map[string]*session
	closed   bool
	httpSrv  []*http.Server

	created, closedCount, reaped, refused atomic.Int64

	baseCtx    context.Context // parent of every session; cancelled by Shutdown
	cancelBase context.CancelFunc
	reaperDone chan struct{}
	handlers   sync.WaitGroup // socket handlers in flight
}

// New validates env and starts the idle reaper; call Shutdown to stop.
func New(opts Options, env *Env) (*Server, error) {
	if opts.MaxSessions <= 0 {
		opts.MaxSessions = 8
	}
	setDefault(&opts.IdleTimeout, 900*time.Second)
	setDefault(&opts.ReapInterval, 5*time.Second)
	if opts.PingInterval == 0 {
		opts.PingInterval = 20 * time.Second
	}
	setDefault(&opts.WriteTimeout, 10*time.Second)
	setDefault(&opts.CloseTimeout, 30*time.Second)
	if opts.MaxMessageBytes <= 0 {
		opts.MaxMessageBytes = 16 << 20
	}
	if env == nil {
		return nil, errors.New("openenvserver: no environment to serve")
	}
	if err := env.validate(opts.MaxSessions); err != nil {
		return nil, fmt.Errorf("openenvserver: %w", err)
	}
	s := &Server{env: env, opts: opts, log: opts.Logger.With().Str("component", "openenvserver").Logger(),
		sessions: map[string]*session{}}
	action := mcpActionSchema
	if !env.MCP {
		title := env.ActionName
		if title == "" {
			title = "Action"
		}
		action = string(actionSchema(title, "", env.Action))
		s.actionFields = env.Action
	}
	obs := env.ObservationSchema
	if obs == nil {
		obs = json.RawMessage(`{"properties":{},"title":"Observation","type":"object"}`)
	}
	state := env.StateSchema
	if state == nil {
		state = json.RawMessage(baseStateSchema)
	}
	s.schema = mustMarshal(map[string]json.RawMessage{"action": json.RawMessage(action), "observation": obs, "state": state})
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

const baseStateSchema = `{"additionalProperties":true,"description":"Base class for environment state.","properties":{"episode_id":{"anyOf":[{"type":"string"},{"type":"null"}],"default":null,"description":"Unique identifier for the current episode","title":"Episode Id"},"step_count":{"default":0,"description":"Number of steps taken in the current episode","minimum":0,"title":"Step Count","type":"integer"}},"title":"State","type":"object"}`

// mcpActionSchema is CallToolAction's schema: what an MCP env's /schema
// reports as its action.
const mcpActionSchema = `{"additionalProperties":false,"description":"Action to call a specific tool on the MCP server.","properties":{"metadata":` + `{"additionalProperties":true,"description":"Additional metadata for the action","title":"Metadata","type":"object"}` + `,"type":{"const":"call_tool","default":"call_tool","description":"Type of action","title":"Type","type":"string"},"tool_name":{"description":"Name of the tool to call","title":"Tool Name","type":"string"},"arguments":{"additionalProperties":true,"description":"Arguments to pass to the tool","title":"Arguments","type":"object"}},"required":["tool_name"],"title":"CallToolAction","type":"object"}`

var (
	callToolFields  = []Field{{Name: "type", Type: String, Const: "call_tool", Default: "call_tool"}, {Name: "tool_name", Type: String, Required: true}, {Name: "arguments", Type: Object, Default: map[string]any{}}}
	listToolsFields = []Field{{Name: "type", Type: String, Const: "list_tools", Default: "list_tools"}}
)

// Stats returns the session counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Live: int64(len(s.sessions)), Created: s.created.Load(), Closed: s.closedCount.Load(), Reaped: s.reaped.Load(), Refused: s.refused.Load()}
}

// Serve accepts connections on l until Shutdown; it returns nil after a
// Shutdown and the accept error otherwise.
func (s *Server) Serve(l net.Listener) error {
	hs := &http.Server{Handler: s, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 60 * time.Second}
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

// Shutdown stops accepting requests, closes every socket with 1001 and
// every HTTP session, and waits (until ctx ends) for the handlers.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	servers := s.httpSrv
	live := make([]*session, 0, len(s.sessions))
	for _, sess := range s.sessions {
		live = append(live, sess)
	}
	s.mu.Unlock()
	var errs []error
	for _, hs := range servers {
		if err := hs.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("http shutdown: %w", err))
			_ = hs.Close()
		}
	}
	for _, sess := range live {
		s.endSession(sess, "shutdown")
	}
	s.cancelBase()
	<-s.reaperDone
	done := make(chan struct{})
	go func() { s.handlers.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("wait for socket handlers: %w", ctx.Err()))
	}
	return errors.Join(errs...)
}

func (s *Server) reap() {
	defer close(s.reaperDone)
	t := time.NewTicker(s.opts.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-s.baseCtx.Done():
			return
		case now := <-t.C:
			s.mu.Lock()
			var idle []*session
			for _, sess := range s.sessions {
				if sess.inFlight.Load() == 0 && now.Sub(time.Unix(0, sess.lastActive.Load())) > s.opts.IdleTimeout {
					idle = append(idle, sess)
				}
			}
			s.mu.Unlock()
			for _, sess := range idle {
				s.reaped.Add(1)
				s.log.Info().Str("session", sess.id).Str("kind", sess.kind).Msg("reaping idle session")
				s.endSession(sess, "idle")
			}
		}
	}
}

// session is one env instance held by a socket or an HTTP MCP session.
type session struct {
	id   string
	kind string // "ws", "mcp-ws", "http"
	inst Instance
	// mu serialises calls on inst (HTTP sessions can get concurrent
	// requests; sockets are sequential anyway).
	mu         sync.Mutex
	lastActive atomic.Int64
	// inFlight counts requests being served: a long step is not idleness.
	inFlight atomic.Int32
	// kill closes the socket holding the session (nil for HTTP sessions).
	kill  func(reason string)
	ended sync.Once
	slot  sync.Once // frees the session's capacity slot
}

func (sess *session) touch() { sess.lastActive.Store(time.Now().UnixNano()) }

// begin marks a request in flight; the returned func ends it.
func (sess *session) begin() func() {
	sess.touch()
	sess.inFlight.Add(1)
	return func() {
		sess.inFlight.Add(-1)
		sess.touch()
	}
}

// capacityError is the refusal when every slot is taken.
type capacityError struct{ active, max int }

func (e *capacityError) Error() string {
	return fmt.Sprintf("Server at capacity: %d/%d sessions active. Cannot accept new connections.", e.active, e.max)
}

// openSession takes a slot and builds an instance; kill (nil for HTTP
// sessions) closes the socket that holds it. The error is a
// *capacityError or a *factoryError.
func (s *Server) openSession(ctx context.Context, kind string, kill func(reason string)) (*session, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errors.New("server is shutting down")
	}
	if s.active >= s.opts.MaxSessions {
		active := s.active
		s.mu.Unlock()
		s.refused.Add(1)
		return nil, &capacityError{active: active, max: s.opts.MaxSessions}
	}
	s.active++
	s.mu.Unlock()
	inst, err := s.newInstance(ctx)
	if err != nil {
		s.release()
		return nil, err
	}
	sess := &session{id: newUUID(), kind: kind, inst: inst, kill: kill}
	sess.touch()
	s.mu.Lock()
	s.sessions[sess.id] = sess
	s.created.Add(1)
	s.mu.Unlock()
	return sess, nil
}

type factoryError struct {
	name string
	err  error
}

func (e *factoryError) Error() string {
	return fmt.Sprintf("Failed to create environment using factory '%s': %v", e.name, e.err)
}

func (s *Server) newInstance(ctx context.Context) (inst Instance, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &factoryError{name: s.env.Name, err: fmt.Errorf("panic: %v", r)}
		}
	}()
	inst, err = s.env.New(ctx)
	if err == nil && inst == nil {
		err = errors.New("factory returned no instance")
	}
	if err != nil {
		return nil, &factoryError{name: s.env.Name, err: err}
	}
	return inst, nil
}

func (s *Server) release() {
	s.mu.Lock()
	s.active--
	s.mu.Unlock()
}

// freeSlot frees sess's capacity slot; only the first call does anything.
func (s *Server) freeSlot(sess *session) { sess.slot.Do(s.release) }

// endSession frees the session's slot, closes its socket (if any) and then
// its instance; only the first call does anything. The slot goes first: a
// client that opens its next session on hearing the close must find it
// free, however long the instance takes to close.
func (s *Server) endSession(sess *session, reason string) {
	sess.ended.Do(func() {
		s.mu.Lock()
		delete(s.sessions, sess.id)
		s.closedCount.Add(1) // with the delete, so Stats never sees neither
		s.mu.Unlock()
		s.freeSlot(sess)
		if sess.kill != nil {
			sess.kill(reason)
		}
		sess.mu.Lock()
		s.closeInstance(sess.inst)
		sess.mu.Unlock()
	})
}

func (s *Server) closeInstance(inst Instance) {
	c, ok := inst.(ClosingInstance)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.CloseTimeout)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		s.log.Warn().Err(err).Msg("close env instance")
	}
}

func (s *Server) lookup(id string) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[id]
}

// ServeHTTP routes the OpenEnv endpoints.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	isWS := strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
	switch r.URL.Path {
	case "/health":
		if methodOK(w, r, http.MethodGet) {
			writeJSON(w, http.StatusOK, map[string]string{"status": "healthy"})
		}
	case "/metadata":
		if methodOK(w, r, http.MethodGet) {
			s.handleMetadata(w)
		}
	case "/schema":
		if methodOK(w, r, http.MethodGet) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(s.schema)
		}
	case "/openapi.json":
		if methodOK(w, r, http.MethodGet) {
			s.handleOpenAPI(w)
		}
	case "/state":
		if methodOK(w, r, http.MethodGet) {
			s.handleHTTPState(w, r)
		}
	case "/reset":
		if methodOK(w, r, http.MethodPost) {
			s.handleHTTPReset(w, r)
		}
	case "/step":
		if methodOK(w, r, http.MethodPost) {
			s.handleHTTPStep(w, r)
		}
	case "/ws":
		s.handleSocket(w, r, "ws")
	case "/mcp":
		switch {
		case isWS:
			s.handleSocket(w, r, "mcp-ws")
		case r.Method == http.MethodPost:
			s.handleHTTPMCP(w, r)
		case r.Method == http.MethodDelete:
			s.handleMCPDelete(w, r)
		default:
			// GET would open MCP's server-to-client stream, which this
			// server never sends; the spec lets it answer 405.
			w.Header().Set("Allow", "POST, DELETE")
			writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
		}
	default:
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
	}
}

func methodOK(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method == method || (method == http.MethodGet && r.Method == http.MethodHead) {
		return true
	}
	w.Header().Set("Allow", method)
	writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
	return false
}

func (s *Server) handleMetadata(w http.ResponseWriter) {
	version := s.env.Version
	if version == "" {
		version = "1.0.0"
	}
	desc := s.env.Description
	if desc == "" {
		desc = s.env.Name + " environment"
	}
	writeJSON(w, http.StatusOK, openenv.Metadata{Name: s.env.Name, Description: desc, Version: version})
}

// handleOpenAPI serves the part of FastAPI's /openapi.json that OpenEnv's
// `openenv validate --url` reads: info.version (its API profile,
// openenv-http/1.x for "1.0.0") and the paths that show the server runs in
// simulation mode (/reset, /step, /state beside /mcp and /ws). Request and
// response schemas stay at /schema.
func (s *Server) handleOpenAPI(w http.ResponseWriter) {
	op := func(summary string) map[string]any { return map[string]any{"summary": summary} }
	writeJSON(w, http.StatusOK, map[string]any{
		"openapi": "3.1.0",
		"info":    map[string]any{"title": s.env.Name, "version": "1.0.0"},
		"paths": map[string]any{
			"/health":   map[string]any{"get": op("Health")},
			"/metadata": map[string]any{"get": op("Metadata")},
			"/schema":   map[string]any{"get": op("Schema")},
			"/state":    map[string]any{"get": op("State")},
			"/reset":    map[string]any{"post": op("Reset")},
			"/step":     map[string]any{"post": op("Step")},
			"/mcp":      map[string]any{"post": op("MCP JSON-RPC")},
		},
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := ors.MarshalJSON(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"detail":"encode reply"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// internalError is uvicorn's reply to an exception in the env.
func internalError(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Connection", "close")
	w.WriteHeader(http.StatusInternalServerError)
	_, _ = w.Write([]byte("Internal Server Error"))
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
