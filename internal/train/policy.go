package train

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/worker"
)

// Checkpoint layout inside checkpoints/step-N/.
const (
	ckptModelDir   = "model"   // full weights as a Hugging Face directory
	ckptAdapterDir = "adapter" // LoRA: a PEFT adapter directory
	ckptOptimizer  = "optimizer.pt"
)

// workerPolicy adapts a worker.Model to the loop's Policy.
type workerPolicy struct {
	m    *worker.Model
	lora bool
	// libPath is the worker library the model was loaded with.
	libPath string
	// device is where it lives: worker.device resolved (auto, a rank's GPU).
	device string
	// shards is set when the run shards the optimizer (worker.shard): no
	// rank holds the whole state, so each saves its slice and rank 0
	// merges them.
	shards *optimizerShards
	// params is the group the parameters are sharded over (worker.shard
	// parameters): every rank takes part in reading the weights, a unit at
	// a time, for checkpoints and the sampler.
	params *worker.Group
	// paramSync stages this rank's parameter slices for rank 0's pushes to
	// the vLLM replicas (parameters sharded, engine.kind vllm).
	paramSync *paramSync
}

func (p *workerPolicy) Logprobs(ctx context.Context, rows []grpo.Row, temperature float64, ref bool) ([][]float32, error) {
	lp, _, err := p.m.Logprobs(ctx, rows, temperature, ref)
	return lp, err
}

func (p *workerPolicy) ForwardBackward(ctx context.Context, mb grpo.MicroBatch, cfg grpo.LossConfig) (worker.LossStats, error) {
	return p.m.ForwardBackward(ctx, mb, cfg)
}

func (p *workerPolicy) OptimizerStep(ctx context.Context, lr float64) (float64, error) {
	s, err := p.m.OptimizerStep(ctx, lr)
	return s.GradNorm, err
}

func (p *workerPolicy) DiscardGradients(ctx context.Context) error { return p.m.ZeroGrad(ctx) }

func (p *workerPolicy) DeviceMemory(ctx context.Context, resetPeak bool) (worker.DeviceMemory, bool, error) {
	return p.m.DeviceMemory(ctx, resetPeak)
}

func (p *workerPolicy) ShardMemory(ctx context.Context, resetPeak bool) (worker.ShardMemory, error) {
	return p.m.ShardMemory(ctx, resetPeak)
}

// writeCheckpoint writes the weights (or the LoRA adapter) and the optimizer
// state of step into dir (rank 0; with a sharded optimizer, after every
// rank's saveShard of the same step).
func (p *workerPolicy) writeCheckpoint(ctx context.Context, dir string, step int) error {
	if p.params != nil {
		return p.writeShardedCheckpoint(ctx, dir, step)
	}
	if p.lora {
		if err := p.m.SavePEFT(ctx, filepath.Join(dir, ckptAdapterDir)); err != nil {
			return fmt.Errorf("save adapter: %w", err)
		}
	} else if err := p.m.SaveHF(ctx, filepath.Join(dir, ckptModelDir)); err != nil {
		return fmt.Errorf("save weights: %w", err)
	}
	if p.shards != nil {
		if err := p.shards.write(ctx, step); err != nil {
			return fmt.Errorf("save optimizer: %w", err)
		}
		if err := p.shards.merge(ctx, p.m, step, filepath.Join(dir, ckptOptimizer)); err != nil {
			return fmt.Errorf("save optimizer: %w", err)
		}
		return nil
	}
	if err := p.m.SaveOptimizer(ctx, filepath.Join(dir, ckptOptimizer)); err != nil {
		return fmt.Errorf("save optimizer: %w", err)
	}
	return nil
}

// checkpointPublished runs once step's checkpoint is in place (rank 0): the
// optimizer slices it merged are no longer needed. Callers treat an error
// as harmless (the checkpoint is saved; the next run clears the slices).
func (p *workerPolicy) checkpointPublished(step int) error {
	if p.shards == nil {
		return nil
	}
	if err := p.shards.published(step); err != nil {
		return fmt.Errorf("remove the merged optimizer slices of step %d: %w", step, err)
	}
	return nil
}

// saveShard is the part of step's checkpoint a rank other than 0 writes:
// its optimizer slice when the optimizer is sharded, else nothing.
func (p *workerPolicy) saveShard(ctx context.Context, step int) error {
	if p.shards == nil {
		return nil
	}
	return p.shards.write(ctx, step)
}

// writeShardedCheckpoint is rank 0's checkpoint when the parameters are
// sharded (worker.shard parameters): every rank's file holds its slice of
// the parameters next to its AdamW state, so the weights are merged from
// the files as the optimizer is, with no collective (the group may be
// broken by an interrupt) and one tensor whole at a time.
func (p *workerPolicy) writeShardedCheckpoint(ctx context.Context, dir string, step int) error {
	if err := p.shards.write(ctx, step); err != nil {
		return fmt.Errorf("save parameters and optimizer: %w", err)
	}
	paths, err := p.shards.await(ctx, step)
	if err != nil {
		return fmt.Errorf("save parameters and optimizer: %w", err)
	}
	if p.lora {
		if err := p.m.SavePEFTFromShards(ctx, filepath.Join(dir, ckptAdapterDir), paths); err != nil {
			return fmt.Errorf("save adapter: %w", err)
		}
	} else if err := p.m.SaveHFFromShards(ctx, filepath.Join(dir, ckptModelDir), paths); err != nil {
		return fmt.Errorf("save weights: %w", err)
	}
	if err := p.m.MergeOptimizerShards(ctx, filepath.Join(dir, ckptOptimizer), paths); err != nil {
		return fmt.Errorf("save optimizer: %w", err)
	}
	return nil
}

// restore loads a checkpoint's adapter and optimizer state into the model
// (full weights are loaded by opening the checkpoint's model directory).
func (p *workerPolicy) restore(ctx context.Context, dir string) error {
	if p.lora {
		if err := p.m.LoadPEFT(ctx, filepath.Join(dir, ckptAdapterDir)); err != nil {
			return fmt.Errorf("load adapter: %w", err)
		}
	}
	if err := p.m.LoadOptimizer(ctx, filepath.Join(dir, ckptOptimizer)); err != nil {
		return fmt.Errorf("load optimizer: %w", err)
	}
	return nil
}

// checkpointModelDir is the directory to load weights from when resuming.
func checkpointModelDir(ckpt, base string, lora bool) string {
	if lora {
		return base
	}
	if st, err := os.Stat(filepath.Join(ckpt, ckptModelDir)); err == nil && st.IsDir() {
		return filepath.Join(ckpt, ckptModelDir)
	}
	return base
}
