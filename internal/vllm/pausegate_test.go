package vllm_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/vllm"
)

// TestPauseGateHoldsNewRequests: while paused, Enter waits until Resume, or
// fails with its context's error.
func TestPauseGateHoldsNewRequests(t *testing.T) {
	g := vllm.NewPauseGate()
	assert.False(t, g.Paused())
	require.NoError(t, g.Pause(context.Background(), vllm.PauseWait), "nothing in flight: returns at once")
	assert.True(t, g.Paused())

	entered := make(chan func(), 1)
	go func() {
		_, leave, err := g.Enter(context.Background())
		assert.NoError(t, err)
		entered <- leave
	}()
	select {
	case <-entered:
		t.Fatal("a request entered while paused")
	case <-time.After(50 * time.Millisecond):
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, _, err := g.Enter(ctx)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "a held request is bounded by its context")

	g.Resume()
	assert.False(t, g.Paused())
	select {
	case leave := <-entered:
		leave()
	case <-time.After(5 * time.Second):
		t.Fatal("the held request did not enter after Resume")
	}
}

// TestPauseGateDrainsOrAborts: wait and keep return once in-flight requests
// leave, without cancelling them; abort cancels them first and reports
// Aborting until Resume.
func TestPauseGateDrainsOrAborts(t *testing.T) {
	tests := []struct {
		mode      string
		cancelled bool
	}{
		{vllm.PauseWait, false},
		{vllm.PauseKeep, false},
		{vllm.PauseAbort, true},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			g := vllm.NewPauseGate()
			rctx, leave, err := g.Enter(context.Background())
			require.NoError(t, err)
			paused := make(chan error, 1)
			go func() { paused <- g.Pause(context.Background(), tt.mode) }()
			if tt.cancelled {
				select {
				case <-rctx.Done():
				case <-time.After(5 * time.Second):
					t.Fatal("abort did not cancel the in-flight request")
				}
				assert.True(t, g.Aborting())
			} else {
				select {
				case err := <-paused:
					t.Fatalf("pause returned (%v) with a request in flight", err)
				case <-time.After(50 * time.Millisecond):
				}
				assert.NoError(t, rctx.Err(), "%s does not cancel in-flight requests", tt.mode)
				assert.False(t, g.Aborting())
			}
			leave()
			select {
			case err := <-paused:
				require.NoError(t, err)
			case <-time.After(5 * time.Second):
				t.Fatal("pause did not return after the request left")
			}
			assert.True(t, g.Paused())
			g.Resume()
			assert.False(t, g.Aborting())
		})
	}
}

// TestPauseGatePauseIsBoundedByContext: a drain that does not finish ends
// with the context's error and leaves the gate paused.
func TestPauseGatePauseIsBoundedByContext(t *testing.T) {
	g := vllm.NewPauseGate()
	_, leave, err := g.Enter(context.Background())
	require.NoError(t, err)
	defer leave()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, g.Pause(ctx, vllm.PauseWait), context.DeadlineExceeded)
	assert.True(t, g.Paused())
	g.Resume()
	assert.False(t, g.Paused())
}
