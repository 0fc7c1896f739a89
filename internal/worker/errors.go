package worker

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrClosed is returned by calls on a closed Library or Model.
var ErrClosed = errors.New("worker: closed")

// ErrEmptyBatch is returned for a batch with no rows.
var ErrEmptyBatch = errors.New("empty batch: no rows")

// ErrTimeout matches (errors.Is) every *TimeoutError.
var ErrTimeout = errors.New("worker: process group timed out")

// TimeoutError is a rendezvous (JoinGroup) or collective that did not end
// within the group's timeout: a peer is stalled, never came, or is gone
// without closing its connection. Which clock ran out (the group's deadline,
// or the Gloo, NCCL or store timeout behind it) does not matter: all are
// this error. A call stopped by its context returns the context's error
// instead, which does not match ErrTimeout. After a collective's timeout the
// group is broken.
type TimeoutError struct {
	Op      string        // the call: "all-reduce sum", "join process group at ..."
	Timeout time.Duration // the group's timeout (DistOptions.Timeout)
	Detail  string        // the worker's message
}

func (e *TimeoutError) Error() string { return e.Op + ": " + e.Detail }

// Is makes errors.Is(err, ErrTimeout) true.
func (e *TimeoutError) Is(target error) bool { return target == ErrTimeout }

// groupErr is callErr for a process-group call with timeout.
func groupErr(ctx context.Context, err error, timeout time.Duration) error {
	err = callErr(ctx, err)
	if te, ok := errors.AsType[*TimeoutError](err); ok {
		te.Timeout = timeout
	}
	return err
}

// callErr prefers the context's error when the C++ side stopped because of it.
func callErr(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}

// noCGOText is what a call that needs the worker says in a binary built
// without cgo.
const noCGOText = "worker: this ortrain was built without cgo (CGO_ENABLED=0): " +
	"training, sampling and checkpoints need the worker; build with cgo and a C compiler (make build)"

// ErrNoCGO matches (errors.Is) every *NoCGOError: the binary was built
// without cgo, so it cannot load the worker library.
var ErrNoCGO = errors.New(noCGOText)

// NoCGOError is a call that needs the worker library (Open, and every call
// on a Library, Model, Decoder or Group) in a binary built with
// CGO_ENABLED=0 (nocgo.go). Builds with cgo never return it.
type NoCGOError struct {
	Op string // the call: "open worker library ...", "sample"; "" when not named
}

func (e *NoCGOError) Error() string {
	if e.Op == "" {
		return noCGOText
	}
	return e.Op + ": " + noCGOText
}

// Is makes errors.Is(err, ErrNoCGO) true.
func (e *NoCGOError) Is(target error) bool { return target == ErrNoCGO }
