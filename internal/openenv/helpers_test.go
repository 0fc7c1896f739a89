package openenv_test

import (
	"context"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/openenv"
	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

// killableListener tracks every accepted connection so a test can cut them
// all at once, as if the server process died.
type killableListener struct {
	net.Listener
	mu       sync.Mutex
	conns    []net.Conn
	once     sync.Once
	closeErr error
}

func (l *killableListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

// Close is idempotent, so the kit's Shutdown after a kill is clean.
func (l *killableListener) Close() error {
	l.once.Do(func() { l.closeErr = l.Listener.Close() })
	return l.closeErr
}

func (l *killableListener) kill() {
	_ = l.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		_ = c.Close()
	}
}

type kit struct {
	url  string
	srv  *openenvserver.Server
	kill func()
}

// serveKit runs env with the kit on 127.0.0.1:0 until the test ends.
func serveKit(t *testing.T, env *openenvserver.Env, opts openenvserver.Options) kit {
	t.Helper()
	srv, err := openenvserver.New(opts, env)
	require.NoError(t, err)
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l := &killableListener{Listener: inner}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, srv.Shutdown(ctx))
		<-done
	})
	return kit{url: "http://" + inner.Addr().String(), srv: srv, kill: l.kill}
}

// fastOptions keep failing tests short; capacity retries do not sleep long.
func fastOptions() openenv.Options {
	return openenv.Options{ReplyTimeout: 5 * time.Second, OpenTimeout: 5 * time.Second, CloseTimeout: 2 * time.Second, CapacityWait: 30 * time.Second}
}

func newClient(t *testing.T, url string, opts openenv.Options) *openenv.Client {
	t.Helper()
	c, err := openenv.NewClient(url, opts)
	require.NoError(t, err)
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// settleGoroutines waits until the goroutine count is back to at most
// base, which shows nothing leaked.
func settleGoroutines(t *testing.T, base int) {
	t.Helper()
	// Polled here, not with require.Eventually, whose own goroutine would
	// count.
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	require.LessOrEqual(t, runtime.NumGoroutine(), base, "goroutines leaked")
}

func orsOptions() orsserver.Options { return orsserver.Options{} }
