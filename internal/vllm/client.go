package vllm

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
	"syscall"
	"time"
)

// StatusError is a non-2xx answer from a server. Callers branch on Code
// (5xx and 404-route-missing are treated differently from 400).
type StatusError struct {
	URL     string
	Code    int
	Message string
	// RouteMissing is true when the server has no such route at all (its
	// framework's bare 404), as opposed to a 404 about a named object.
	RouteMissing bool
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s: HTTP %d: %s", e.URL, e.Code, e.Message)
}

// Retryable reports whether err is worth retrying on the same or another
// replica: connection failures (a replica restarting) and 5xx answers.
// Deadlines and cancellations of the caller's context are not.
func Retryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var se *StatusError
	if errors.As(err, &se) {
		return se.Code >= 500
	}
	var ne net.Error
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne)
}

// Client talks to one server. It holds no state beyond the base URL and
// the API key; every call is bounded by its context.
type Client struct {
	base    string
	http    *http.Client
	apiKey  string
	session string
}

// NewClient returns a client for the server at baseURL (http://host:port).
func NewClient(baseURL string, hc *http.Client) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("vllm url %q must look like http://HOST:PORT", baseURL)
	}
	if hc == nil {
		hc = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}}
	}
	return &Client{base: strings.TrimRight(baseURL, "/"), http: hc}, nil
}

// URL is the server's base URL.
func (c *Client) URL() string { return c.base }

// WithAPIKey returns a client that sends key as a Bearer token on every
// request (vLLM's --api-key, serve-engine's the same); "" sends none.
func (c *Client) WithAPIKey(key string) *Client {
	cc := *c
	cc.apiKey = key
	return &cc
}

// WithSessionID returns a client that sends id as X-Session-ID, the header
// session-sticky routers in front of vLLM (vllm_router, SkyRL, prime-rl)
// route on; "" sends none.
func (c *Client) WithSessionID(id string) *Client {
	cc := *c
	cc.session = id
	return &cc
}

// Health returns nil when GET /health answers 200.
func (c *Client) Health(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/health", nil, nil)
}

// Models lists the served model and loaded adapters.
func (c *Client) Models(ctx context.Context) (*ModelList, error) {
	var out ModelList
	if err := c.do(ctx, http.MethodGet, "/v1/models", nil, &out); err != nil {
		return nil, err
	}
	if len(out.Data) == 0 {
		return nil, fmt.Errorf("%s/v1/models lists no model", c.base)
	}
	return &out, nil
}

// Complete posts one completion request.
func (c *Client) Complete(ctx context.Context, req *CompletionRequest) (*CompletionResponse, error) {
	var out CompletionResponse
	if err := c.do(ctx, http.MethodPost, "/v1/completions", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Pause stops generation (mode: PauseWait drains in-flight requests first).
func (c *Client) Pause(ctx context.Context, mode string) error {
	var out PauseResponse
	return c.do(ctx, http.MethodPost, "/pause?mode="+url.QueryEscape(mode), nil, &out)
}

// Resume restarts generation after Pause.
func (c *Client) Resume(ctx context.Context) error {
	var out PauseResponse
	return c.do(ctx, http.MethodPost, "/resume", nil, &out)
}

// IsPaused reports the pause state (a dev-mode route: its absence means the
// server was started without VLLM_SERVER_DEV_MODE=1).
func (c *Client) IsPaused(ctx context.Context) (bool, error) {
	var out IsPausedResponse
	err := c.do(ctx, http.MethodGet, "/is_paused", nil, &out)
	return out.IsPaused, err
}

// ResetPrefixCache drops cached KV blocks computed with older weights.
func (c *Client) ResetPrefixCache(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/reset_prefix_cache", nil, nil)
}

// ReloadWeights makes every worker load the HF safetensors in dir.
func (c *Client) ReloadWeights(ctx context.Context, dir string, timeout time.Duration) error {
	req := CollectiveRPCRequest{Method: "reload_weights", Kwargs: map[string]any{"weights_path": dir}, Timeout: timeout.Seconds()}
	return c.do(ctx, http.MethodPost, "/collective_rpc", &req, nil)
}

// LoadLoRAAdapter loads the PEFT adapter in dir under name.
func (c *Client) LoadLoRAAdapter(ctx context.Context, name, dir string) error {
	return c.do(ctx, http.MethodPost, "/v1/load_lora_adapter", &LoadLoRARequest{LoRAName: name, LoRAPath: dir}, nil)
}

// UnloadLoRAAdapter drops the adapter called name.
func (c *Client) UnloadLoRAAdapter(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodPost, "/v1/unload_lora_adapter", &UnloadLoRARequest{LoRAName: name}, nil)
}

// do sends body as JSON and decodes a JSON answer into out (nil: the body is
// drained and ignored; vLLM answers some routes with plain text).
func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode %s body: %w", path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	if c.session != "" {
		req.Header.Set("X-Session-ID", c.session)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, c.base+path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("read %s: %w", c.base+path, err)
	}
	if resp.StatusCode/100 != 2 {
		return statusError(c.base+path, resp.StatusCode, data)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode %s answer %.200q: %w", c.base+path, data, err)
	}
	return nil
}

// statusError reads vLLM's error shapes: {"error":{"message":...}} (current),
// {"object":"error","message":...} (older), and FastAPI's {"detail":...}
// (a missing route, or a validation error).
func statusError(u string, code int, body []byte) *StatusError {
	e := &StatusError{URL: u, Code: code, Message: strings.TrimSpace(string(body))}
	var nested ErrorResponse
	var flat struct {
		Message string          `json:"message"`
		Detail  json.RawMessage `json:"detail"`
	}
	switch {
	case json.Unmarshal(body, &nested) == nil && nested.Error.Message != "":
		e.Message = nested.Error.Message
	case json.Unmarshal(body, &flat) == nil && flat.Message != "":
		e.Message = flat.Message
	case len(flat.Detail) > 0:
		var s string
		if json.Unmarshal(flat.Detail, &s) == nil {
			e.Message = s
			e.RouteMissing = code == http.StatusNotFound && s == "Not Found"
		} else {
			e.Message = string(flat.Detail)
		}
	}
	if len(e.Message) > 1000 {
		e.Message = e.Message[:1000] + "…"
	}
	return e
}
