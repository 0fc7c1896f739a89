package ors_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

// kit is an orsserver on loopback with a request log.
type kit struct {
	url string
	srv *orsserver.Server
	mu  sync.Mutex
	log []string // "METHOD /path" of every request the server saw
}

func (k *kit) seen() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.log...)
}

func (k *kit) count(entry string) int {
	n := 0
	for _, e := range k.seen() {
		if e == entry {
			n++
		}
	}
	return n
}

// startKit serves env (default: echo plus a raising tool) and records
// requests; intercept, if set, may answer a request itself.
func startKit(t testing.TB, opts orsserver.Options, intercept func(w http.ResponseWriter, r *http.Request) bool, env ...*orsserver.Env) *kit {
	t.Helper()
	if len(env) == 0 {
		env = []*orsserver.Env{testEcho()}
	}
	k := &kit{}
	opts.Logger = zerolog.Nop()
	opts.Hooks.Intercept = func(w http.ResponseWriter, r *http.Request) bool {
		k.mu.Lock()
		k.log = append(k.log, r.Method+" "+r.URL.Path)
		k.mu.Unlock()
		return intercept != nil && intercept(w, r)
	}
	srv, err := orsserver.New(opts, env...)
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, srv.Shutdown(ctx))
		require.NoError(t, <-done)
	})
	k.url, k.srv = "http://"+l.Addr().String(), srv
	return k
}

func testEcho() *orsserver.Env {
	env := envs.Echo()
	env.Tools = append(env.Tools, orsserver.NewToolNoInput("boom", "raises", func(context.Context, orsserver.Instance) (ors.ToolOutput, error) {
		return ors.ToolOutput{}, errors.New("bad")
	}))
	return env
}

// instant records backoff waits without sleeping.
type instant struct {
	mu    sync.Mutex
	waits []time.Duration
}

func (s *instant) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.waits = append(s.waits, d)
	s.mu.Unlock()
	return ctx.Err()
}

func newClient(t testing.TB, target string, opts ors.Options) *ors.Client {
	t.Helper()
	if opts.Sleep == nil {
		opts.Sleep = (&instant{}).sleep
	}
	c, err := ors.NewClient(target, opts)
	require.NoError(t, err)
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func openSession(t testing.TB, c *ors.Client, spec ors.SessionSpec) *ors.Session {
	t.Helper()
	s, err := c.OpenSession(context.Background(), spec)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}
