package vllm

import (
	"context"
	"sync"
)

// PauseGate is /pause and /resume on the request path, with vLLM's modes:
// it holds new completions while paused and tracks in-flight ones so Pause
// can drain (wait, keep) or cancel (abort) them. The vLLM backend uses it to
// hold requests during a weight sync, serve-engine to serve /pause. The zero
// value is not usable; call NewPauseGate.
type PauseGate struct {
	mu       sync.Mutex
	paused   bool
	abort    bool
	resumed  chan struct{} // closed while not paused
	inflight map[int]context.CancelFunc
	next     int
	drained  chan struct{} // closed when inflight drops to zero during a pause
}

// NewPauseGate returns an open (not paused) gate.
func NewPauseGate() *PauseGate {
	g := &PauseGate{resumed: make(chan struct{}), inflight: map[int]context.CancelFunc{}}
	close(g.resumed)
	return g
}

// Enter waits while paused, then registers a request: the returned context
// is cancelled by an abort-mode Pause, and leave unregisters the request.
func (g *PauseGate) Enter(ctx context.Context) (context.Context, func(), error) {
	for {
		g.mu.Lock()
		if !g.paused {
			id := g.next
			g.next++
			rctx, cancel := context.WithCancel(ctx)
			g.inflight[id] = cancel
			g.mu.Unlock()
			return rctx, func() {
				cancel()
				g.mu.Lock()
				delete(g.inflight, id)
				if len(g.inflight) == 0 && g.drained != nil {
					close(g.drained)
					g.drained = nil
				}
				g.mu.Unlock()
			}, nil
		}
		wait := g.resumed
		g.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

// Pause stops new requests and returns once in-flight ones have finished
// (abort cancels them first; they answer with finish_reason "abort").
// keep cannot freeze a running batch here, so it drains like wait.
func (g *PauseGate) Pause(ctx context.Context, mode string) error {
	g.mu.Lock()
	if !g.paused {
		g.paused = true
		g.resumed = make(chan struct{})
	}
	g.abort = mode == PauseAbort
	if g.abort {
		for _, cancel := range g.inflight {
			cancel()
		}
	}
	if len(g.inflight) == 0 {
		g.mu.Unlock()
		return nil
	}
	if g.drained == nil {
		g.drained = make(chan struct{})
	}
	drained := g.drained
	g.mu.Unlock()
	select {
	case <-drained:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Resume lets held and new requests through.
func (g *PauseGate) Resume() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.paused {
		g.paused, g.abort = false, false
		close(g.resumed)
	}
}

// Paused reports whether the gate holds new requests.
func (g *PauseGate) Paused() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.paused }

// Aborting reports whether the current pause cancelled in-flight requests
// (their errors are aborts, not failures).
func (g *PauseGate) Aborting() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.abort }
