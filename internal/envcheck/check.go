// Package envcheck is a conformance suite for env servers: it speaks to a
// live ORS or OpenEnv server over raw HTTP and WebSocket (never through
// ortrain's own clients, which tolerate what a Python client would not)
// and records each case as a verdict.Check with what the standard
// expects and what the server did. `ortrain env check URL` runs it.
package envcheck

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/ortrain/ortrain/internal/verdict"
)

// Protocols a server can be checked against.
const (
	ORS     = "ors"
	OpenEnv = "openenv"
)

// Options shape a check.
type Options struct {
	// Protocol pins ORS or OpenEnv; "" detects it (GET /schema answers
	// OpenEnv's schema, GET /list_environments ORS's env list).
	Protocol string
	// Env is the ORS environment to check ("" = the URL's path segment,
	// else the first of /list_environments).
	Env string
	// Split is the ORS split to draw tasks from ("" = the first split).
	Split string
	// RequestTimeout bounds each request (default 10s); CallTimeout a
	// tool call or an episode step (default 60s).
	RequestTimeout, CallTimeout time.Duration
	// Header is sent with every request (an API key, for instance); its
	// values never appear in the verdict.
	Header http.Header
	// Client makes the HTTP requests (default: a new client without a
	// global timeout; each request has its own deadline).
	Client *http.Client
}

func (o Options) withDefaults() Options {
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 10 * time.Second
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = 60 * time.Second
	}
	if o.Client == nil {
		o.Client = &http.Client{}
	}
	return o
}

// ErrBadTarget: the target is not an http(s) URL.
var ErrBadTarget = errors.New("env check needs an http:// or https:// URL")

// ErrUnknownProtocol: Options.Protocol is neither ors nor openenv.
var ErrUnknownProtocol = errors.New("protocol must be ors, openenv or empty (detect)")

// Check runs the suite against target. The error is for unusable input
// (a target that is not a URL, an unknown protocol) or a cancelled
// context; a server that fails the standard, or cannot be reached, is a
// verdict with failed checks.
func Check(ctx context.Context, target string, o Options) (*verdict.Verdict, error) {
	o = o.withDefaults()
	u, err := url.Parse(strings.TrimSpace(target))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: %q", ErrBadTarget, target)
	}
	start := time.Now()
	r := &recorder{v: &verdict.Verdict{Suite: "env check", Target: u.String()}}
	proto := o.Protocol
	switch proto {
	case ORS, OpenEnv:
	case "":
		proto = detect(ctx, u, o, r)
	default:
		return nil, fmt.Errorf("%w: %q", ErrUnknownProtocol, o.Protocol)
	}
	switch proto {
	case ORS:
		r.v.Suite = "env check (ORS)"
		checkORS(ctx, u, o, r)
	case OpenEnv:
		r.v.Suite = "env check (OpenEnv)"
		checkOpenEnv(ctx, u, o, r)
	}
	r.v.Duration = time.Since(start)
	if err := ctx.Err(); err != nil {
		return r.v, err
	}
	return r.v, nil
}

// detect names the protocol target speaks, recording the detection as a
// check; "" when it speaks neither.
func detect(ctx context.Context, u *url.URL, o Options, r *recorder) string {
	var proto string
	r.run("protocol detected", "GET /schema answers OpenEnv's action/observation schema, or GET /list_environments an ORS env list", func() (string, bool) {
		base := origin(u)
		var schema struct {
			Action      map[string]any `json:"action"`
			Observation map[string]any `json:"observation"`
		}
		if res, err := getJSON(ctx, o, base+"/schema", &schema); err == nil && res.Status == http.StatusOK && schema.Action != nil && schema.Observation != nil {
			proto = OpenEnv
			return "OpenEnv (GET /schema)", true
		}
		var names []string
		res, err := getJSON(ctx, o, base+"/list_environments", &names)
		if err == nil && res.Status == http.StatusOK {
			proto = ORS
			return "ORS (GET /list_environments)", true
		}
		if err != nil {
			return fmt.Sprintf("neither protocol: %v (pin one with --protocol)", err), false
		}
		return fmt.Sprintf("neither protocol: GET /list_environments answered HTTP %d (pin one with --protocol)", res.Status), false
	})
	return proto
}

// recorder appends checks to a verdict.
type recorder struct {
	v *verdict.Verdict
}

// run records the check name: f returns what it observed and whether that
// meets expected.
func (r *recorder) run(name, expected string, f func() (observed string, ok bool)) bool {
	start := time.Now()
	observed, ok := f()
	status := verdict.Pass
	if !ok {
		status = verdict.Fail
	}
	r.v.Checks = append(r.v.Checks, verdict.Check{Name: name, Status: status, Expected: expected, Observed: observed, Duration: time.Since(start)})
	return ok
}

// skip records name as skipped, saying why.
func (r *recorder) skip(name, why string) {
	r.v.Checks = append(r.v.Checks, verdict.Check{Name: name, Status: verdict.Skip, Observed: why})
}

// origin is u's scheme and host ("http://127.0.0.1:8080").
func origin(u *url.URL) string { return u.Scheme + "://" + u.Host }
