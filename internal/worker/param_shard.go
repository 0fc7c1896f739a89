//go:build cgo

package worker

/*
#include "dlapi.h"
*/
import "C"

import (
	"context"
	"fmt"
)

// GatherUnit gathers unit (0 .. units-1, in forward order: the embedding,
// each decoder layer, the final norm, then an untied LM head) of a
// ShardParameters model on every rank, so that ReadTensor serves that unit's
// weights (KindWeight, LoRA folded in) and trainable tensors (KindLoRA)
// until the next call; -1 drops what is staged. It returns the number of
// units. A collective: every rank calls it with the same unit.
func (g *Group) GatherUnit(ctx context.Context, unit int) (units int, err error) {
	unlock, err := g.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer unlock()
	return g.gatherUnit(ctx, unit)
}

// gatherUnit is GatherUnit with the group already locked.
func (g *Group) gatherUnit(ctx context.Context, unit int) (units int, err error) {
	cf := watchCancel(ctx)
	defer cf.stop()
	eb := newErrBuf()
	defer eb.free()
	var n C.int32_t
	err = g.m.call(eb, fmt.Sprintf("gather unit %d", unit), func() C.int {
		return C.ort_call_group_gather_unit(g.m.api, g.h, g.m.h, C.int32_t(unit), &n, cf.p, eb.p, errLen)
	})
	if err := g.err(ctx, err); err != nil {
		return 0, err
	}
	return int(n), nil
}

// ReadSharded reads every tensor of kind (KindWeight or KindLoRA) of a
// ShardParameters model a unit at a time, calling fn with each in the
// order of Tensors(kind) within its unit, so no rank ever holds more than
// one unit whole. A collective: every rank calls it; fn runs on each.
func (g *Group) ReadSharded(ctx context.Context, kind TensorKind, fn func(TensorInfo, []byte) error) error {
	if g.opts.Shard != ShardParameters {
		return fmt.Errorf("read sharded tensors: the group's stage is %s, not parameters", g.opts.Shard)
	}
	if kind != KindWeight && kind != KindLoRA {
		return fmt.Errorf("read sharded tensors: kind %d is neither weights nor LoRA tensors", kind)
	}
	infos, err := g.m.Tensors(kind)
	if err != nil {
		return err
	}
	cfg := g.m.Config()
	byUnit := map[int][]TensorInfo{}
	for _, t := range infos {
		u := ShardUnitOf(t.Name, cfg.NumHiddenLayers, cfg.TieWordEmbeddings)
		if u < 0 {
			return fmt.Errorf("read sharded tensors: %s belongs to no unit", t.Name)
		}
		byUnit[u] = append(byUnit[u], t)
	}
	units, err := g.GatherUnit(ctx, -1)
	if err != nil {
		return err
	}
	for u := range units {
		if len(byUnit[u]) == 0 {
			continue
		}
		if _, err := g.GatherUnit(ctx, u); err != nil {
			return err
		}
		for _, t := range byUnit[u] {
			b, err := g.m.ReadTensor(kind, t)
			if err != nil {
				return err
			}
			if err := fn(t, b); err != nil {
				return err
			}
		}
	}
	_, err = g.GatherUnit(ctx, -1)
	return err
}

// ShardMemory reads what this rank holds of the model (any stage) and, with
// resetPeak, restarts the peak of gathered bytes.
func (m *Model) ShardMemory(ctx context.Context, resetPeak bool) (ShardMemory, error) {
	unlock, err := m.begin(ctx)
	if err != nil {
		return ShardMemory{}, err
	}
	defer unlock()
	eb := newErrBuf()
	defer eb.free()
	var out C.ort_shard_memory
	if err := m.call(eb, "shard memory", func() C.int {
		return C.ort_call_model_shard_memory(m.api, m.h, cbool(resetPeak), &out, eb.p, errLen)
	}); err != nil {
		return ShardMemory{}, err
	}
	return ShardMemory{
		ParamBytes: int64(out.param_bytes), GradBytes: int64(out.grad_bytes), OptimBytes: int64(out.optim_bytes),
		GatheredBytes: int64(out.gathered_bytes), PeakGatheredBytes: int64(out.peak_gathered_bytes),
	}, nil
}
