package main

import (
	"context"
	"time"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/worker"
)

// trainTimes are the timed steps' totals (the warm-up step excluded).
type trainTimes struct {
	elapsed, fwdBwd time.Duration
	reduce, gather  time.Duration // ReduceGrads; the sharded step's norm all-reduce and parameter all-gather
	cpu, fbCPU      float64
	sys, faults     float64
	reduceBytes     int64 // per step: every ReduceGrads of the step
	reduceBuckets   int
	gatherBytes     int64
	emulated        bool // a reduce-scatter was built from an all-reduce
}

// timedSteps runs one warm-up step and o.steps timed ones, each of
// o.gradAccum micro-batches of mb. With a group the gradients are reduced
// once after the last micro-batch, or after every one at ShardGradients,
// and a sharded group steps the optimizer itself.
func timedSteps(ctx context.Context, m *worker.Model, g *worker.Group, mb grpo.MicroBatch, cfg grpo.LossConfig, o options) (trainTimes, error) {
	var t trainTimes
	accum := max(o.gradAccum, 1)
	shard := worker.ShardNone
	if g != nil {
		shard = g.Shard()
	}
	for step := 0; step <= o.steps; step++ {
		cpu0 := cpuSeconds()
		sys0, faults0 := sysSecondsAndFaults()
		start := time.Now()
		var fb, red, gather time.Duration
		var fbCPU float64
		var bytes, gatherBytes int64
		var buckets int
		for micro := range accum {
			t0, c0 := time.Now(), cpuSeconds()
			if _, err := m.ForwardBackward(ctx, mb, cfg); err != nil {
				return t, err
			}
			fb += time.Since(t0) // ForwardBackward returns after its loss is read back, so the device is synchronised
			fbCPU += cpuSeconds() - c0
			if g != nil && (shard >= worker.ShardGradients || micro == accum-1) {
				r0 := time.Now()
				sync, err := g.ReduceGrads(ctx)
				if err != nil {
					return t, err
				}
				red += time.Since(r0) + sync.PassWait // stage 3: the passes' waits on their collectives
				gatherBytes += sync.GatherBytes
				bytes += sync.Bytes
				buckets += sync.Buckets
				t.emulated = t.emulated || sync.Emulated
			}
		}
		if shard != worker.ShardNone {
			st, err := g.OptimizerStep(ctx, 1e-5)
			if err != nil {
				return t, err
			}
			gather = st.CommTime
			gatherBytes += st.GatherBytes
		} else if _, err := m.OptimizerStep(ctx, 1e-5); err != nil {
			return t, err
		}
		if step == 0 { // warms up
			continue
		}
		t.elapsed += time.Since(start)
		t.fwdBwd += fb
		t.reduce += red
		t.gather += gather
		t.cpu += cpuSeconds() - cpu0
		sys1, faults1 := sysSecondsAndFaults()
		t.sys += sys1 - sys0
		t.faults += faults1 - faults0
		t.fbCPU += fbCPU
		t.reduceBytes, t.reduceBuckets, t.gatherBytes = bytes, buckets, gatherBytes
	}
	return t, nil
}

// shardResult are the JSON keys of a data-parallel rank besides the
// all-reduce's (result). reduce_s is allreduce_s under its stage-neutral
// name: the time in ReduceGrads per step, summed over the step's
// reductions (one per micro-batch at stage gradients); a sharded group
// reduce-scatters, built from an all-reduce where the backend has no
// reduce-scatter (Gloo in libtorch 1.13: reduce_emulated). At stage 3 the
// reductions and the layers' all-gathers run inside forward and backward:
// reduce_s is then the time those passes waited on them. allgather_s is
// the sharded optimizer step's communication (the gradient norm's
// all-reduce and the parameters' all-gather; 0 at stage none), comm_s both,
// comm_fraction its share of the step.
type shardResult struct {
	Shard            string  `json:"shard"`
	ReduceSeconds    float64 `json:"reduce_s"`
	AllGatherSeconds float64 `json:"allgather_s"`
	AllGatherBytes   int64   `json:"allgather_bytes"`
	CommSeconds      float64 `json:"comm_s"`
	CommFraction     float64 `json:"comm_fraction"`
	ReduceEmulated   bool    `json:"reduce_emulated"`
}

// setDist fills res's data-parallel timings from t (o.steps > 0).
func setDist(res *result, t trainTimes, o options) {
	n := float64(o.steps)
	res.AllReduceSeconds = t.reduce.Seconds() / n
	res.AllReduceBytes, res.AllReduceBuckets = t.reduceBytes, t.reduceBuckets
	res.AllReduceFraction = t.reduce.Seconds() / t.elapsed.Seconds()
	res.ReduceSeconds = res.AllReduceSeconds
	res.AllGatherSeconds = t.gather.Seconds() / n
	res.AllGatherBytes = t.gatherBytes
	res.CommSeconds = res.ReduceSeconds + res.AllGatherSeconds
	res.CommFraction = (t.reduce + t.gather).Seconds() / t.elapsed.Seconds()
	res.ReduceEmulated = t.emulated
}
