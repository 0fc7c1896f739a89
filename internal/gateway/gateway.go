// Package gateway serves an OpenAI-compatible HTTP API (chat completions,
// the Responses API, text completions, models) and Anthropic's Messages API
// from ortrain's own engine, so an agent that keeps its own loop and calls
// OPENAI_BASE_URL or ANTHROPIC_BASE_URL can be trained on exactly what the
// engine sampled. Every API renders through the same chat template and
// records through the same Recorder, so a conversation is the same tokens
// whichever API carried it.
//
// Multi-tenant (training): Open gives each rollout a base path
// /rollouts/{id}/v1 and a fresh bearer key; every successful call is
// recorded token for token (prompt ids as rendered and encoded here,
// completion ids and log-probs as the sampler returned them, the weight
// version at dispatch) in the rollout's Recorder, and Assemble turns the
// calls into training segments without re-tokenizing any text. A tenant
// opened with Tenant.RequireOwner honours its key only from the process
// tree BindOwner names (its agent's; owner.go), where the platform can tell.
// Single-tenant (ortrain serve-engine): the same handlers at /v1, with an
// optional API key and no recording.
//
// Replies keep the sampled text: content is the text outside the tool calls
// (trimmed; thinking blocks stay in it), arguments are the JSON the model
// wrote, so an agent that sends a reply back gets it re-rendered to the
// sampled ids wherever the template writes turns as the model did (see
// Assemble). Log-probs are the sampler's, after temperature and truncation.
// Any "model" name is accepted (agents hard-code names); "developer"
// messages are rendered as "system"; max_tokens above the cap is served
// with the cap.
//
// What the gateway does not do, by design: it samples n=1 only; it does not
// constrain decoding, so tool_choice "required" or a named function is
// accepted but not enforced (the tools are rendered and the reply parsed as
// for "auto"); tool_choice "none" still renders the tools (so the prompt
// prefix stays the same across calls) but returns the whole reply as
// content; the engine does not stream, so a streamed reply is written as
// SSE chunks after the completion is sampled; top_logprobs are empty lists.
package gateway

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/peercred"
)

// Defaults apply when a request leaves a sampling field out.
type Defaults struct {
	// MaxTokens is the completion budget of a request that sets none
	// (0: 1024).
	MaxTokens int
	// MaxTokensCap bounds every completion (0: no cap beyond MaxModelLen).
	// A request asking for more is served with the cap, not refused: agents
	// send large constants, and the budget is the trainer's to set.
	MaxTokensCap int
	// Sampling is used field by field where a request sets none; the zero
	// value means temperature 1, top_p 1.
	Sampling engine.SamplingParams
	// ForceSampling applies Sampling to every request, whatever the agent
	// sends (its values are still checked): a trainer explores with its own
	// temperature, and its loss assumes the log-probs were sampled with it
	// (agents often hard-code temperature 0). Calls that asked for
	// something else are counted (Recorder.SamplingOverridden).
	ForceSampling bool
}

// SingleTenant serves the API at /v1 for one client that is not a rollout
// (ortrain serve-engine): nothing is recorded and no session key is sent.
type SingleTenant struct {
	// APIKey, when set, is required as a Bearer token; "" accepts any
	// request.
	APIKey string
}

// Options configure a Gateway.
type Options struct {
	Model     string // the served model id (GET models, "model" in replies)
	Tokenizer *chat.Tokenizer
	Template  *chat.Template
	Kwargs    map[string]any // extra template variables (enable_thinking, …)
	// Format parses tool calls out of replies; chat.FormatNone returns
	// every reply as content (resolve it with chat.DetectToolCallFormat).
	Format chat.ToolCallFormat
	// Sampler generates the completions; only Generate is used.
	Sampler  engine.Generator
	Defaults Defaults
	// MaxModelLen bounds prompt + completion tokens (0: unbounded): a
	// prompt that leaves no room is refused, max_tokens is lowered to fit.
	MaxModelLen int
	// WeightVersion is stamped on each call when it is dispatched (nil: 0).
	WeightVersion func() int
	// CallTimeout bounds one generation (0: 10 minutes).
	CallTimeout time.Duration
	// MaxBodyBytes bounds a request body (0: what MaxModelLen can hold,
	// 1 to 16 MiB; 16 MiB without MaxModelLen); larger is 413.
	MaxBodyBytes int64
	// SingleTenant, when set, also serves the API at /v1.
	SingleTenant *SingleTenant
	Logger       zerolog.Logger
	Now          func() time.Time // nil: time.Now
}

// Errors Open returns; callers branch on them with errors.Is.
var (
	ErrRolloutExists    = errors.New("rollout already open")
	ErrInvalidRolloutID = errors.New("invalid rollout id")
	// ErrRolloutClosed is the cause of the context of a call whose rollout
	// was closed while it ran.
	ErrRolloutClosed = errors.New("rollout closed")
)

// Gateway is the HTTP API over one engine. It is safe for concurrent use.
type Gateway struct {
	opts   Options
	endIDs []int32 // stop ids of every generation: the end-of-turn tokens
	// maxTokenBytes is the longest token's text: a prompt longer than
	// MaxModelLen of them cannot fit and is refused before encoding.
	maxTokenBytes int
	created       int64 // GET models "created"
	log           zerolog.Logger
	mux           *http.ServeMux

	unauthorized atomic.Int64 // requests with a key no open rollout holds
	foreign      atomic.Int64 // requests with a key from outside its owner's tree (owner.go)
	noted        sync.Map     // notes already logged (noteOnce)

	mu       sync.Mutex
	rollouts map[string]*rollout
	single   *rollout // nil unless Options.SingleTenant
}

// rollout is one tenant: a key, a recorder and a context Close cancels.
type rollout struct {
	id     string
	key    []byte    // nil: any request is accepted (single tenant, no key)
	rec    *Recorder // nil: nothing is recorded
	ctx    context.Context
	cancel context.CancelCauseFunc // nil for the single tenant
	// version, when set, is stamped on every call (OpenFor); values is
	// the context whose values generation sees (nil: the request's only).
	version *int
	values  context.Context
	// seed is the base every call's seed derives from (callSeed): the
	// rollout's seed, or a random one. 0 (the single tenant) leaves a
	// request without a seed to the backend, which draws one.
	seed int64
	// responses are the kept Responses API conversations (responses_store.go).
	responses *responseStore
	// owner, when set, is the process tree the key is honoured from
	// (Tenant.RequireOwner, owner.go).
	owner *peercred.Owner
}

// generationContext is ctx (a request's: its deadline and cancellation)
// that also answers Value from the rollout's values context, so the
// engine sees what the trainer put there (the sampler version).
func (ro *rollout) generationContext(ctx context.Context) context.Context {
	if ro.values == nil {
		return ctx
	}
	return valuesContext{Context: ctx, values: ro.values}
}

type valuesContext struct {
	context.Context
	values context.Context
}

func (c valuesContext) Value(key any) any {
	if v := c.Context.Value(key); v != nil {
		return v
	}
	return c.values.Value(key)
}

// New checks the options and builds the gateway.
func New(opts Options) (*Gateway, error) {
	switch {
	case opts.Tokenizer == nil:
		return nil, errors.New("gateway: Options.Tokenizer is required")
	case opts.Template == nil:
		return nil, errors.New("gateway: Options.Template is required")
	case opts.Sampler == nil:
		return nil, errors.New("gateway: Options.Sampler is required")
	case opts.Model == "":
		return nil, errors.New("gateway: Options.Model (the served model id) is required")
	}
	if opts.Defaults.MaxTokens == 0 {
		opts.Defaults.MaxTokens = 1024
	}
	if opts.Defaults.Sampling == (engine.SamplingParams{}) {
		opts.Defaults.Sampling = engine.SamplingParams{Temperature: 1, TopP: 1}
	}
	probe := engine.Request{PromptIDs: []int32{0}, MaxTokens: opts.Defaults.MaxTokens, Sampling: opts.Defaults.Sampling}
	if err := probe.Validate(); err != nil {
		return nil, fmt.Errorf("gateway: Options.Defaults: %w", err)
	}
	if opts.Defaults.MaxTokensCap < 0 || opts.MaxModelLen < 0 {
		return nil, fmt.Errorf("gateway: Options.Defaults.MaxTokensCap %d and Options.MaxModelLen %d must be >= 0",
			opts.Defaults.MaxTokensCap, opts.MaxModelLen)
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = 10 * time.Minute
	}
	maxTokenBytes := 0
	if opts.MaxModelLen > 0 {
		maxTokenBytes = longestToken(opts.Tokenizer)
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = defaultBodyLimit(opts.MaxModelLen, maxTokenBytes)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	endIDs := opts.Tokenizer.Special().EndOfTurn
	if len(endIDs) == 0 {
		return nil, errors.New("gateway: the tokenizer has no end-of-turn token to stop generation at")
	}
	g := &Gateway{opts: opts, endIDs: endIDs, maxTokenBytes: maxTokenBytes, created: opts.Now().Unix(),
		log: opts.Logger.With().Str("component", "gateway").Logger(),
		mux: http.NewServeMux(), rollouts: map[string]*rollout{}}
	g.route("/rollouts/{id}/v1", g.rolloutEndpoint)
	if st := opts.SingleTenant; st != nil {
		g.single = &rollout{ctx: context.Background(), responses: newResponseStore()} // never closed
		if st.APIKey != "" {
			g.single.key = []byte(st.APIKey)
		}
		g.route("/v1", g.singleEndpoint)
	}
	// A route a tenant's agent got wrong is counted against its rollout
	// (agent_bad_request, naming the route), once its key is checked.
	g.mux.HandleFunc("/rollouts/{id}/{rest...}", g.rolloutEndpoint(g.handleUnknown))
	// Anything else, a wrong method included, gets OpenAI's error shape.
	g.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, notFound("unknown_url", "no route for %s %s", r.Method, r.URL.Path))
	})
	return g, nil
}

// defaultBodyLimit bounds a request body at what a context can hold:
// twice its longest text (JSON escaping, tool schemas, ids), at least 1 MiB,
// at most 16 MiB; 16 MiB without a context bound.
func defaultBodyLimit(maxModelLen, maxTokenBytes int) int64 {
	if maxModelLen <= 0 {
		return 16 << 20
	}
	return min(16<<20, max(1<<20, 2*int64(maxModelLen)*int64(maxTokenBytes)))
}

// endpoint serves one route for an authorized tenant.
type endpoint func(w http.ResponseWriter, r *http.Request, ro *rollout)

func (g *Gateway) route(base string, wrap func(endpoint) http.HandlerFunc) {
	g.mux.HandleFunc("POST "+base+"/chat/completions", wrap(g.handleChat))
	g.mux.HandleFunc("POST "+base+"/completions", wrap(g.handleText))
	g.mux.HandleFunc("GET "+base+"/models", wrap(g.handleModels))
	g.mux.HandleFunc("POST "+base+"/responses", wrap(g.handleResponses))
	g.mux.HandleFunc("POST "+base+"/messages", wrap(g.handleMessages))
	g.mux.HandleFunc("POST "+base+"/messages/count_tokens", wrap(g.handleCountTokens))
}

// Handler returns the HTTP handler of every route.
func (g *Gateway) Handler() http.Handler { return g.mux }

// RolloutPath is the base path of a rollout's API: OPENAI_BASE_URL is the
// server's address followed by it.
func RolloutPath(id string) string { return "/rollouts/" + id + "/v1" }

// Open starts a rollout: its calls are served under RolloutPath(id) with
// the returned key and recorded in the returned Recorder, each stamped with
// Options.WeightVersion at dispatch and sampled with a seed of its own
// (from a random base).
func (g *Gateway) Open(id string) (key string, rec *Recorder, err error) {
	return g.open(context.Background(), id, nil, Tenant{})
}

// Tenant is what a rollout's calls are served with.
type Tenant struct {
	// Version is the policy version stamped on every call.
	Version int
	// Seed is the rollout's seed: call n samples with a seed derived from
	// it and n, so a rollout is reproducible and every rollout of a group
	// samples differently whatever seed its agent sends (0: a random base).
	Seed int64
	// RequireOwner honours the key only on connections from one process
	// tree, named by BindOwner once the agent has started (its requests
	// wait for it a few seconds): agents run as one uid, and one may read
	// a sibling's key from its environment. Where the platform cannot
	// tell the calling process (not Linux) the key alone decides.
	RequireOwner bool
}

// OpenFor starts a rollout served by one policy version: its calls are
// stamped with t.Version, seeded from t.Seed, and generate under a context
// that carries ctx's values (not its cancellation), so an engine that keeps
// several weight versions (async rounds) samples the rollout with the
// version ctx names.
func (g *Gateway) OpenFor(ctx context.Context, id string, t Tenant) (key string, rec *Recorder, err error) {
	return g.open(context.WithoutCancel(ctx), id, &t.Version, t)
}

func (g *Gateway) open(values context.Context, id string, version *int, t Tenant) (key string, rec *Recorder, err error) {
	if !validRolloutID(id) {
		return "", nil, fmt.Errorf("%w %q: use 1 to 128 characters from A-Z a-z 0-9 . _ - ~", ErrInvalidRolloutID, id)
	}
	var b [24]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails on supported platforms
	key = "sk-ortrain-" + hex.EncodeToString(b[:])
	seed := t.Seed
	for seed == 0 {
		var sb [8]byte
		_, _ = rand.Read(sb[:])
		seed = int64(binary.LittleEndian.Uint64(sb[:]))
	}
	ctx, cancel := context.WithCancelCause(values)
	ro := &rollout{id: id, key: []byte(key), rec: newRecorder(), ctx: ctx, cancel: cancel, version: version, values: values, seed: seed,
		responses: newResponseStore()}
	if t.RequireOwner {
		ro.owner = peercred.NewOwner()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.rollouts[id]; ok {
		cancel(nil)
		return "", nil, fmt.Errorf("%w: %q", ErrRolloutExists, id)
	}
	g.rollouts[id] = ro
	return key, ro.rec, nil
}

// Close ends a rollout: later requests get 404, calls in flight are
// cancelled, and its Recorder takes no more calls (so Calls is final once
// Close returns). Closing an unknown id does nothing. The engine session
// (SessionKey = id) is the caller's to end, as rollout.Runner ends its own:
// the gateway calls only Generate.
func (g *Gateway) Close(id string) {
	g.mu.Lock()
	ro := g.rollouts[id]
	delete(g.rollouts, id)
	g.mu.Unlock()
	if ro == nil {
		return
	}
	ro.rec.close()
	ro.cancel(ErrRolloutClosed)
}

func validRolloutID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, c := range id {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._-~", c)
		if !ok {
			return false
		}
	}
	return id != "." && id != ".."
}

func (g *Gateway) rolloutEndpoint(h endpoint) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		g.mu.Lock()
		ro := g.rollouts[id]
		g.mu.Unlock()
		if ro == nil {
			// Only a caller holding an open rollout's key learns that this
			// id is not open: without one the answer is the same 401 as
			// for an open rollout, so ids cannot be probed.
			owner := g.keyOwner(r)
			if owner != nil && g.fromOwner(r, owner) {
				g.fail(&routeWriter{ResponseWriter: w, route: r.Method + " " + r.URL.Path}, owner, notFound("rollout_not_found", "rollout %q is not open", id))
				return
			}
			if owner == nil {
				g.unauthorized.Add(1)
			}
			writeError(w, unauthorized())
			return
		}
		g.serveTenant(w, r, ro, h)
	}
}

func (g *Gateway) singleEndpoint(h endpoint) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { g.serveTenant(w, r, g.single, h) }
}

// serveTenant checks the key (and where the tenant requires it, the
// calling process) and runs h under a context that Close cancels.
func (g *Gateway) serveTenant(w http.ResponseWriter, r *http.Request, ro *rollout, h endpoint) {
	if !ro.authorized(r) {
		e := unauthorized()
		// The refusal counts against the rollout whose key was presented
		// (an agent reaching into another rollout), never against the
		// rollout whose URL was targeted; a key nobody holds is counted
		// on the gateway, and so is a key used from outside its owner's
		// process tree (fromOwner): a thief must not get its victim masked.
		owner := g.keyOwner(r)
		switch {
		case owner != nil && g.fromOwner(r, owner):
			g.fail(w, owner, e)
		case owner != nil:
			writeError(w, e)
		default:
			g.unauthorized.Add(1)
			g.log.Debug().Str("rollout", ro.id).Msg("request without a valid key refused")
			writeError(w, e)
		}
		return
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	stop := context.AfterFunc(ro.ctx, func() { cancel(context.Cause(ro.ctx)) })
	defer stop()
	if !g.fromOwner(r.WithContext(ctx), ro) {
		writeError(w, unauthorized()) // the same answer as a wrong key: nothing is revealed
		return
	}
	h(&routeWriter{ResponseWriter: w, route: r.Method + " " + r.URL.Path}, r.WithContext(ctx), ro)
}

// routeWriter carries the request's route to fail, so a refusal recorded
// against a rollout names the route the agent called.
type routeWriter struct {
	http.ResponseWriter
	route string
}

// Flush and Unwrap keep streaming (http.Flusher, http.ResponseController)
// working through the wrapper.
func (w *routeWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *routeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// handleUnknown answers a tenant's request for a route the gateway does not
// serve (or a wrong method), counted against the rollout.
func (g *Gateway) handleUnknown(w http.ResponseWriter, r *http.Request, ro *rollout) {
	g.fail(w, ro, notFound("unknown_url", "no route for %s %s: this server serves POST chat/completions, completions, responses, "+
		"messages and GET models under the rollout's base URL", r.Method, r.URL.Path))
}

// unauthorized is the refusal of a request without a valid key.
func unauthorized() *apiError {
	return &apiError{status: http.StatusUnauthorized, typ: "invalid_request_error", code: "invalid_api_key",
		message: "Incorrect API key provided: send this rollout's key as 'Authorization: Bearer <key>' (or x-api-key)."}
}

// keyOwner is the open rollout whose key r presents, or nil.
func (g *Gateway) keyOwner(r *http.Request) *rollout {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, ro := range g.rollouts {
		if ro.key != nil && ro.authorized(r) {
			return ro
		}
	}
	return nil
}

// Unauthorized counts requests refused for a key no open rollout holds
// (none, or a made-up one).
func (g *Gateway) Unauthorized() int64 { return g.unauthorized.Load() }

// authorized compares the presented key with the tenant's in constant
// time: a bearer token (OpenAI's clients, ANTHROPIC_AUTH_TOKEN) or an
// x-api-key header (Anthropic's clients with ANTHROPIC_API_KEY). The key is
// never logged.
func (ro *rollout) authorized(r *http.Request) bool {
	if ro.key == nil {
		return true
	}
	if k := r.Header.Get("X-Api-Key"); k != "" {
		return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(k)), ro.key) == 1
	}
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(token)), ro.key) == 1
}

// fail answers with an OpenAI error and counts it against the rollout.
func (g *Gateway) fail(w http.ResponseWriter, ro *rollout, e *apiError) {
	g.refuse(w, ro, e, "request refused")
	writeError(w, e)
}

// refuse counts a refusal against the rollout (naming the route the agent
// called) and logs it; the caller writes the error in its API's shape.
func (g *Gateway) refuse(w http.ResponseWriter, ro *rollout, e *apiError, what string) {
	if ro.rec != nil {
		route := ""
		if rw, ok := w.(*routeWriter); ok {
			route = rw.route
		}
		ro.rec.rejectRoute(e, route, g.opts.Now())
	}
	ev := g.log.Debug()
	if e.status >= 500 {
		ev = g.log.Warn()
	}
	ev.Str("rollout", ro.id).Int("status", e.status).Str("param", e.param).Str("error", e.message).Msg(what)
}

func (g *Gateway) handleModels(w http.ResponseWriter, r *http.Request, ro *rollout) {
	writeJSON(w, http.StatusOK, modelList{Object: "list", Data: []modelCard{{ID: g.opts.Model, Object: "model", Created: g.created, OwnedBy: "ortrain"}}})
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}

type modelCard struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (g *Gateway) weightVersion() int {
	if g.opts.WeightVersion == nil {
		return 0
	}
	return g.opts.WeightVersion()
}
