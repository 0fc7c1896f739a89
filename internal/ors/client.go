package ors

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/backoff"
)

// Options configure a Client. Zero values take the Python SDK's defaults.
type Options struct {
	// APIKey is sent as X-API-Key; empty means OPENREWARD_API_KEY.
	APIKey string
	// Getenv reads OPENREWARD_API_KEY, OPENREWARD_URL, OPENREWARD_API_URL and
	// OPENREWARD_SESSION_URL (nil: none are set).
	Getenv func(string) string
	// HTTPClient is shared by every request; nil builds one whose transport
	// keeps thousands of idle loopback/keep-alive connections per host.
	HTTPClient *http.Client
	Logger     zerolog.Logger
	UserAgent  string

	PingInterval time.Duration // default 10 s
	PingTimeout  time.Duration // one ping, retries included, default 30 s
	ReadTimeout  time.Duration // longest SSE silence, default 30 s

	// RequestTimeout bounds one plain JSON request (each attempt), so a
	// server that accepts and never answers cannot hang a run (default 5 min:
	// creating a sandboxed env can take minutes).
	RequestTimeout time.Duration

	RequestAttempts int // plain JSON requests, default 3 (waits 1 s, 2 s)
	CallRetries     int // /call stream retries, default 5 (waits 0.5·2^(n-1) s, cap 10 s)
	CreateRetries   int // /create_session retries, default 3

	// Sleep waits between retries; tests make it instant. Nil: real timers.
	Sleep func(ctx context.Context, d time.Duration) error
}

// Client talks to one ORS environment: a URL target (one origin for
// everything) or a catalog name on the hosted platform. It is safe for
// concurrent use by thousands of sessions: no locks on the request path.
type Client struct {
	opts       Options
	http       *http.Client
	ownsHTTP   bool
	log        zerolog.Logger
	apiKey     string
	sessions   string // origin of the sessions host (all ORS traffic)
	api        string // origin of the platform API host
	envPath    string // "" (bare paths, default env) or "/{env}"
	deployment string // X-Deployment; empty for URL targets
	catalog    bool
	target     string

	// capacityWaits counts 429/503 answers waited out and retried;
	// capacityLogged is when that was last logged (unix ns, 0: never).
	capacityWaits, capacityLogged atomic.Int64
}

// NewClient resolves target:
//   - a URL ("http://127.0.0.1:8080", optionally with an env path segment
//     "http://host:8080/echoenvironment") uses that one origin for everything;
//   - a catalog name ("Owner/Env") goes to https://sessions.<host> and
//     https://api.<host>, host from OPENREWARD_URL (default openreward.ai),
//     each overridable by OPENREWARD_SESSION_URL / OPENREWARD_API_URL, with
//     X-Deployment: Owner/Env; it needs an API key.
func NewClient(target string, opts Options) (*Client, error) {
	getenv := opts.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	setDefault(&opts.PingInterval, 10*time.Second)
	setDefault(&opts.PingTimeout, 30*time.Second)
	setDefault(&opts.ReadTimeout, 30*time.Second)
	setDefault(&opts.RequestTimeout, 5*time.Minute)
	setDefaultInt(&opts.RequestAttempts, 3)
	setDefaultInt(&opts.CallRetries, 5)
	setDefaultInt(&opts.CreateRetries, 3)
	if opts.UserAgent == "" {
		opts.UserAgent = "ortrain-ors"
	}
	c := &Client{opts: opts, log: opts.Logger.With().Str("component", "ors").Str("target", target).Logger(), target: target}
	c.apiKey = opts.APIKey
	if c.apiKey == "" {
		c.apiKey = getenv("OPENREWARD_API_KEY")
	}
	var err error
	switch {
	case strings.Contains(target, "://"):
		err = c.resolveURL(target)
	default:
		err = c.resolveCatalog(target, getenv)
	}
	if err != nil {
		return nil, err
	}
	c.http = opts.HTTPClient
	if c.http == nil {
		c.http = &http.Client{Transport: NewTransport()}
		c.ownsHTTP = true
	}
	return c, nil
}

// NewTransport returns an http.Transport tuned for many concurrent sessions
// against few hosts: unlimited idle connections per host, dropped after 50 s
// idle — before the 60 s keep-alive of the reference and kit servers, so a
// pooled connection is rarely closed under a request.
func NewTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 0
	tr.MaxIdleConnsPerHost = 8192
	tr.MaxConnsPerHost = 0
	tr.IdleConnTimeout = 50 * time.Second
	// Headers of every answer (SSE streams included) come at once; a server
	// that accepts and stays silent is an error, not a hang.
	tr.ResponseHeaderTimeout = 60 * time.Second
	return tr
}

func (c *Client) resolveURL(target string) error {
	u, err := url.Parse(target)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return fmt.Errorf("target %q is not an http(s) URL like http://127.0.0.1:8080", target)
	}
	c.sessions = u.Scheme + "://" + u.Host
	c.api = c.sessions
	if p := strings.Trim(u.Path, "/"); p != "" {
		c.envPath = "/" + p
	}
	return nil
}

func (c *Client) resolveCatalog(name string, getenv func(string) string) error {
	if name == "" || strings.Count(name, "/") > 1 || strings.HasPrefix(name, "/") || strings.HasSuffix(name, "/") || strings.ContainsAny(name, " \t?#:") {
		return fmt.Errorf("env %q is neither a URL (http://host:port) nor a catalog name (Owner/Env)", name)
	}
	c.catalog = true
	c.deployment = name
	web := strings.TrimRight(getenv("OPENREWARD_URL"), "/")
	if web == "" {
		web = "https://openreward.ai"
	}
	wu, err := url.Parse(web)
	if err != nil || wu.Host == "" || (wu.Scheme != "http" && wu.Scheme != "https") {
		// Often a bare host:port meant as the one server to talk to: that is
		// what OPENREWARD_SESSION_URL (or a URL target) is for.
		return fmt.Errorf("OPENREWARD_URL %q is not a URL with a scheme (https://host): it names the platform "+
			"whose api.<host> and sessions.<host> ortrain derives; to send every session to one server set "+
			"OPENREWARD_SESSION_URL=http://host:port, or pass the URL as the env (--env http://host:port)", web)
	}
	if h := wu.Hostname(); getenv("OPENREWARD_SESSION_URL") == "" && (h == "localhost" || net.ParseIP(h) != nil) {
		return fmt.Errorf("OPENREWARD_URL %q is a single server, not a platform with a sessions.%s host: "+
			"set OPENREWARD_SESSION_URL=%s instead, or pass it as the env (--env %s)", web, h, web, web)
	}
	prefixed := func(envVar, prefix string) (string, error) {
		if v := getenv(envVar); v != "" {
			u, err := url.Parse(v)
			if err != nil || u.Host == "" {
				return "", fmt.Errorf("%s %q is not a URL", envVar, v)
			}
			return u.Scheme + "://" + u.Host, nil
		}
		return wu.Scheme + "://" + prefix + wu.Host, nil
	}
	if c.api, err = prefixed("OPENREWARD_API_URL", "api."); err != nil {
		return err
	}
	if c.sessions, err = prefixed("OPENREWARD_SESSION_URL", "sessions."); err != nil {
		return err
	}
	if c.apiKey == "" {
		return &AuthError{URL: c.sessions, MissingKey: true, Detail: "no API key: set OPENREWARD_API_KEY to use catalog environment " + name}
	}
	return nil
}

// BaseURL is the origin all ORS requests go to.
func (c *Client) BaseURL() string { return c.sessions }

// Deployment is the X-Deployment value ("" for URL targets).
func (c *Client) Deployment() string { return c.deployment }

// CloseIdleConnections releases pooled connections of a client-built transport.
func (c *Client) CloseIdleConnections() {
	if c.ownsHTTP {
		c.http.CloseIdleConnections()
	}
}

// request is one plain JSON request.
type request struct {
	method, path string
	body         any
	sid          string
	secrets      string // X-Secrets value
	noDeployment bool   // /delete and /delete_session
	base         string // default: sessions host
	attempts     int    // default: RequestAttempts
}

func (c *Client) newBackoff(base time.Duration) *backoff.Backoff {
	b := backoff.New(base, 10*time.Second)
	b.Jitter = 0.1
	b.Sleep = c.opts.Sleep
	b.Name = "ors"
	b.Logger = c.log
	b.LogOver = 5 * time.Second
	return b
}

// do sends req, retrying network errors and 429/502/503/504 with backoff,
// and decodes a 2xx JSON body into out (if non-nil).
func (c *Client) do(ctx context.Context, req request, out any) error {
	attempts := req.attempts
	if attempts <= 0 {
		attempts = c.opts.RequestAttempts
	}
	bo := c.newBackoff(time.Second)
	var lastErr error
	for attempt := 1; ; attempt++ {
		body, err := c.once(ctx, req)
		if err == nil {
			if out == nil {
				return nil
			}
			if err := json.Unmarshal(body, out); err != nil {
				return &ProtocolError{URL: c.url(req), Detail: fmt.Sprintf("response is not the expected JSON: %v", err)}
			}
			return nil
		}
		lastErr = err
		if !retryable(err) || attempt >= attempts || ctx.Err() != nil {
			return lastErr
		}
		c.noteCapacity(err)
		c.log.Debug().Err(err).Int("attempt", attempt).Str("path", req.path).Msg("retrying ORS request")
		if werr := bo.Wait(ctx); werr != nil {
			return lastErr
		}
	}
}

func (c *Client) url(req request) string {
	base := req.base
	if base == "" {
		base = c.sessions
	}
	return base + req.path
}

// once sends req a single time and returns the body of a 2xx answer.
func (c *Client) once(ctx context.Context, req request) ([]byte, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, c.opts.RequestTimeout,
		fmt.Errorf("%s %s: no answer within %s: %w", req.method, c.url(req), c.opts.RequestTimeout, context.DeadlineExceeded))
	defer cancel()
	var rd io.Reader
	if req.body != nil {
		b, err := MarshalJSON(req.body)
		if err != nil {
			return nil, fmt.Errorf("encode %s body: %w", req.path, err)
		}
		rd = bytes.NewReader(b)
	}
	hr, err := http.NewRequestWithContext(ctx, req.method, c.url(req), rd)
	if err != nil {
		return nil, fmt.Errorf("build %s %s: %w", req.method, req.path, err)
	}
	c.setHeaders(hr, req.sid, req.secrets, !req.noDeployment)
	if req.body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(hr)
	if err != nil {
		return nil, c.transportError(ctx, req.method, c.url(req), err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, c.transportError(ctx, req.method, c.url(req), err)
	}
	if resp.StatusCode/100 != 2 {
		return nil, statusError(req.method, c.url(req), resp.StatusCode, body, req.sid)
	}
	return body, nil
}

func (c *Client) setHeaders(hr *http.Request, sid, secrets string, deployment bool) {
	hr.Header.Set("User-Agent", c.opts.UserAgent)
	if c.apiKey != "" {
		hr.Header.Set("X-API-Key", c.apiKey)
	}
	if deployment && c.deployment != "" {
		hr.Header.Set("X-Deployment", c.deployment)
	}
	if sid != "" {
		hr.Header.Set("X-Session-ID", sid)
	}
	if secrets != "" {
		hr.Header.Set("X-Secrets", secrets)
	}
}

// transportError wraps a failed exchange; dial failures become
// *UnreachableError naming the origin.
func (c *Client) transportError(ctx context.Context, method, u string, err error) error {
	if ctx.Err() != nil {
		if cause := context.Cause(ctx); cause != nil {
			return cause
		}
		return ctx.Err()
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		origin := u
		if pu, perr := url.Parse(u); perr == nil {
			origin = pu.Scheme + "://" + pu.Host
		}
		return &UnreachableError{URL: origin, Err: err}
	}
	return &networkError{err: fmt.Errorf("%s %s: %w", method, u, err)}
}

// networkError is a failed exchange other than a dial failure (reset,
// timeout); it is retried.
type networkError struct{ err error }

func (e *networkError) Error() string { return e.err.Error() }
func (e *networkError) Unwrap() error { return e.err }

// CapacityWaits is how many "busy" answers (429, 503) the client has waited
// out and retried since it was made: the ORS form of a server at capacity.
func (c *Client) CapacityWaits() int64 { return c.capacityWaits.Load() }

// noteCapacity counts a busy answer about to be retried, and logs it at
// info level the first time and then at most once a minute.
func (c *Client) noteCapacity(err error) {
	var se *StatusError
	if !errors.As(err, &se) || (se.StatusCode != http.StatusTooManyRequests && se.StatusCode != http.StatusServiceUnavailable) {
		return
	}
	n := c.capacityWaits.Add(1)
	now, last := time.Now().UnixNano(), c.capacityLogged.Load()
	if (last == 0 || now-last >= int64(time.Minute)) && c.capacityLogged.CompareAndSwap(last, now) {
		c.log.Info().Int("status", se.StatusCode).Int64("capacity_waits", n).
			Msg("ORS server busy: requests wait and retry (counted, logged at most once a minute)")
	}
}

func retryable(err error) bool {
	var ne *networkError
	var ue *UnreachableError
	var se *StatusError
	switch {
	case errors.As(err, &ne), errors.As(err, &ue):
		return true
	case errors.As(err, &se):
		return retryableStatus(se.StatusCode)
	}
	return false
}

func retryableStatus(code int) bool {
	return code == http.StatusTooManyRequests || code == http.StatusBadGateway ||
		code == http.StatusServiceUnavailable || code == http.StatusGatewayTimeout
}

// statusError turns a non-2xx answer into the typed error callers branch on.
func statusError(method, u string, code int, body []byte, sid string) error {
	detail := detailText(body)
	switch code {
	case http.StatusUnauthorized, http.StatusForbidden:
		return &AuthError{URL: u, Detail: detail}
	case http.StatusNotFound:
		switch {
		case strings.Contains(detail, "Active environment not found"):
			return &SessionTerminatedError{SID: sid, Reason: "the server no longer knows this session (reaped or deleted)", Err: &NotFoundError{What: "session", Detail: detail, URL: u}}
		case strings.Contains(detail, "unknown environment"):
			return &NotFoundError{What: "environment", Detail: detail, URL: u}
		case strings.Contains(detail, "Deployment not found"):
			return &NotFoundError{What: "deployment", Detail: detail + " (catalog names are case-sensitive: check Owner/Env)", URL: u}
		}
		return &NotFoundError{What: "route", Detail: detail, URL: u}
	case http.StatusGone:
		return &SessionTerminatedError{SID: sid, Reason: "deleted on the server", Err: &StatusError{Method: method, URL: u, StatusCode: code, Detail: detail}}
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return &InvalidRequestError{URL: u, StatusCode: code, Detail: detail}
	}
	return &StatusError{Method: method, URL: u, StatusCode: code, Detail: detail}
}

// detailText extracts FastAPI's "detail" (a string or a list) or the raw body.
func detailText(body []byte) string {
	var v struct {
		Detail json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(body, &v) == nil && len(v.Detail) > 0 {
		var s string
		if json.Unmarshal(v.Detail, &s) == nil {
			return s
		}
		return string(v.Detail)
	}
	s := strings.TrimSpace(string(body))
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d <= 0 {
		*d = v
	}
}

func setDefaultInt(n *int, v int) {
	if *n <= 0 {
		*n = v
	}
}
