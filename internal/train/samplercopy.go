package train

import (
	"context"
	"errors"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/memstat"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/worker"
)

// samplerCopy is the builtin engine of an async run: it samples with its
// own copies of the policy, second worker models loaded from the same
// model directory, so rounds generate while the trainer's model trains.
// With async.sampler_copies 2 it holds two weight versions: copy v%2 holds
// version v, so the rounds of version v+1 start while those of version v
// still run (pipeline depth 2). SyncWeights copies the trainable weights
// (with LoRA: the adapters and modules_to_save) from the policy into the
// copy of that version. Each copy runs on a library handle of its own:
// every call of one handle runs on one locked OS thread, so two models on
// one handle would take turns.
type samplerCopy struct {
	copies []*samplerModel
	src    *worker.Model
	// sharded is the group the policy's parameters are sharded over
	// (worker.shard parameters): a sync reads them a unit at a time, with
	// every rank, into each rank's copy.
	sharded *worker.Group
	kind    worker.TensorKind
	// latest is the copy synced last (requests without a version use it).
	latest int
	// Bytes is the size of the weights each sync copies.
	Bytes int64
}

// samplerModel is one copy: its library handle, model and batcher.
type samplerModel struct {
	lib *worker.Library
	m   *worker.Model
	gen *engine.Builtin
}

// samplerVersionKey marks a round's context with the policy version that
// generates it, so samplerCopy serves its requests from that version's copy.
type samplerVersionKey struct{}

// withSamplerVersion returns ctx for generating with policy version v.
func withSamplerVersion(ctx context.Context, v int) context.Context {
	return context.WithValue(ctx, samplerVersionKey{}, v)
}

// newSamplerCopy loads async.sampler_copies copies next to policy and
// gives them the policy's current weights.
func newSamplerCopy(ctx context.Context, cfg *config.Config, modelDir string, policy *workerPolicy, log zerolog.Logger) (_ *samplerCopy, err error) {
	s := &samplerCopy{src: policy.m, sharded: policy.params, kind: worker.KindWeight}
	if policy.lora {
		s.kind = worker.KindLoRA
	}
	defer func() {
		if err != nil {
			_ = s.Close()
		}
	}()
	rss0 := residentBytes()
	opts := modelOptions(cfg, modelDir, false)
	opts.Device = policy.device
	switch {
	case cfg.Async.SamplerThreads > 0:
		opts.Threads = cfg.Async.SamplerThreads
	case cfg.Async.MaxOffPolicySteps == 0:
		// A synchronous run (parameters sharded) samples and trains in
		// turn: the copy takes the trainer's threads.
	default:
		// The copies sample while the policy trains: half the trainer's
		// threads each keeps a small CPU from being oversubscribed.
		opts.Threads = max(1, opts.Threads/2)
	}
	copies := max(1, cfg.Async.SamplerCopies)
	if cfg.Async.MaxOffPolicySteps == 0 {
		copies = 1
	}
	for i := range copies {
		lib, err := worker.Open(policy.libPath)
		if err != nil {
			return nil, err
		}
		m, err := lib.LoadModel(ctx, opts)
		if err != nil {
			lib.Close()
			return nil, fmt.Errorf("load the sampler's copy %d of the policy: %w", i+1, err)
		}
		if i == 0 {
			logDecodeKernels(log, "sampler copy", m.DecodeKernels())
		}
		c := &samplerModel{lib: lib, m: m}
		s.copies = append(s.copies, c)
		if err := s.copyWeights(ctx, c, 0); err != nil {
			return nil, fmt.Errorf("copy the policy's weights to the sampler: %w", err)
		}
		// The copy batches as the synchronous engine does (engine.batching).
		if c.gen, err = newBuiltinEngine(ctx, cfg, m, log); err != nil {
			return nil, err
		}
	}
	rss := residentBytes() - rss0
	msg := "async: sampling with copies of the policy"
	if s.sharded != nil {
		msg = "sampling with a whole copy of the policy on this rank: its parameters are sharded (worker.shard parameters), so the builtin engine costs one model's weights per rank"
	}
	log.Info().Int("copies", len(s.copies)).Int64("weights_mib", s.Bytes>>20).Int64("rss_added_mib", rss>>20).Int("threads", opts.Threads).
		Msg(msg)
	return s, nil
}

// PipelineDepth is how many policy versions can generate at once.
func (s *samplerCopy) PipelineDepth() int { return len(s.copies) }

// copyOf is the copy serving ctx's policy version.
func (s *samplerCopy) copyOf(ctx context.Context) *samplerModel {
	if v, ok := ctx.Value(samplerVersionKey{}).(int); ok {
		return s.copies[v%len(s.copies)]
	}
	return s.copies[s.latest]
}

// Generate samples with the copy of the request's policy version.
func (s *samplerCopy) Generate(ctx context.Context, req engine.Request) (engine.Result, error) {
	return s.copyOf(ctx).gen.Generate(ctx, req)
}

// EndSession drops the KV cache a rollout kept (the runner ends a session
// without its round's context, so every copy looks the key up).
func (s *samplerCopy) EndSession(ctx context.Context, key string) error {
	var errs []error
	for _, c := range s.copies {
		errs = append(errs, c.gen.EndSession(ctx, key))
	}
	return errors.Join(errs...)
}

// SyncWeights copies the policy's trainable weights into the copy of
// version step. The loop calls it only while no round of the version that
// copy held is generating.
func (s *samplerCopy) SyncWeights(ctx context.Context, step int) error {
	i := step % len(s.copies)
	if err := s.copyWeights(ctx, s.copies[i], step); err != nil {
		return err
	}
	s.latest = i
	return nil
}

// copyWeights copies the policy's trainable weights into c, one tensor at
// a time.
func (s *samplerCopy) copyWeights(ctx context.Context, c *samplerModel, step int) error {
	if s.sharded != nil {
		var n int64
		err := s.sharded.ReadSharded(ctx, s.kind, func(t worker.TensorInfo, data []byte) error {
			n += int64(len(data))
			return c.m.WriteTensor(s.kind, model.Tensor{Name: t.Name, DType: t.DType, Shape: t.Shape, Data: data})
		})
		if err != nil {
			return fmt.Errorf("sync step %d: %w", step, err)
		}
		s.Bytes = n
		return nil
	}
	infos, err := s.src.Tensors(s.kind)
	if err != nil {
		return err
	}
	var n int64
	for _, t := range infos {
		if err := ctx.Err(); err != nil {
			return err
		}
		data, err := s.src.ReadTensor(s.kind, t)
		if err != nil {
			return fmt.Errorf("sync step %d: %w", step, err)
		}
		if err := c.m.WriteTensor(s.kind, model.Tensor{Name: t.Name, DType: t.DType, Shape: t.Shape, Data: data}); err != nil {
			return fmt.Errorf("sync step %d: %w", step, err)
		}
		n += int64(len(data))
	}
	s.Bytes = n
	return nil
}

// SamplerLogprobs scores rows with the weights of ctx's policy version
// (temperature applied, no top-k/top-p truncation), in one deterministic
// pass.
func (s *samplerCopy) SamplerLogprobs(ctx context.Context, rows []grpo.Row, temperature float64) ([][]float32, error) {
	lp, _, err := s.copyOf(ctx).m.Logprobs(ctx, rows, temperature, false)
	return lp, err
}

// Close stops the batchers, then frees the copies and their library handles.
func (s *samplerCopy) Close() error {
	var errs []error
	for _, c := range s.copies {
		if c.gen != nil {
			_ = c.gen.Close()
		}
		errs = append(errs, c.m.Close())
		_ = c.lib.Close()
	}
	return errors.Join(errs...)
}

// residentBytes is the process's resident set size (0 where /proc is absent).
func residentBytes() int64 {
	st, err := memstat.Self().Read()
	if err != nil {
		return 0
	}
	return st.RSS
}
