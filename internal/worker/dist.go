//go:build cgo

package worker

/*
#include <stdlib.h>
#include "dlapi.h"
*/
import "C"

import (
	"time"

	"context"
	"fmt"
	"sync"
	"unsafe"
)

// Group is a joined data-parallel process group (c10d: Gloo on CPU, NCCL on
// CUDA) bound to one model. Every rank must call the same collectives in the
// same order. After a collective fails (peer gone, timeout, cancelled
// context) the group is broken: the ranks no longer agree on what comes
// next, so every later collective fails at once; Close it and end the run.
type Group struct {
	mu      sync.Mutex
	m       *Model
	h       *C.ort_group
	opts    DistOptions
	backend string
}

// JoinGroup joins the process group of o through its rendezvous, with the
// backend of the model's device. It returns when all o.WorldSize ranks have
// joined, or fails after o.Timeout (a *TimeoutError; a connect attempt under
// way may overrun it by a few seconds) or when ctx is done. Broadcast the
// trainable tensors next (BroadcastTrainable) unless every rank loaded the
// same weights and LoRA initialisation.
func (m *Model) JoinGroup(ctx context.Context, o DistOptions) (*Group, error) {
	o, err := o.resolve()
	if err != nil {
		return nil, fmt.Errorf("join process group: %w", err)
	}
	unlock, err := m.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var ar arena
	defer ar.free()
	co := C.ort_group_options{
		master_addr: ar.cstring(o.Addr), master_port: C.int32_t(o.Port),
		rank: C.int32_t(o.Rank), world_size: C.int32_t(o.WorldSize),
		timeout_ms: C.int64_t(o.Timeout.Milliseconds()), bucket_bytes: C.int64_t(o.BucketBytes),
		shard: C.int32_t(o.Shard),
	}
	cf := watchCancel(ctx)
	defer cf.stop()
	eb := newErrBuf()
	defer eb.free()
	var h *C.ort_group
	what := fmt.Sprintf("join process group at %s:%d as rank %d of %d", o.Addr, o.Port, o.Rank, o.WorldSize)
	err = m.call(eb, what, func() C.int { return C.ort_call_group_join(m.api, m.h, &co, &h, cf.p, eb.p, errLen) })
	if err := groupErr(ctx, err, o.Timeout); err != nil {
		return nil, err
	}
	g := &Group{m: m, h: h, opts: o}
	m.shard = o.Shard
	const nameRoom = 64
	namep, _ := carray[byte](&ar, nameRoom)
	if err := m.call(eb, "process group backend", func() C.int {
		return C.ort_call_group_backend(m.api, h, (*C.char)(namep), nameRoom, eb.p, errLen)
	}); err != nil {
		g.close()
		return nil, err
	}
	g.backend = C.GoString((*C.char)(namep))
	return g, nil
}

// Rank is this process's rank.
func (g *Group) Rank() int { return g.opts.Rank }

// WorldSize is the number of ranks.
func (g *Group) WorldSize() int { return g.opts.WorldSize }

// Backend names the c10d backend: "gloo" or "nccl".
func (g *Group) Backend() string { return g.backend }

// begin locks the group and its model, as Model.begin.
func (g *Group) begin(ctx context.Context) (func(), error) {
	g.mu.Lock()
	if g.h == nil {
		g.mu.Unlock()
		return nil, ErrClosed
	}
	unlock, err := g.m.begin(ctx)
	if err != nil {
		g.mu.Unlock()
		return nil, err
	}
	return func() { unlock(); g.mu.Unlock() }, nil
}

func (g *Group) err(ctx context.Context, err error) error { return groupErr(ctx, err, g.opts.Timeout) }

// BroadcastTrainable overwrites every rank's trainable tensors (all weights
// with full fine-tuning; the LoRA adapters and modules_to_save copies with
// LoRA) with rank 0's, so the ranks start identical even when their LoRA
// initialisation or seeds differ. Frozen weights are not sent: every rank
// loads them from the same checkpoint.
func (g *Group) BroadcastTrainable(ctx context.Context) error {
	unlock, err := g.begin(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	cf := watchCancel(ctx)
	defer cf.stop()
	eb := newErrBuf()
	defer eb.free()
	err = g.m.call(eb, "broadcast trainable tensors", func() C.int {
		return C.ort_call_group_broadcast_trainable(g.m.api, g.h, g.m.h, 0, cf.p, eb.p, errLen)
	})
	return g.err(ctx, err)
}

// ReduceGrads averages the trainable tensors' accumulated gradients over
// the ranks, in flat buckets of at most BucketBytes (one collective each).
// Without a shard, and with ShardOptimizer, call it once per optimizer step
// after the last micro-batch's ForwardBackward and before the optimizer
// step; with ShardGradients and ShardParameters after every micro-batch's
// (at stage 3 the backward already reduce-scattered each layer as it ended:
// the call reports what the passes sent and waited). With LoRA only the
// adapters' and modules_to_save's gradients exist, so only they are sent.
// With a shard each rank keeps only its slice of the average.
func (g *Group) ReduceGrads(ctx context.Context) (GradSyncStats, error) {
	unlock, err := g.begin(ctx)
	if err != nil {
		return GradSyncStats{}, err
	}
	defer unlock()
	cf := watchCancel(ctx)
	defer cf.stop()
	eb := newErrBuf()
	defer eb.free()
	var out C.ort_grad_sync
	err = g.m.call(eb, "reduce gradients", func() C.int {
		return C.ort_call_group_reduce_grads(g.m.api, g.h, g.m.h, &out, cf.p, eb.p, errLen)
	})
	if err := g.err(ctx, err); err != nil {
		return GradSyncStats{}, err
	}
	return GradSyncStats{Bytes: int64(out.bytes), Buckets: int(out.buckets), Emulated: out.emulated != 0,
		GatherBytes: int64(out.gather_bytes), PassWait: time.Duration(float64(out.wait_seconds) * float64(time.Second))}, nil
}

// AllReduceSum returns the element-wise sum of values over the ranks: the
// round's active-token count before the loss (so dapo's normaliser is
// global: MicroBatch.RoundTokens = max(1, sum)/WorldSize), and metric sums
// and counts after it. Every rank must pass the same number of values.
func (g *Group) AllReduceSum(ctx context.Context, values []float64) ([]float64, error) {
	return g.AllReduce(ctx, ReduceSum, values)
}

// AllReduce returns the element-wise reduction of values over the ranks:
// ReduceMin and ReduceMax for extremes such as LossStats.ClipLowMin and
// ClipHighMax. Every rank must pass the same number of values.
func (g *Group) AllReduce(ctx context.Context, op Reduction, values []float64) ([]float64, error) {
	name, ok := reductionNames[op]
	if !ok {
		return nil, fmt.Errorf("all-reduce: unknown reduction %d", op)
	}
	unlock, err := g.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	out := append(make([]float64, 0, max(len(values), 1)), values...)
	cf := watchCancel(ctx)
	defer cf.stop()
	eb := newErrBuf()
	defer eb.free()
	// out holds no Go pointers, so the worker may write into it.
	err = g.m.call(eb, "all-reduce "+name, func() C.int {
		return C.ort_call_group_allreduce_f64(g.m.api, g.h, C.int32_t(op), (*C.double)(unsafe.Pointer(unsafe.SliceData(out))),
			C.size_t(len(out)), cf.p, eb.p, errLen)
	})
	if err := g.err(ctx, err); err != nil {
		return nil, err
	}
	return out, nil
}

// AllGather collects every rank's bytes, in rank order (each rank passes
// its own; the result is the same on every rank). Two collectives: the
// sizes, then the zero-padded bytes.
func (g *Group) AllGather(ctx context.Context, data []byte) ([][]byte, error) {
	sizes := make([]float64, g.WorldSize())
	sizes[g.Rank()] = float64(len(data))
	sizes, err := g.AllReduce(ctx, ReduceSum, sizes)
	if err != nil {
		return nil, fmt.Errorf("all-gather sizes: %w", err)
	}
	maxN := 0
	for _, s := range sizes {
		maxN = max(maxN, int(s))
	}
	unlock, err := g.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	out := make([]byte, maxN*len(sizes))
	cf := watchCancel(ctx)
	defer cf.stop()
	eb := newErrBuf()
	defer eb.free()
	// data and out hold no Go pointers, so the worker may read and write them.
	err = g.m.call(eb, "all-gather", func() C.int {
		return C.ort_call_group_allgather(g.m.api, g.h, unsafe.Pointer(unsafe.SliceData(data)), C.size_t(len(data)), C.size_t(maxN),
			unsafe.Pointer(unsafe.SliceData(out)), C.size_t(len(out)), cf.p, eb.p, errLen)
	})
	if err := g.err(ctx, err); err != nil {
		return nil, err
	}
	parts := make([][]byte, len(sizes))
	for r, s := range sizes {
		parts[r] = out[r*maxN : r*maxN+int(s) : r*maxN+int(s)]
	}
	return parts, nil
}

// Close leaves the group: it waits for the backend's threads (when a
// collective is still pending after a failure, at most the backend's
// timeout: the group's plus a margin of 2s to 1min) and frees it. Later calls return ErrClosed. Close the group before its model's
// library.
func (g *Group) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.close()
}

func (g *Group) close() error {
	if g.h == nil {
		return nil
	}
	h := g.h
	g.h = nil
	_, err := g.m.lib.run(func() C.int { C.ort_call_group_free(g.m.api, h); return 0 })
	return err
}
