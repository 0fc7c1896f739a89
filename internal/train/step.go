package train

import (
	"context"
	"fmt"
	"time"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/worker"
)

// One optimizer step is the same for every way of training: GA micro-steps,
// each a forward/backward on the micro-batch a batch source yields (rounds of
// rollouts, synchronous or async, for `run`; dataset batches for `sft`), the
// gradients combined by a reducer (one rank, or the ranks of a process group),
// then the optimizer. What differs lives behind the two interfaces below.

// BatchSource yields the global micro-batch of each micro-step, in order.
// With several ranks the reducer cuts it into each rank's slice, so every
// rank draws the same sequence of micro-batches.
type BatchSource interface {
	NextMicroBatch(ctx context.Context, m *StepMetrics) (grpo.MicroBatch, error)
}

// gradReducer combines what the ranks' micro-steps accumulated and steps
// the optimizer.
type gradReducer interface {
	// local is this rank's part of a global micro-batch.
	local(mb grpo.MicroBatch) grpo.MicroBatch
	// microStepDone runs after each micro-step's backward pass (ZeRO stage
	// 2 reduces there).
	microStepDone(ctx context.Context, step int, m *StepMetrics) error
	// reduce makes the accumulated gradients the global ones and returns
	// every rank's loss statistics (one rank: stats itself).
	reduce(ctx context.Context, step int, stats []worker.LossStats, m *StepMetrics) ([]worker.LossStats, error)
	// optimizerStep updates the weights from the reduced gradients and
	// returns their norm before clipping.
	optimizerStep(ctx context.Context, p trainPolicy, lr float64, m *StepMetrics) (float64, error)
	worldSize() int
}

// oneRank is the reducer of a single process: nothing to combine.
type oneRank struct{}

func (oneRank) local(mb grpo.MicroBatch) grpo.MicroBatch               { return mb }
func (oneRank) microStepDone(context.Context, int, *StepMetrics) error { return nil }
func (oneRank) reduce(_ context.Context, _ int, stats []worker.LossStats, _ *StepMetrics) ([]worker.LossStats, error) {
	return stats, nil
}
func (oneRank) optimizerStep(ctx context.Context, p trainPolicy, lr float64, _ *StepMetrics) (float64, error) {
	return p.OptimizerStep(ctx, lr)
}
func (oneRank) worldSize() int { return 1 }

// ranks is the reducer of a data-parallel process group (dist.go): each
// rank trains on its slice of every global micro-batch, then the gradients
// are averaged and the loss statistics gathered. With a sharded optimizer
// (worker.shard) each rank keeps its slice of the averaged gradients
// (reduced after every micro-step at stage 2), steps it, and the group
// gathers the parameters.
type ranks struct{ g collectives }

func (r ranks) local(mb grpo.MicroBatch) grpo.MicroBatch {
	return localSlice(mb, r.g.Rank(), r.g.WorldSize())
}

// reduceGrads runs one gradient reduction, adding its time and bytes to m.
func (r ranks) reduceGrads(ctx context.Context, step int, m *StepMetrics) error {
	t0 := time.Now()
	gs, err := r.g.ReduceGrads(ctx)
	m.AllReduceTime += time.Since(t0)
	if err != nil {
		return fmt.Errorf("step %d: reduce gradients: %w", step, err)
	}
	m.AllReduceBytes += gs.Bytes
	// Stage 3's passes gathered the layers (and waited on the collectives
	// they started) inside forward and backward.
	m.AllGatherBytes += gs.GatherBytes
	m.AllGatherTime += gs.PassWait
	return nil
}

func (r ranks) microStepDone(ctx context.Context, step int, m *StepMetrics) error {
	if r.g.Shard() < worker.ShardGradients {
		return nil
	}
	return r.reduceGrads(ctx, step, m)
}

func (r ranks) optimizerStep(ctx context.Context, p trainPolicy, lr float64, m *StepMetrics) (float64, error) {
	if r.g.Shard() == worker.ShardNone {
		return p.OptimizerStep(ctx, lr)
	}
	st, err := r.g.OptimizerStep(ctx, lr)
	m.AllGatherTime += st.CommTime
	m.AllGatherBytes += st.GatherBytes
	return st.GradNorm, err
}

func (r ranks) reduce(ctx context.Context, step int, stats []worker.LossStats, m *StepMetrics) ([]worker.LossStats, error) {
	if r.g.Shard() < worker.ShardGradients {
		if err := r.reduceGrads(ctx, step, m); err != nil {
			return nil, err
		}
	}
	all, err := gatherGob(ctx, r.g, stats)
	if err != nil {
		return nil, fmt.Errorf("step %d: gather loss statistics: %w", step, err)
	}
	var out []worker.LossStats
	for _, s := range all {
		out = append(out, s...)
	}
	return out, nil
}

func (r ranks) worldSize() int { return r.g.WorldSize() }

// reducerOf is the reducer for a process group (nil: one rank).
func reducerOf(g collectives) gradReducer {
	if g == nil {
		return oneRank{}
	}
	return ranks{g}
}

// stepPhases are one optimizer step's settings: micro-steps, loss, and the
// deadlines of the worker's phases (0: the optimizer's default, none for
// a micro-step).
type stepPhases struct {
	GA                            int
	Loss                          grpo.LossConfig
	StepTimeout, OptimizerTimeout time.Duration
	// PackTokens is worker.pack_tokens: the step reports the padding that
	// packing its micro-batches saved.
	PackTokens int
}

// stepOutcome is what one optimizer step produced.
type stepOutcome struct {
	Stats    []worker.LossStats // every rank's, one per micro-step
	GradNorm float64
}

// runOptimizerStep runs the micro-steps of step (1-based, for messages)
// from src, reduces, and steps the optimizer at lr. It does not roll back:
// the caller owns the all-or-nothing of a step (it knows what to restore).
// An error before the optimizer ran leaves the weights unchanged (the
// caller discards the accumulated gradients); an *OptimizerError means
// the update itself failed.
func runOptimizerStep(ctx context.Context, p trainPolicy, src BatchSource, red gradReducer, ph stepPhases, step int, lr float64, m *StepMetrics) (stepOutcome, error) {
	var out stepOutcome
	defer measurePeakMemory(ctx, p, m)()
	for i := range ph.GA {
		mb, err := src.NextMicroBatch(ctx, m)
		if err != nil {
			return out, err
		}
		mb = red.local(mb)
		if ph.PackTokens > 0 {
			m.addPacking(mb.Rows, ph.PackTokens)
		}
		t0 := time.Now()
		var st worker.LossStats
		err = withDeadline(ctx, ph.StepTimeout, func(c context.Context) (err error) {
			st, err = p.ForwardBackward(c, mb, ph.Loss)
			return err
		})
		m.TrainTime += time.Since(t0)
		if err != nil {
			return out, fmt.Errorf("step %d micro-step %d: forward/backward: %w", step, i, err)
		}
		out.Stats = append(out.Stats, st)
		if err := red.microStepDone(ctx, step, m); err != nil {
			return out, err
		}
	}
	var err error
	if out.Stats, err = red.reduce(ctx, step, out.Stats, m); err != nil {
		return out, err
	}
	// Once the micro-steps are done the optimizer step runs to the end,
	// interrupt or not (bounded by its own deadline): cutting it short
	// could leave the weights half-updated, and finishing it makes the
	// interrupted step complete, so it is saved.
	optTimeout := ph.OptimizerTimeout
	if optTimeout <= 0 {
		optTimeout = 5 * time.Minute
	}
	t0 := time.Now()
	err = withDeadline(context.WithoutCancel(ctx), optTimeout, func(c context.Context) (err error) {
		out.GradNorm, err = red.optimizerStep(c, p, lr, m)
		return err
	})
	m.TrainTime += time.Since(t0)
	if err != nil {
		return out, &OptimizerError{Step: step, Err: err}
	}
	return out, nil
}
