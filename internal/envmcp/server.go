// Package envmcp serves one env session's tools per rollout as an MCP
// server over streamable HTTP, so a user's own agent process — any
// framework with an MCP client — drives the episode while ortrain records
// what it did and the rewards the env gave.
//
// Both protocol eras are served (see versions.go): the initialize handshake
// with sessions (2024-11-05 to 2025-11-25) and the stateless 2026-07-28
// revision (server/discover, per-request _meta), told apart per request.
//
// Each rollout is attached under its own path, /mcp/{id}, with its own
// bearer key. The server answers every request with a single JSON body: it
// never opens an SSE stream (GET is 405), which the spec allows, and it
// sends no server-initiated requests or notifications. The Accept header is
// not enforced: clients must accept application/json anyway, and refusing
// a lax one would only break agents.
//
// The call that ends the episode says so in its result (structuredContent
// {"finished":true,"reward":R}, _meta MetaFinished and MetaReward, and a
// last text line); later calls get an isError result and never reach the
// env.
package envmcp

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/envtarget"
	"github.com/ortrain/ortrain/internal/peercred"
)

// Header names of the MCP streamable HTTP transport.
const (
	headerSessionID       = "Mcp-Session-Id"
	headerProtocolVersion = "Mcp-Protocol-Version"
)

// MaxBodyBytes caps one POST body: a tool call's arguments are small, and
// an agent gone wrong must not make the trainer buffer without bound.
const MaxBodyBytes = 4 << 20

// defaultCallTimeout bounds one tool call when Options leave it zero.
const defaultCallTimeout = 60 * time.Second

// Options configure a Server. Zero values take the defaults.
type Options struct {
	Logger zerolog.Logger
	// CallTimeout bounds each tool call to the env session (default 60 s).
	CallTimeout time.Duration
	// Now stamps recorded calls (default time.Now).
	Now func() time.Time
	// Version is serverInfo.version in initialize answers (default "dev").
	Version string
	// ToolAnnotations gives each listed tool's MCP annotations
	// (readOnlyHint, destructiveHint, idempotentHint, openWorldHint,
	// title); nil, or a nil map, lists the tool without any. Some clients
	// gate calls on them: Codex with approval_policy "never" refuses tools
	// that are not marked. AnnotateAll gives every tool the same ones.
	ToolAnnotations func(tool string) map[string]any
}

// AnnotateAll is a ToolAnnotations that gives every tool a copy of a.
func AnnotateAll(a map[string]any) func(tool string) map[string]any {
	if a == nil {
		return nil
	}
	own := make(map[string]any, len(a))
	for k, v := range a {
		own[k] = v
	}
	return func(string) map[string]any { return own }
}

// Server serves the attached rollouts. Its zero value is not usable: build
// one with New.
type Server struct {
	opts Options
	log  zerolog.Logger

	foreign       atomic.Int64 // stolen keys refused (owner.go)
	warnedForeign atomic.Bool

	mu       sync.RWMutex
	episodes map[string]*Episode // by rollout id
}

// New returns a Server with no rollout attached.
func New(opts Options) *Server {
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = defaultCallTimeout
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	return &Server{opts: opts, log: opts.Logger, episodes: map[string]*Episode{}}
}

// Handler serves /mcp/{id}: POST carries JSON-RPC, DELETE ends an MCP
// session, GET is 405 (no server-initiated stream).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/mcp/{id}", s.serveRollout)
	return mux
}

// Attach registers rollout id: requests to /mcp/{id} must carry
// "Authorization: Bearer key" and reach sess, whose tools are listed as
// tools. An empty key admits no request. Attaching an id that is already
// attached detaches the earlier episode first. The caller keeps owning sess
// (Detach does not close it).
func (s *Server) Attach(id, key string, sess envtarget.Session, tools []envtarget.ToolSpec) *Episode {
	return s.attach(id, key, sess, tools, nil)
}

func (s *Server) attach(id, key string, sess envtarget.Session, tools []envtarget.ToolSpec, owner *peercred.Owner) *Episode {
	ep := newEpisode(id, key, sess, tools, s.opts)
	ep.owner = owner
	s.mu.Lock()
	old := s.episodes[id]
	s.episodes[id] = ep
	s.mu.Unlock()
	if old != nil {
		s.log.Warn().Str("rollout", id).Msg("rollout attached again: the earlier episode is detached")
		old.detach()
	}
	s.log.Debug().Str("rollout", id).Int("tools", len(tools)).Msg("mcp rollout attached")
	return ep
}

// Detach removes rollout id: later requests get 404. Calls in flight are
// cancelled and waited for, so the episode's record is final when Detach
// returns and the caller may close the session. Unknown ids are ignored.
func (s *Server) Detach(id string) {
	s.mu.Lock()
	ep := s.episodes[id]
	delete(s.episodes, id)
	s.mu.Unlock()
	if ep != nil {
		ep.detach()
		s.log.Debug().Str("rollout", id).Int("calls", len(ep.Calls())).Msg("mcp rollout detached")
	}
}

func (s *Server) lookup(id string) *Episode {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.episodes[id]
}

// serveRollout checks what every method shares (rollout, key, origin),
// then dispatches on the method.
func (s *Server) serveRollout(w http.ResponseWriter, r *http.Request) {
	ep := s.lookup(r.PathValue("id"))
	if ep == nil {
		// Only a caller holding an attached rollout's key (from that
		// rollout's agent) learns that this path is not attached; anyone
		// else gets the same 401 as for an attached one, so rollout ids
		// cannot be probed.
		if holder := s.keyHolder(r.Header.Get("Authorization")); holder != nil && s.fromOwner(r, holder) {
			writeHTTPError(w, http.StatusNotFound, "no rollout is attached at this path (it ended, or the URL is wrong)")
			return
		}
		refuseKey(w)
		return
	}
	if !ep.authorized(r.Header.Get("Authorization")) || !s.fromOwner(r, ep) {
		refuseKey(w)
		return
	}
	if !originAllowed(r) {
		writeHTTPError(w, http.StatusForbidden, "cross-origin requests are refused")
		return
	}
	switch r.Method {
	case http.MethodPost:
		s.servePost(w, r, ep)
	case http.MethodDelete:
		s.serveDelete(w, r, ep)
	default:
		// GET would open a server-to-client SSE stream; this server sends
		// nothing unprompted, and the spec lets it answer 405.
		w.Header().Set("Allow", "POST, DELETE")
		writeHTTPError(w, http.StatusMethodNotAllowed, r.Method+" is not supported: POST JSON-RPC messages, DELETE to end a session")
	}
}

func (s *Server) servePost(w http.ResponseWriter, r *http.Request, ep *Episode) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeHTTPError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is over %d bytes", MaxBodyBytes))
			return
		}
		writeHTTPError(w, http.StatusBadRequest, "read request body: "+err.Error())
		return
	}
	msg, perr := parseMessage(body)
	if perr != nil {
		writeRPC(w, http.StatusBadRequest, rpcResponse{JSONRPC: "2.0", ID: json.RawMessage(nullID), Error: perr})
		return
	}
	// The body decides the era, as the spec and the SDKs do: a version
	// claimed in params._meta is a stateless request, anything else is
	// legacy traffic.
	claim, claimed, cerr := msg.envelopeClaim()
	switch {
	case cerr != nil:
		writeRPC(w, http.StatusBadRequest, rpcResponse{JSONRPC: "2.0", ID: msg.replyID(), Error: cerr})
		return
	case claimed:
		s.serveModern(w, r, ep, msg, claim)
		return
	}
	if msg.kind == kindRequest {
		switch msg.method {
		case "initialize":
			// initialize opens an MCP session, so it is the one message
			// that carries no session id and no negotiated version yet.
			s.initialize(w, ep, msg)
			return
		case methodDiscover:
			// Discovery reads no state: answered even without _meta, so a
			// hand-written probe learns what this server speaks.
			writeRPC(w, http.StatusOK, rpcResponse{JSONRPC: "2.0", ID: msg.id, Result: s.discover()})
			return
		}
		if v := r.Header.Get(headerProtocolVersion); isModernVersion(v) {
			writeRPC(w, http.StatusBadRequest, rpcResponse{JSONRPC: "2.0", ID: msg.id, Error: &rpcError{Code: codeInvalidParams,
				Message: fmt.Sprintf("Invalid params: a %s request carries _meta.%s and _meta.%s in its params (or initialize first for an earlier revision)", v, metaProtocolVersion, metaClientCapabilities)}})
			return
		}
	}
	if !s.checkSession(w, r, ep) {
		return
	}
	if msg.kind != kindRequest {
		// Notifications (notifications/initialized, cancelled, ...) and
		// responses need no answer: accepted, no body.
		w.WriteHeader(http.StatusAccepted)
		return
	}
	result, rerr := s.dispatch(r.Context(), ep, msg, reqEra{})
	reply := rpcResponse{JSONRPC: "2.0", ID: msg.id}
	if rerr != nil {
		reply.Error = rerr
	} else {
		reply.Result = result
	}
	writeRPC(w, http.StatusOK, reply)
}

// serveModern answers a stateless (2026-07-28) message: no session, the
// rollout's path and key are its state. The spec's HTTP statuses apply: 400
// for an unsupported version, a malformed envelope or mismatched headers,
// 404 for an unknown method.
func (s *Server) serveModern(w http.ResponseWriter, r *http.Request, ep *Episode, msg *rpcMessage, version string) {
	fail := func(status int, rerr *rpcError) {
		writeRPC(w, status, rpcResponse{JSONRPC: "2.0", ID: msg.replyID(), Error: rerr})
	}
	if !contains(modernVersions(), version) {
		fail(http.StatusBadRequest, unsupportedVersion(version))
		return
	}
	if msg.kind != kindRequest {
		// The revision defines no client notifications over HTTP; one
		// sent anyway needs no answer.
		w.WriteHeader(http.StatusAccepted)
		return
	}
	if rerr := msg.checkEnvelope(); rerr != nil {
		fail(http.StatusBadRequest, rerr)
		return
	}
	if rerr := checkModernHeaders(r.Header, msg, version); rerr != nil {
		fail(http.StatusBadRequest, rerr)
		return
	}
	result, rerr := s.dispatch(r.Context(), ep, msg, reqEra{modern: true, version: version})
	if rerr != nil {
		status := http.StatusOK
		if rerr.Code == codeMethodNotFound {
			status = http.StatusNotFound
		}
		fail(status, rerr)
		return
	}
	body, err := s.modernResult(result)
	if err != nil {
		fail(http.StatusOK, &rpcError{Code: codeInternalError, Message: "encode result: " + err.Error()})
		return
	}
	writeRPC(w, http.StatusOK, rpcResponse{JSONRPC: "2.0", ID: msg.id, Result: body})
}

// serveDelete ends the MCP session named by the header (not the env
// session: the rollout's owner closes that after Detach).
func (s *Server) serveDelete(w http.ResponseWriter, r *http.Request, ep *Episode) {
	if !s.checkSession(w, r, ep) {
		return
	}
	ep.endMCPSession(r.Header.Get(headerSessionID))
	w.WriteHeader(http.StatusOK)
}

// checkSession answers the spec's errors for a message after initialize:
// 400 for an unsupported MCP-Protocol-Version (with the -32022 body that
// names the supported ones) or a missing session id, 404 for an unknown
// one (the client must then initialize again).
func (s *Server) checkSession(w http.ResponseWriter, r *http.Request, ep *Episode) bool {
	if v := r.Header.Get(headerProtocolVersion); v != "" && !contains(legacyVersions(), v) {
		writeRPC(w, http.StatusBadRequest, rpcResponse{JSONRPC: "2.0", ID: json.RawMessage(nullID), Error: unsupportedVersion(v)})
		return false
	}
	sid := r.Header.Get(headerSessionID)
	if sid == "" {
		writeHTTPError(w, http.StatusBadRequest, "missing Mcp-Session-Id header: send the id initialize returned")
		return false
	}
	if !ep.hasMCPSession(sid) {
		writeHTTPError(w, http.StatusNotFound, "unknown or ended MCP session: initialize again")
		return false
	}
	return true
}

// keyHolder is the attached rollout whose key header carries, or nil.
func (s *Server) keyHolder(header string) *Episode {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, ep := range s.episodes {
		if ep.authorized(header) {
			return ep
		}
	}
	return nil
}

// authorized compares the bearer token with the rollout's key in constant
// time (hashes, so the key's length does not leak either).
func (e *Episode) authorized(header string) bool {
	scheme, token, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || !e.hasKey {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(token)))
	return subtle.ConstantTimeCompare(got[:], e.keyHash[:]) == 1
}

// originAllowed guards against DNS rebinding as the transport spec asks:
// a browser page may only reach this server from its own origin or from
// loopback. Requests without Origin (every non-browser client) pass; the
// bearer key is the real gate.
func originAllowed(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	if strings.EqualFold(u.Host, r.Host) {
		return true
	}
	host := u.Hostname()
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
