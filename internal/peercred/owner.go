package peercred

import (
	"context"
	"fmt"
	"net/http"
	"sync"
)

// Owner is the process tree a tenant of a server is bound to. The tenant
// is opened before its process starts, and the process's pid is known only
// once it has, so a request may arrive before Bind: Check waits for it.
// Safe for concurrent use.
type Owner struct {
	bound chan struct{} // closed by Bind
	mu    sync.Mutex
	pid   int // set before bound is closed
}

// NewOwner returns an Owner not yet bound.
func NewOwner() *Owner { return &Owner{bound: make(chan struct{})} }

// Bind names the root of the tree; it may be called once.
func (o *Owner) Bind(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("bind owner: pid %d is not a process", pid)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.pid != 0 {
		return fmt.Errorf("bind owner %d: already bound to %d", pid, o.pid)
	}
	o.pid = pid
	close(o.bound)
	return nil
}

// Check admits r if the process that sent it is the owner or descends from
// it, waiting for Bind until ctx ends. Where the platform cannot tell
// (ErrUnsupported) every request is admitted, as without an owner. The
// errors wrap ErrUnbound, ErrForeign, ErrNotFound or the lookup's failure.
func (o *Owner) Check(ctx context.Context, r *http.Request) (peer int, err error) {
	if !Supported() {
		return 0, nil
	}
	select {
	case <-o.bound:
	case <-ctx.Done():
		return 0, fmt.Errorf("%w: %v", ErrUnbound, context.Cause(ctx))
	}
	o.mu.Lock()
	owner := o.pid
	o.mu.Unlock()
	peer, err = RequestPID(r)
	if err != nil {
		return 0, fmt.Errorf("find the process that sent the request: %w", err)
	}
	ok, err := IsDescendant(peer, owner)
	if err != nil {
		return peer, fmt.Errorf("%w: ancestry of process %d: %v", ErrForeign, peer, err)
	}
	if !ok {
		return peer, fmt.Errorf("%w: process %d does not descend from %d", ErrForeign, peer, owner)
	}
	return peer, nil
}
