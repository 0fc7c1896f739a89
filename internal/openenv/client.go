package openenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/backoff"
)

// Options tune a Client. Zero values take the reference client's defaults.
type Options struct {
	// HTTPClient carries HTTP requests and WebSocket handshakes (default: a
	// fresh client with its own transport).
	HTTPClient *http.Client
	// RequestTimeout bounds each HTTP request (default 30 s).
	RequestTimeout time.Duration
	// OpenTimeout bounds the WebSocket handshake (default 10 s).
	OpenTimeout time.Duration
	// ReplyTimeout bounds the wait for each reply on a socket (default 60 s).
	ReplyTimeout time.Duration
	// WriteTimeout bounds each frame write (default 10 s).
	WriteTimeout time.Duration
	// CloseTimeout bounds Close: the close frame and the server's close
	// (default 5 s).
	CloseTimeout time.Duration
	// KeepAlive is the ping interval on idle sockets, and each ping's
	// timeout (default 20 s, like uvicorn; negative disables pings).
	KeepAlive time.Duration
	// MaxMessageBytes is the largest frame read (default 100 MiB).
	MaxMessageBytes int64
	// CapacityWait bounds how long Start keeps retrying a server at
	// capacity (default 10 min); the delays come from NewBackoff.
	CapacityWait time.Duration
	// NewBackoff builds the backoff of one capacity retry loop (default
	// 100 ms doubling to 5 s, ±50 % jitter).
	NewBackoff func() *backoff.Backoff
	// Token is sent as "Authorization: Bearer <token>" on every HTTP
	// request and WebSocket upgrade (private HF Spaces, secured servers);
	// empty sends none. It is never logged.
	Token string
	// TokenEnv names the environment variable Token came from, so a 401 or
	// 403 can say which variable to set ("" when unknown).
	TokenEnv string
	Logger   zerolog.Logger
}

// Client talks to one OpenEnv server.
type Client struct {
	base   *url.URL
	http   *http.Client
	opts   Options
	log    zerolog.Logger
	nextID atomic.Int64

	// capacityWaits counts capacity refusals Start waited out; ignored
	// counts server frames nobody asked for (dropped, not fatal).
	capacityWaits, ignored  atomic.Int64
	capacityLog, ignoredLog sparseLog
}

// NewClient returns a client for the server at base (http or https; a
// trailing slash is ignored). It does not contact the server.
func NewClient(base string, opts Options) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(base, "/"))
	if err != nil {
		return nil, fmt.Errorf("openenv url %q: %w", base, err)
	}
	switch u.Scheme {
	case "http", "https":
	case "ws":
		u.Scheme = "http"
	case "wss":
		u.Scheme = "https"
	default:
		return nil, fmt.Errorf("openenv url %q: scheme must be http or https", base)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("openenv url %q: no host", base)
	}
	setDefault(&opts.RequestTimeout, 30*time.Second)
	setDefault(&opts.OpenTimeout, 10*time.Second)
	setDefault(&opts.ReplyTimeout, 60*time.Second)
	setDefault(&opts.WriteTimeout, 10*time.Second)
	setDefault(&opts.CloseTimeout, 5*time.Second)
	if opts.KeepAlive == 0 {
		opts.KeepAlive = 20 * time.Second
	}
	if opts.MaxMessageBytes <= 0 {
		opts.MaxMessageBytes = 100 << 20
	}
	setDefault(&opts.CapacityWait, 10*time.Minute)
	if opts.NewBackoff == nil {
		opts.NewBackoff = func() *backoff.Backoff {
			b := backoff.New(100*time.Millisecond, 5*time.Second)
			b.Jitter = 0.5
			return b
		}
	}
	hc := opts.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	return &Client{base: u, http: hc, opts: opts, log: opts.Logger.With().Str("component", "openenv").Logger()}, nil
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d <= 0 {
		*d = v
	}
}

// BaseURL is the server's http(s) URL.
func (c *Client) BaseURL() string { return c.base.String() }

// CloseIdleConnections releases pooled HTTP connections.
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }

func (c *Client) endpoint(path string) string { return c.base.String() + path }

func (c *Client) wsEndpoint(path string) string {
	u := *c.base
	u.Scheme = map[string]string{"http": "ws", "https": "wss"}[u.Scheme]
	return u.String() + path
}

// Metadata is GET /metadata.
type Metadata struct {
	Name             string  `json:"name"`
	Description      string  `json:"description"`
	ReadmeContent    *string `json:"readme_content"`
	Version          string  `json:"version"`
	Author           *string `json:"author"`
	DocumentationURL *string `json:"documentation_url"`
}

// Schema is GET /schema: the JSON Schemas of action, observation and state.
type Schema struct {
	Action      json.RawMessage `json:"action"`
	Observation json.RawMessage `json:"observation"`
	State       json.RawMessage `json:"state"`
}

// IsMCP reports whether the action schema is MCP's CallToolAction (a
// tool_name property): such an env takes list_tools/call_tool actions.
func (s Schema) IsMCP() bool {
	var a struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if json.Unmarshal(s.Action, &a) != nil {
		return false
	}
	_, ok := a.Properties["tool_name"]
	return ok
}

// Health is GET /health; it fails unless the status is "healthy".
func (c *Client) Health(ctx context.Context) error {
	var h struct {
		Status string `json:"status"`
	}
	if err := c.getJSON(ctx, "/health", &h); err != nil {
		return err
	}
	if h.Status != "healthy" {
		return fmt.Errorf("openenv GET %s: status %q, want \"healthy\"", c.endpoint("/health"), h.Status)
	}
	return nil
}

// Metadata is GET /metadata.
func (c *Client) Metadata(ctx context.Context) (Metadata, error) {
	var m Metadata
	return m, c.getJSON(ctx, "/metadata", &m)
}

// Schema is GET /schema.
func (c *Client) Schema(ctx context.Context) (Schema, error) {
	var s Schema
	return s, c.getJSON(ctx, "/schema", &s)
}

// MCP sends one JSON-RPC request to POST /mcp and returns its result.
// params may be nil. Pass "session_id" in params to use a session from
// CreateMCPSession.
func (c *Client) MCP(ctx context.Context, method string, params any) (json.RawMessage, error) {
	req, err := c.rpcRequest(method, params)
	if err != nil {
		return nil, err
	}
	body, err := c.do(ctx, http.MethodPost, "/mcp", req)
	if err != nil {
		return nil, err
	}
	return rpcResult(body)
}

// CreateMCPSession opens an HTTP MCP session (openenv/session/create); it
// counts against the server's capacity until CloseMCPSession or the idle
// reaper.
func (c *Client) CreateMCPSession(ctx context.Context) (string, error) {
	res, err := c.MCP(ctx, "openenv/session/create", nil)
	if err != nil {
		return "", err
	}
	var r struct {
		SessionID string `json:"session_id"`
	}
	if err := json.Unmarshal(res, &r); err != nil || r.SessionID == "" {
		return "", &ProtocolError{Detail: "session/create result has no session_id", Frame: clip(res)}
	}
	return r.SessionID, nil
}

// CloseMCPSession closes an HTTP MCP session.
func (c *Client) CloseMCPSession(ctx context.Context, sessionID string) error {
	_, err := c.MCP(ctx, "openenv/session/close", map[string]string{"session_id": sessionID})
	return err
}

func (c *Client) rpcRequest(method string, params any) ([]byte, error) {
	req := RPCRequest{JSONRPC: "2.0", ID: json.RawMessage(fmt.Sprint(c.nextID.Add(1))), Method: method}
	if params != nil {
		p, err := json.Marshal(params)
		if err != nil {
			return nil, fmt.Errorf("encode %s params: %w", method, err)
		}
		req.Params = p
	}
	return json.Marshal(req)
}

func rpcResult(body []byte) (json.RawMessage, error) {
	var r RPCResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, &ProtocolError{Detail: "json-rpc reply: " + err.Error(), Frame: clip(body)}
	}
	if r.Error != nil {
		return nil, r.Error
	}
	if len(r.Result) == 0 {
		return nil, &ProtocolError{Detail: "json-rpc reply has neither result nor error", Frame: clip(body)}
	}
	return r.Result, nil
}

func (c *Client) getJSON(ctx context.Context, path string, out any) error {
	body, err := c.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(body, out); err != nil {
		return &ProtocolError{Detail: fmt.Sprintf("GET %s: %v", path, err), Frame: clip(body)}
	}
	return nil
}

// do runs one HTTP request under RequestTimeout and returns the 200 body.
func (c *Client) do(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.RequestTimeout)
	defer cancel()
	u := c.endpoint(path)
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, fmt.Errorf("openenv %s %s: %w", method, u, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	c.authorize(req.Header)
	resp, err := c.http.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
			return nil, &TimeoutError{Op: method + " " + path, After: c.opts.RequestTimeout}
		}
		return nil, &ConnectionError{Op: method + " " + path, CloseCode: -1, Err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, c.opts.MaxMessageBytes))
	if err != nil {
		return nil, &ConnectionError{Op: method + " " + path, CloseCode: -1, Err: fmt.Errorf("read body: %w", err)}
	}
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		return nil, c.authError(method, u, resp.StatusCode)
	}
	if resp.StatusCode != http.StatusOK {
		if resp.StatusCode >= 500 {
			// Uvicorn drops the keep-alive connection after a 500 without
			// saying so; never reuse it.
			c.http.CloseIdleConnections()
		}
		he := &HTTPError{Method: method, URL: u, Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"), Body: string(data)}
		var d struct {
			Detail []ValidationIssue `json:"detail"`
		}
		if resp.StatusCode == http.StatusUnprocessableEntity && json.Unmarshal(data, &d) == nil {
			he.Detail = d.Detail
		}
		return nil, he
	}
	return data, nil
}

// authorize adds the bearer token, if any.
func (c *Client) authorize(h http.Header) {
	if c.opts.Token != "" {
		h.Set("Authorization", "Bearer "+c.opts.Token)
	}
}

func (c *Client) authError(method, u string, status int) *AuthError {
	return &AuthError{Method: method, URL: u, Status: status, TokenEnv: c.opts.TokenEnv, TokenSent: c.opts.Token != ""}
}

// CapacityWaits is how many capacity refusals (CAPACITY_REACHED) Start has
// waited out since the client was made, over all its sessions.
func (c *Client) CapacityWaits() int64 { return c.capacityWaits.Load() }

// IgnoredFrames is how many frames the server sent that answered no
// request (unknown frame types, JSON-RPC notifications); they are dropped.
func (c *Client) IgnoredFrames() int64 { return c.ignored.Load() }

// sparseLog lets a repeated event log at once and then at most once per
// interval, so a storm stays visible without a line per event.
type sparseLog struct{ last atomic.Int64 }

func (l *sparseLog) due(every time.Duration) bool {
	now := time.Now().UnixNano()
	last := l.last.Load()
	if last != 0 && now-last < int64(every) {
		return false
	}
	return l.last.CompareAndSwap(last, now)
}

// sparseLogEvery is how often a repeated event is logged again.
const sparseLogEvery = time.Minute

// Info is what Probe found.
type Info struct {
	URL    string
	Schema Schema
	// MCP is true for an env whose actions are MCP tool calls.
	MCP bool
}

// Probe says whether base speaks OpenEnv: GET /health must answer
// {"status":"healthy"} and GET /schema must carry an action schema. A
// server that answers but is not OpenEnv gives *NotOpenEnvError; one that
// cannot be reached gives *NotOpenEnvError wrapping *ConnectionError.
func Probe(ctx context.Context, base string, opts Options) (Info, error) {
	c, err := NewClient(base, opts)
	if err != nil {
		return Info{}, err
	}
	defer c.CloseIdleConnections()
	if err := c.Health(ctx); err != nil {
		return Info{}, &NotOpenEnvError{URL: base, Reason: "GET /health did not answer {\"status\":\"healthy\"}", Err: err}
	}
	s, err := c.Schema(ctx)
	if err != nil {
		return Info{}, &NotOpenEnvError{URL: base, Reason: "GET /schema failed", Err: err}
	}
	var action map[string]json.RawMessage
	if json.Unmarshal(s.Action, &action) != nil || action == nil {
		return Info{}, &NotOpenEnvError{URL: base, Reason: "GET /schema has no action schema"}
	}
	return Info{URL: c.BaseURL(), Schema: s, MCP: s.IsMCP()}, nil
}
