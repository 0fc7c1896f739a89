package engineserver

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/engineserver/servetest"
)

// TestRunServesUntilCancelled: Run answers on the listener; cancelling its
// context lets an in-flight completion finish, then Run returns nil and the
// port is closed.
func TestRunServesUntilCancelled(t *testing.T) {
	backend := servetest.NewBackend(0)
	srv := NewServer(backend, Options{ModelName: "toy", Batch: engine.BuiltinOptions{MaxBatch: 4}})
	t.Cleanup(func() { srv.Close() })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "http://" + l.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, l, srv) }()

	code, _ := get(t, url+"/health")
	require.Equal(t, 200, code)

	backend.Delay = 300 * time.Millisecond
	inflight := make(chan int, 1)
	go func() {
		c, _ := post(t, url+"/v1/completions", `{"model":"toy","prompt":[1],"max_tokens":2,"seed":1}`)
		inflight <- c
	}()
	require.Eventually(t, func() bool { return backend.Batches.Load() >= 1 }, 5*time.Second, time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(shutdownGrace + 5*time.Second):
		t.Fatal("Run did not return after cancel")
	}
	assert.Equal(t, 200, <-inflight, "the in-flight request finished during shutdown")
	_, err = net.DialTimeout("tcp", l.Addr().String(), time.Second)
	assert.Error(t, err, "the listener is closed")
}

// TestRunReportsServeErrors: a listener that fails ends Run with an error.
func TestRunReportsServeErrors(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, l.Close())
	err = Run(context.Background(), l, NewServer(servetest.NewBackend(0), Options{ModelName: "toy"}))
	assert.ErrorContains(t, err, "serve:")
}
