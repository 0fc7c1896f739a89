//go:build cgo

package worker

/*
#include "dlapi.h"
*/
import "C"

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Shard is the group's stage.
func (g *Group) Shard() ShardStage { return g.opts.Shard }

// OptimizerStep is the optimizer step of a sharded group (Shard() is not
// ShardNone), in place of Model.OptimizerStep: the gradients' global norm
// over every rank's slice (one all-reduce), clipping by it, AdamW on this
// rank's slice, and (stages 1 and 2) an all-gather of the parameters so
// every rank holds the whole updated model; at ShardParameters the slices
// are the parameters and the next pass gathers them. Every rank calls it after ReduceGrads. Once started
// it runs to the end (bounded by the group's timeout): ctx is checked
// before, not during.
func (g *Group) OptimizerStep(ctx context.Context, lr float64) (ShardStepStats, error) {
	if !(lr >= 0) {
		return ShardStepStats{}, fmt.Errorf("sharded optimizer step: learning rate %v must be >= 0", lr)
	}
	unlock, err := g.begin(ctx)
	if err != nil {
		return ShardStepStats{}, err
	}
	defer unlock()
	eb := newErrBuf()
	defer eb.free()
	var out C.ort_shard_step_stats
	err = g.m.call(eb, "sharded optimizer step", func() C.int {
		return C.ort_call_group_optimizer_step(g.m.api, g.h, g.m.h, C.double(lr), &out, eb.p, errLen)
	})
	if err := g.err(ctx, err); err != nil {
		return ShardStepStats{}, err
	}
	return ShardStepStats{
		StepStats:   StepStats{GradNorm: float64(out.grad_norm), LR: lr},
		CommTime:    time.Duration(float64(out.comm_seconds) * float64(time.Second)),
		GatherBytes: int64(out.gather_bytes),
	}, nil
}

// SaveOptimizerShard writes this rank's slice of a sharded optimizer's
// AdamW state to path (safetensors, atomically): the step and, for every
// trainable tensor this rank holds a piece of, its moments as 1-D pieces
// named exp_avg.<name>@<offset> (elements from offset, flattened). One rank
// merges every rank's file with MergeOptimizerShards into the unsharded
// format, which any world size resumes from.
func (g *Group) SaveOptimizerShard(ctx context.Context, path string) error {
	if g.opts.Shard == ShardNone {
		return fmt.Errorf("save optimizer shard %s: the group does not shard the optimizer (use Model.SaveOptimizer)", path)
	}
	unlock, err := g.begin(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	return g.m.writeSafetensors(ctx, path, KindOptim, map[string]string{
		"format": optimizerShardFormat, "rank": strconv.Itoa(g.opts.Rank), "world_size": strconv.Itoa(g.opts.WorldSize),
	})
}

// SaveParameterShard writes this rank's slices of a ShardParameters
// model's parameters to path, in SaveOptimizerShard's format without the
// AdamW moments (the step and the "param." pieces): what a weight push
// merges with SaveHFFromShards, with no collective and no rank holding the
// whole model.
func (g *Group) SaveParameterShard(ctx context.Context, path string) error {
	if g.opts.Shard != ShardParameters {
		return fmt.Errorf("save parameter shard %s: the group's stage is %s, not parameters", path, g.opts.Shard)
	}
	unlock, err := g.begin(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	meta := map[string]string{"format": optimizerShardFormat, "rank": strconv.Itoa(g.opts.Rank), "world_size": strconv.Itoa(g.opts.WorldSize)}
	return g.m.writeSafetensorsFiltered(ctx, path, KindOptim, meta, g.m.readTensor, func(name string) bool {
		return name == optimizerStepName || strings.HasPrefix(name, optimizerParam+".")
	})
}

// MergeOptimizerShards merges the shard files of every rank (shards[r] is
// rank r's, from SaveOptimizerShard) into one optimizer file at dst in
// SaveOptimizer's format, checking them against this model's trainable
// tensors. It needs no process group: any rank, or a later process, can.
func (m *Model) MergeOptimizerShards(ctx context.Context, dst string, shards []string) error {
	kind := KindWeight
	if m.opts.LoRA != nil {
		kind = KindLoRA
	}
	params, err := m.Tensors(kind)
	if err != nil {
		return fmt.Errorf("merge optimizer shards: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return MergeOptimizerShards(dst, shards, params)
}
