// Package vllmguard is a reverse proxy that requires an API key on every
// route of the server behind it. vLLM's --api-key guards only /v1 (and
// /v2, /inference, /cohere in newer releases): its control routes (/pause,
// /resume, /is_paused, /collective_rpc, /reset_prefix_cache) answer anyone.
// ortrain therefore binds a replica to 127.0.0.1 and serves the address the
// user asked for through a Guard.
package vllmguard

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// Options configure a Guard. Zero durations and sizes take the defaults.
type Options struct {
	// Upstream is the guarded server's base URL (http://127.0.0.1:PORT).
	Upstream string
	// APIKey is required as "Authorization: Bearer KEY" on every route,
	// /health included. It is also passed on upstream, which may check it
	// too (vLLM does on /v1).
	APIKey string
	// MaxBodyBytes caps a request body (default 64 MiB); larger ones get 413.
	MaxBodyBytes int64
	// MaxConcurrent caps requests in flight (default 1024); more get 503.
	MaxConcurrent int
	// ReadHeaderTimeout bounds reading a request's headers (default 10s).
	ReadHeaderTimeout time.Duration
	// BodyReadTimeout bounds reading a request's body (default 2 min). It is
	// not http.Server.ReadTimeout: that deadline would also end the
	// connection's read while the answer is still streaming, and with it
	// the request's context.
	BodyReadTimeout time.Duration
	// IdleTimeout closes a keep-alive connection idle this long (default 2 min).
	IdleTimeout time.Duration
	// DialTimeout bounds connecting upstream (default 10s).
	DialTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for upstream's answer to begin
	// (default 30 min): a non-streaming generation or a collective_rpc
	// weight reload sends nothing until it is done.
	ResponseHeaderTimeout time.Duration
	// ShutdownTimeout bounds the graceful part of Serve's shutdown (default
	// 10s); requests still running then are cut off.
	ShutdownTimeout time.Duration
	// Logger receives refusals (debug) and upstream failures (warn); never
	// the key or any header.
	Logger zerolog.Logger
}

// Defaults of Options.
const (
	DefaultMaxBodyBytes          = 64 << 20
	DefaultMaxConcurrent         = 1024
	DefaultReadHeaderTimeout     = 10 * time.Second
	DefaultBodyReadTimeout       = 2 * time.Minute
	DefaultIdleTimeout           = 2 * time.Minute
	DefaultDialTimeout           = 10 * time.Second
	DefaultResponseHeaderTimeout = 30 * time.Minute
	DefaultShutdownTimeout       = 10 * time.Second
)

func (o *Options) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	def(&o.BodyReadTimeout, DefaultBodyReadTimeout)
	def(&o.IdleTimeout, DefaultIdleTimeout)
	def(&o.DialTimeout, DefaultDialTimeout)
	def(&o.ResponseHeaderTimeout, DefaultResponseHeaderTimeout)
	def(&o.ShutdownTimeout, DefaultShutdownTimeout)
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.MaxConcurrent <= 0 {
		o.MaxConcurrent = DefaultMaxConcurrent
	}
}

// Guard is the proxy. It is an http.Handler; Serve runs it on a listener
// with the client-side deadlines of Options.
type Guard struct {
	opts      Options
	want      [sha256.Size]byte // sha256("Bearer KEY"): compared without leaking the key's length
	proxy     *httputil.ReverseProxy
	transport *http.Transport
	slots     chan struct{}
	refused   atomic.Int64

	mu      sync.Mutex
	addr    net.Addr
	serving bool
}

// New checks opts and builds a Guard; nothing listens until Serve.
func New(opts Options) (*Guard, error) {
	opts.defaults()
	if opts.APIKey == "" {
		return nil, errors.New("vllmguard: an API key is required (the guard exists to demand one)")
	}
	up, err := url.Parse(opts.Upstream)
	if err != nil || (up.Scheme != "http" && up.Scheme != "https") || up.Host == "" {
		return nil, fmt.Errorf("vllmguard: upstream %q must look like http://HOST:PORT", opts.Upstream)
	}
	g := &Guard{opts: opts, want: sha256.Sum256([]byte("Bearer " + opts.APIKey)), slots: make(chan struct{}, opts.MaxConcurrent)}
	g.transport = &http.Transport{
		Proxy:                 nil, // upstream is on this machine: never through HTTP_PROXY
		DialContext:           (&net.Dialer{Timeout: opts.DialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		ResponseHeaderTimeout: opts.ResponseHeaderTimeout,
		MaxIdleConnsPerHost:   min(opts.MaxConcurrent, 256),
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true, // pass bodies through as upstream encoded them
	}
	g.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			pr.SetXForwarded()
		},
		Transport: g.transport,
		// Flush every write: SSE chunks reach the client as upstream sends them.
		FlushInterval: -1,
		ErrorHandler:  g.upstreamError,
	}
	return g, nil
}

// Refused counts requests refused for a missing or wrong key.
func (g *Guard) Refused() int64 { return g.refused.Load() }

// Addr is the address Serve listens on; nil before Serve.
func (g *Guard) Addr() net.Addr {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.addr
}

// ServeHTTP checks the key, then the body size and the concurrency cap, and
// forwards the request.
func (g *Guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	got := sha256.Sum256([]byte(r.Header.Get("Authorization")))
	if subtle.ConstantTimeCompare(got[:], g.want[:]) != 1 {
		g.refused.Add(1)
		g.opts.Logger.Debug().Str("method", r.Method).Str("path", r.URL.Path).Str("remote", r.RemoteAddr).Msg("vllmguard: refused (missing or wrong API key)")
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "Unauthorized"}) // vLLM's own answer
		return
	}
	if r.ContentLength > g.opts.MaxBodyBytes {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body of %d bytes exceeds the limit of %d", r.ContentLength, g.opts.MaxBodyBytes))
		return
	}
	select {
	case g.slots <- struct{}{}:
		defer func() { <-g.slots }()
	default:
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("more than %d requests in flight; retry", g.opts.MaxConcurrent))
		return
	}
	if r.Body != nil && r.Body != http.NoBody {
		b := g.boundBody(w, r)
		r = r.WithContext(context.WithValue(r.Context(), bodyKey{}, b))
		r.Body = b
	}
	g.proxy.ServeHTTP(w, r)
}

// boundBody caps the body and puts a read deadline on it that is lifted
// once the body is read. Requests without a body get none: the server's
// background read of their connection starts at once, and a deadline there
// would cancel the request's context mid-answer.
func (g *Guard) boundBody(w http.ResponseWriter, r *http.Request) *deadlineBody {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(g.opts.BodyReadTimeout)) // unsupported only on writers we do not use
	return &deadlineBody{ReadCloser: http.MaxBytesReader(w, r.Body, g.opts.MaxBodyBytes), rc: rc}
}

// upstreamError answers what the proxy could not forward.
func (g *Guard) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	// The server cancels the request when reading its body fails, so the
	// proxy may report only the cancellation: ask the body itself.
	if b, ok := r.Context().Value(bodyKey{}).(*deadlineBody); ok {
		if cerr := b.failed.Load(); cerr != nil {
			err = cerr
		}
	}
	var mbe *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &mbe):
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body exceeds the limit of %d bytes", mbe.Limit))
	case errors.As(err, new(*clientBodyError)) && errors.As(err, &ne) && ne.Timeout():
		writeError(w, http.StatusRequestTimeout, fmt.Sprintf("request body not received within %s", g.opts.BodyReadTimeout))
	case errors.As(err, new(*clientBodyError)):
		writeError(w, http.StatusBadRequest, "request body incomplete: "+err.Error())
	case r.Context().Err() != nil:
		// The client went away; nobody reads the answer.
		w.WriteHeader(http.StatusBadGateway)
	case errors.As(err, &ne) && ne.Timeout():
		g.opts.Logger.Warn().Err(err).Str("method", r.Method).Str("path", r.URL.Path).Msg("vllmguard: upstream timed out")
		writeError(w, http.StatusGatewayTimeout, "upstream server did not answer in time")
	default:
		g.opts.Logger.Warn().Err(err).Str("method", r.Method).Str("path", r.URL.Path).Msg("vllmguard: upstream unreachable")
		writeError(w, http.StatusBadGateway, "upstream server unreachable: "+err.Error())
	}
}

// Serve answers on l until ctx ends, then shuts down: it stops accepting,
// lets requests in flight finish for ShutdownTimeout, and cuts off the rest.
// It returns nil after a shutdown asked for by ctx, or the error that ended
// serving. A Guard serves one listener once.
func (g *Guard) Serve(ctx context.Context, l net.Listener) error {
	g.mu.Lock()
	if g.serving {
		g.mu.Unlock()
		return errors.New("vllmguard: Serve called twice")
	}
	g.serving, g.addr = true, l.Addr()
	g.mu.Unlock()
	srv := &http.Server{Handler: g, ReadHeaderTimeout: g.opts.ReadHeaderTimeout, IdleTimeout: g.opts.IdleTimeout,
		MaxHeaderBytes: 1 << 20, ErrorLog: zerologStd(g.opts.Logger)}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	defer g.transport.CloseIdleConnections()
	select {
	case err := <-errc:
		return fmt.Errorf("vllmguard: serve on %s: %w", l.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), g.opts.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		g.opts.Logger.Warn().Err(err).Str("addr", l.Addr().String()).Msg("vllmguard: requests still running at shutdown were cut off")
		_ = srv.Close()
	}
	<-errc // http.ErrServerClosed
	return nil
}

// deadlineBody lifts the body's read deadline once the body has been read
// to its end: then the server starts its background read of the
// connection, where the deadline would otherwise fire while the answer is
// still streaming and cancel the request. After a failed read the deadline
// stays, so the server's own drain of the rest cannot hang either.
type deadlineBody struct {
	io.ReadCloser
	rc     *http.ResponseController
	failed atomic.Pointer[clientBodyError] // the read that failed, for upstreamError
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == io.EOF:
		_ = b.rc.SetReadDeadline(time.Time{})
	case err != nil:
		cerr := &clientBodyError{err}
		b.failed.CompareAndSwap(nil, cerr)
		err = cerr
	}
	return n, err
}

// bodyKey finds a request's deadlineBody in its context (the proxy hands
// its error handler a request whose body it has wrapped).
type bodyKey struct{}

// clientBodyError marks a failure to read the client's body (too slow, too
// large, cut off), so it is not reported as upstream's fault.
type clientBodyError struct{ err error }

func (e *clientBodyError) Error() string { return "read request body: " + e.err.Error() }
func (e *clientBodyError) Unwrap() error { return e.err }

// writeError answers in vLLM's error shape, {"error":{"message",...}}.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": http.StatusText(status), "code": status}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// zerologStd routes net/http's own complaints (bad requests, TLS probes)
// to the logger at debug level.
func zerologStd(l zerolog.Logger) *log.Logger { return log.New(debugWriter{l}, "", 0) }

type debugWriter struct{ l zerolog.Logger }

func (d debugWriter) Write(p []byte) (int, error) {
	d.l.Debug().Msg("vllmguard: " + strings.TrimSpace(string(p)))
	return len(p), nil
}
