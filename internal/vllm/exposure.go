package vllm

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// openRoutesProbeTimeout bounds each of OpenRoutes' two requests.
const openRoutesProbeTimeout = 10 * time.Second

// OpenRoutes reports which of vLLM's control routes c's server answers
// without the API key. vLLM's --api-key guards only /v1 (and /v2,
// /inference, /cohere in newer releases), so a dev-mode server ortrain did
// not start leaves them open to anyone who reaches it.
//
// Only two harmless requests are sent, both without a key: GET /is_paused
// (a read) and POST /collective_rpc with the body {} (no method: vLLM
// refuses it with 400 "Missing 'method'", a typed server with 422, before
// calling anything). /pause, /resume and /reset_prefix_cache are never
// sent: on older vLLM a probe of /pause would really pause the server. What
// they would answer is inferred from the routers vLLM attaches them with:
// /is_paused, /pause and /resume share one router (the RLHF one), and
// /collective_rpc and /reset_prefix_cache are both dev-mode routes with the
// same (absent) guard.
//
// Per probe: 2xx, 400 or 422 means the route ran without the key (open);
// 401 or 403 means it is guarded; 404 or 405 means it is not served. Any
// other answer, or no answer, is an error naming the probe; the list then
// still holds what the other probe found.
func OpenRoutes(ctx context.Context, c *Client) ([]string, error) {
	anon := c.WithAPIKey("")
	probes := []struct {
		method, path string
		body         any
		routes       []string
	}{
		{http.MethodGet, "/is_paused", nil, []string{"/is_paused", "/pause", "/resume"}},
		{http.MethodPost, "/collective_rpc", map[string]any{}, []string{"/collective_rpc", "/reset_prefix_cache"}},
	}
	var open []string
	var errs []error
	for _, p := range probes {
		pctx, cancel := context.WithTimeout(ctx, openRoutesProbeTimeout)
		answered, err := probeOpen(anon.do(pctx, p.method, p.path, p.body, nil))
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("probe %s %s without the API key: %w", p.method, c.URL()+p.path, err))
			continue
		}
		if answered {
			open = append(open, p.routes...)
		}
	}
	return open, errors.Join(errs...)
}

// probeOpen classifies the answer to a request sent without the key.
func probeOpen(err error) (bool, error) {
	var se *StatusError
	switch {
	case err == nil:
		return true, nil
	case !errors.As(err, &se):
		return false, err
	case se.Code == http.StatusBadRequest || se.Code == http.StatusUnprocessableEntity:
		return true, nil // the handler (or its validation) ran: no key was asked for
	case se.Code == http.StatusUnauthorized || se.Code == http.StatusForbidden,
		se.Code == http.StatusNotFound || se.Code == http.StatusMethodNotAllowed:
		return false, nil
	default:
		return false, err
	}
}
