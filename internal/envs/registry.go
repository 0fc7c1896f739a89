// Package envs holds ortrain's built-in ORS environments, served by the
// orsserver kit: echo (the TRL test fixture) and letters (the CPU demo).
package envs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"

	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

// builtins maps a registry key to its constructor (read-only).
var builtins = map[string]func() *orsserver.Env{
	"echo":    Echo,
	"letters": Letters,
}

// Info describes one built-in env.
type Info struct {
	Key         string // registry key (ortrain env serve KEY, builtin:KEY)
	EnvName     string // ORS env name (path segment)
	Description string
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
		e := builtins[k]()
		out = append(out, Info{Key: k, EnvName: e.Name, Description: e.Description})
	}
	return out
}

// New returns a fresh declaration of the built-in env key.
func New(key string) (*orsserver.Env, error) {
	ctor, ok := builtins[strings.ToLower(key)]
	if !ok {
		return nil, fmt.Errorf("unknown built-in environment %q (available: %s)", key, strings.Join(Names(), ", "))
	}
	return ctor(), nil
}

// Listen serves the built-in env key on addr (host:port; port 0 picks a free
// one). It returns the base URL, the server (for Stats) and stop, which shuts
// the server down and tears down live sessions. Serving stops when ctx ends.
func Listen(ctx context.Context, key, addr string, opts orsserver.Options) (url string, srv *orsserver.Server, stop func(context.Context) error, err error) {
	env, err := New(key)
	if err != nil {
		return "", nil, nil, err
	}
	srv, err = orsserver.New(opts, env)
	if err != nil {
		return "", nil, nil, err
	}
	l, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		_ = srv.Shutdown(context.Background())
		return "", nil, nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(l) }()
	unwatch := context.AfterFunc(ctx, func() { _ = srv.Shutdown(context.Background()) })
	var once sync.Once
	var stopErr error
	stop = func(sctx context.Context) error {
		once.Do(func() {
			unwatch()
			stopErr = srv.Shutdown(sctx)
			if serr := <-serveErr; serr != nil && !errors.Is(serr, net.ErrClosed) {
				stopErr = errors.Join(stopErr, serr)
			}
		})
		return stopErr
	}
	return "http://" + l.Addr().String(), srv, stop, nil
}

// ServeLocal serves the built-in env key on 127.0.0.1 at a free port; this is
// what a `builtin:NAME` target means.
func ServeLocal(ctx context.Context, key string, opts orsserver.Options) (url string, srv *orsserver.Server, stop func(context.Context) error, err error) {
	return Listen(ctx, key, "127.0.0.1:0", opts)
}
