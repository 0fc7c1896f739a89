// Package envs holds ortrain's built-in environments: echo (the TRL test
// fixture), letters (the CPU demo) and lockbox (the two-turn tool-use CPU
// demo: read a code, then unlock with it), written for ORS with orsserver
// and also servable over OpenEnv as MCP envs; guess (a Gym-style game) and
// mcp-echo (OpenEnv's echo env), written for OpenEnv with openenvserver.
package envs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

// Protocol is an environment standard.
type Protocol string

// The protocols a built-in can speak.
const (
	ProtocolORS     Protocol = "ors"
	ProtocolOpenEnv Protocol = "openenv"
)

// builtin is one registry entry: an ORS env (servable over both
// protocols) or an OpenEnv-only env.
type builtin struct {
	ors         func() *orsserver.Env
	openenv     func() *openenvserver.Env
	description string // for OpenEnv-only envs
}

func (b builtin) protocol() Protocol {
	if b.ors != nil {
		return ProtocolORS
	}
	return ProtocolOpenEnv
}

// builtins maps a registry key to its constructor (read-only).
var builtins = map[string]builtin{
	"echo":     {ors: Echo},
	"letters":  {ors: Letters},
	"ladder":   {ors: Ladder},
	"lockbox":  {ors: Lockbox},
	"guess":    {openenv: Guess},
	"mcp-echo": {openenv: MCPEcho, description: "OpenEnv's echo env (MCP): tools echo_message and echo_with_length"},
}

// Info describes one built-in env.
type Info struct {
	Key         string // registry key (ortrain env serve KEY, builtin:KEY)
	EnvName     string // ORS env name (path segment) or OpenEnv metadata name
	Description string
	// Protocol is the env's native protocol; ORS envs can also be served
	// over OpenEnv (as MCP envs), OpenEnv envs only over OpenEnv.
	Protocol Protocol
}

// Names lists the registry keys in sorted order.
func Names() []string {
	names := make([]string, 0, len(builtins))
	for k := range builtins {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// List describes every built-in env, sorted by key.
func List() []Info {
	var out []Info
	for _, k := range Names() {
		b := builtins[k]
		info := Info{Key: k, Protocol: b.protocol(), Description: b.description}
		if b.ors != nil {
			e := b.ors()
			info.EnvName, info.Description = e.Name, e.Description
		} else {
			e := b.openenv()
			info.EnvName = e.Name
			if info.Description == "" {
				info.Description = e.Description
			}
		}
		out = append(out, info)
	}
	return out
}

// ProtocolError is a built-in env asked for over a protocol it cannot be
// served over (an OpenEnv env over ORS).
type ProtocolError struct {
	Key      string
	Protocol Protocol
}

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("built-in environment %q speaks OpenEnv only; it cannot be served over %s (use protocol openenv)", e.Key, e.Protocol)
}

func lookup(key string) (builtin, error) {
	b, ok := builtins[strings.ToLower(key)]
	if !ok {
		return builtin{}, fmt.Errorf("unknown built-in environment %q (available: %s)", key, strings.Join(Names(), ", "))
	}
	return b, nil
}

// ProtocolOf is the native protocol of the built-in env key.
func ProtocolOf(key string) (Protocol, error) {
	b, err := lookup(key)
	if err != nil {
		return "", err
	}
	return b.protocol(), nil
}

// New returns a fresh ORS declaration of the built-in env key; OpenEnv-only
// envs have none.
func New(key string) (*orsserver.Env, error) {
	b, err := lookup(key)
	if err != nil {
		return nil, err
	}
	if b.ors == nil {
		return nil, &ProtocolError{Key: key, Protocol: ProtocolORS}
	}
	return b.ors(), nil
}

// NewOpenEnv returns a fresh OpenEnv declaration of the built-in env key:
// its own, or its ORS declaration served as an MCP env.
func NewOpenEnv(key string) (*openenvserver.Env, error) {
	b, err := lookup(key)
	if err != nil {
		return nil, err
	}
	if b.openenv != nil {
		return b.openenv(), nil
	}
	return openenvserver.FromORS(b.ors()), nil
}

// Listen serves the built-in env key over ORS on addr (host:port; port 0
// picks a free one). It returns the base URL, the server (for Stats) and
// stop, which shuts the server down and tears down live sessions. Serving
// stops when ctx ends.
func Listen(ctx context.Context, key, addr string, opts orsserver.Options) (url string, srv *orsserver.Server, stop func(context.Context) error, err error) {
	env, err := New(key)
	if err != nil {
		return "", nil, nil, err
	}
	return listenORS(ctx, env, addr, opts)
}

func listenORS(ctx context.Context, env *orsserver.Env, addr string, opts orsserver.Options) (url string, srv *orsserver.Server, stop func(context.Context) error, err error) {
	srv, err = orsserver.New(opts, env)
	if err != nil {
		return "", nil, nil, err
	}
	url, stop, err = serveOn(ctx, addr, srv)
	if err != nil {
		return "", nil, nil, err
	}
	return url, srv, stop, nil
}

// ServeLocal serves the built-in env key over ORS on 127.0.0.1 at a free
// port; this is what a `builtin:NAME` target means for an ORS env.
func ServeLocal(ctx context.Context, key string, opts orsserver.Options) (url string, srv *orsserver.Server, stop func(context.Context) error, err error) {
	return Listen(ctx, key, "127.0.0.1:0", opts)
}

// ServeOptions tune the server of either protocol.
type ServeOptions struct {
	ORS     orsserver.Options
	OpenEnv openenvserver.Options
	// ToolLatency makes every tool call (an OpenEnv-native env: every
	// step) sleep this long first, bounded by the call's context; 0: none.
	ToolLatency time.Duration
}

// Served is a running built-in server. Exactly one of ORS and OpenEnv is
// set, by Protocol.
type Served struct {
	URL      string
	Protocol Protocol
	ORS      *orsserver.Server
	OpenEnv  *openenvserver.Server
	// Stop shuts the server down (idempotent).
	Stop func(context.Context) error
}

// ListenProtocol serves the built-in env key over protocol ("" for its
// native one) on addr. ORS envs can be served over OpenEnv (as MCP envs);
// OpenEnv envs only over OpenEnv. Serving stops when ctx ends.
func ListenProtocol(ctx context.Context, key string, protocol Protocol, addr string, opts ServeOptions) (*Served, error) {
	b, err := lookup(key)
	if err != nil {
		return nil, err
	}
	if protocol == "" {
		protocol = b.protocol()
	}
	switch protocol {
	case ProtocolORS:
		if b.ors == nil {
			return nil, &ProtocolError{Key: key, Protocol: ProtocolORS}
		}
		url, srv, stop, err := listenORS(ctx, withToolLatency(b.ors(), opts.ToolLatency), addr, opts.ORS)
		if err != nil {
			return nil, err
		}
		return &Served{URL: url, Protocol: ProtocolORS, ORS: srv, Stop: stop}, nil
	case ProtocolOpenEnv:
		var env *openenvserver.Env
		if b.openenv != nil {
			env = withOpenEnvLatency(b.openenv(), opts.ToolLatency)
		} else {
			env = openenvserver.FromORS(withToolLatency(b.ors(), opts.ToolLatency))
		}
		srv, err := openenvserver.New(opts.OpenEnv, env)
		if err != nil {
			return nil, err
		}
		url, stop, err := serveOn(ctx, addr, srv)
		if err != nil {
			return nil, err
		}
		return &Served{URL: url, Protocol: ProtocolOpenEnv, OpenEnv: srv, Stop: stop}, nil
	}
	return nil, fmt.Errorf("unknown protocol %q (want %s or %s)", protocol, ProtocolORS, ProtocolOpenEnv)
}

// ServeLocalProtocol serves the built-in env key over protocol ("" for its
// native one) on 127.0.0.1 at a free port: what `builtin:NAME` with a
// protocol means.
func ServeLocalProtocol(ctx context.Context, key string, protocol Protocol, opts ServeOptions) (*Served, error) {
	return ListenProtocol(ctx, key, protocol, "127.0.0.1:0", opts)
}

// server is what both kits' servers offer.
type server interface {
	Serve(net.Listener) error
	Shutdown(context.Context) error
}

func serveOn(ctx context.Context, addr string, srv server) (string, func(context.Context) error, error) {
	l, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		_ = srv.Shutdown(context.Background())
		return "", nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(l) }()
	unwatch := context.AfterFunc(ctx, func() { _ = srv.Shutdown(context.Background()) })
	var once sync.Once
	var stopErr error
	stop := func(sctx context.Context) error {
		once.Do(func() {
			unwatch()
			stopErr = srv.Shutdown(sctx)
			if serr := <-serveErr; serr != nil && !errors.Is(serr, net.ErrClosed) {
				stopErr = errors.Join(stopErr, serr)
			}
		})
		return stopErr
	}
	return "http://" + l.Addr().String(), stop, nil
}
