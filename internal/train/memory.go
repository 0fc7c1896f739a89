package train

import (
	"context"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/memstat"
	"github.com/ortrain/ortrain/internal/worker"
)

// deviceMemory is a policy whose device allocator can tell its peak
// (worker.Model.DeviceMemory: CUDA).
type deviceMemory interface {
	DeviceMemory(ctx context.Context, resetPeak bool) (worker.DeviceMemory, bool, error)
}

// measurePeakMemory starts a new peak of the process's resident memory and,
// where the policy's device allocator tells one (CUDA), of its allocated
// bytes; the function it returns stores the peaks since then in m. A peak
// nobody can tell is left out, never reported as 0.
func measurePeakMemory(ctx context.Context, p trainPolicy, m *StepMetrics) func() {
	files := memstat.Self()
	rss := files.ResetPeak() == nil
	dev, _ := p.(deviceMemory)
	if dev != nil {
		if _, ok, err := dev.DeviceMemory(ctx, true); err != nil || !ok {
			dev = nil
		}
	}
	return func() {
		if rss {
			if s, err := files.Read(); err == nil {
				m.PeakRSS = max(m.PeakRSS, s.PeakRSS)
			}
		}
		if dev != nil {
			if d, ok, err := dev.DeviceMemory(context.WithoutCancel(ctx), false); err == nil && ok {
				m.PeakAllocated = max(m.PeakAllocated, d.PeakAllocated)
			}
		}
	}
}

// footprint is what a policy holds for training, by kind, in bytes.
type footprint struct {
	Params, Grads, Optimizer int64
}

// tensorLister is the worker model's view of its tensors.
type tensorLister interface {
	Tensors(kind worker.TensorKind) ([]worker.TensorInfo, error)
}

// policyFootprint adds up the worker's tensors: the weights (and LoRA
// adapters), the gradients and the AdamW state it holds now (the last two
// are allocated by the first step).
func policyFootprint(m tensorLister) (footprint, error) {
	var f footprint
	sum := func(kind worker.TensorKind) (int64, error) {
		ts, err := m.Tensors(kind)
		if err != nil {
			return 0, err
		}
		return worker.TensorBytes(ts), nil
	}
	var err error
	if f.Params, err = sum(worker.KindWeight); err != nil {
		return f, err
	}
	lora, err := sum(worker.KindLoRA)
	if err != nil {
		return f, err
	}
	f.Params += lora
	if f.Grads, err = sum(worker.KindGrad); err != nil {
		return f, err
	}
	if f.Optimizer, err = sum(worker.KindOptim); err != nil {
		return f, err
	}
	return f, nil
}

// logFootprint reports the policy's memory by kind (each rank its own).
func logFootprint(log zerolog.Logger, m tensorLister, when string) {
	f, err := policyFootprint(m)
	if err != nil {
		log.Debug().Err(err).Msg("policy memory")
		return
	}
	log.Info().Str("when", when).Int64("params_bytes", f.Params).Int64("grads_bytes", f.Grads).
		Int64("optimizer_bytes", f.Optimizer).Msg("policy memory")
}

// addPacking counts the positions the micro-batch's forward pass computes
// packed into sequences of at most budget tokens (worker.PackRows, the
// layout the worker uses) against padded row by row.
func (m *StepMetrics) addPacking(rows []grpo.Row, budget int) {
	lengths := make([]int, len(rows))
	for i, r := range rows {
		lengths[i] = len(r.Tokens)
	}
	p := worker.PackRows(lengths, budget)
	m.PaddedPositions += p.PaddedPositions
	m.PackedPositions += p.Positions
}
