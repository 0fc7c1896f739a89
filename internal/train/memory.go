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

// shardMemory is a policy that tells what it holds (worker.Model.ShardMemory).
type shardMemory interface {
	ShardMemory(ctx context.Context, resetPeak bool) (worker.ShardMemory, error)
}

// measurePeakMemory starts a new peak of the process's resident memory and,
// where the policy's device allocator tells one (CUDA), of its allocated
// bytes, and of the bytes a sharded policy gathers; the function it returns
// stores the peaks since then, and what the policy holds, in m. A peak
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
	held, _ := p.(shardMemory)
	if held != nil {
		if _, err := held.ShardMemory(ctx, true); err != nil {
			held = nil
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
		if held != nil {
			if s, err := held.ShardMemory(context.WithoutCancel(ctx), false); err == nil {
				s.PeakGatheredBytes = max(s.PeakGatheredBytes, m.ShardMemory.PeakGatheredBytes)
				m.ShardMemory = s
			}
		}
	}
}

// logFootprint reports the policy's memory by kind (each rank its own:
// with worker.shard, its slices; with parameters sharded, also the most it
// gathered at once).
func logFootprint(ctx context.Context, log zerolog.Logger, m shardMemory, when string) {
	f, err := m.ShardMemory(ctx, false)
	if err != nil {
		log.Debug().Err(err).Msg("policy memory")
		return
	}
	ev := log.Info().Str("when", when).Int64("params_bytes", f.ParamBytes).Int64("grads_bytes", f.GradBytes).
		Int64("optimizer_bytes", f.OptimBytes)
	if f.PeakGatheredBytes > 0 {
		ev = ev.Int64("peak_gathered_bytes", f.PeakGatheredBytes)
	}
	ev.Msg("policy memory")
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
