package engine

import (
	"context"
	"sync"

	"github.com/ortrain/ortrain/internal/vllm"
)

// pauseGate holds new completions while paused and tracks in-flight ones so
// pause can drain (wait, keep) or cancel (abort) them.
type pauseGate struct {
	mu       sync.Mutex
	paused   bool
	abort    bool
	resumed  chan struct{} // closed while not paused
	inflight map[int]context.CancelFunc
	next     int
	drained  chan struct{} // closed when inflight drops to zero during a pause
}

func newPauseGate() *pauseGate {
	g := &pauseGate{resumed: make(chan struct{}), inflight: map[int]context.CancelFunc{}}
	close(g.resumed)
	return g
}

// enter waits while paused, then registers a request; leave unregisters it.
func (g *pauseGate) enter(ctx context.Context) (context.Context, func(), error) {
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

// pause stops new requests and returns once in-flight ones have finished
// (abort cancels them first; they answer with finish_reason "abort").
// keep cannot freeze a running batch here, so it drains like wait.
func (g *pauseGate) pause(ctx context.Context, mode string) error {
	g.mu.Lock()
	if !g.paused {
		g.paused = true
		g.resumed = make(chan struct{})
	}
	g.abort = mode == vllm.PauseAbort
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

func (g *pauseGate) resume() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.paused {
		g.paused, g.abort = false, false
		close(g.resumed)
	}
}

func (g *pauseGate) isPaused() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.paused }

func (g *pauseGate) aborting() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.abort }
