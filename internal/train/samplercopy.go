package train

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/worker"
)

// samplerCopy is the builtin engine of an async run: it samples with its
// own copy of the policy, a second worker model loaded from the same model
// directory, so a round generates while the trainer's model trains.
// SyncWeights copies the trainable weights (with LoRA: the adapters and
// modules_to_save) from the policy. The copy runs on a library handle of
// its own: every call of one handle runs on one locked OS thread, so two
// models on one handle would take turns.
type samplerCopy struct {
	*engine.Builtin
	lib  *worker.Library
	m    *worker.Model
	src  *worker.Model
	kind worker.TensorKind
	// Bytes is the size of the weights each sync copies.
	Bytes int64
}

// newSamplerCopy loads the sampler's model next to policy and gives it the
// policy's current weights.
func newSamplerCopy(ctx context.Context, cfg *config.Config, modelDir string, policy *workerPolicy, log zerolog.Logger) (_ *samplerCopy, err error) {
	lib, err := worker.Open(policy.libPath)
	if err != nil {
		return nil, err
	}
	rss0 := residentBytes()
	opts := modelOptions(cfg, modelDir, false)
	if cfg.Async.SamplerThreads > 0 {
		opts.Threads = cfg.Async.SamplerThreads
	}
	m, err := lib.LoadModel(ctx, opts)
	if err != nil {
		lib.Close()
		return nil, fmt.Errorf("load the sampler's copy of the policy: %w", err)
	}
	s := &samplerCopy{lib: lib, m: m, src: policy.m, kind: worker.KindWeight}
	if policy.lora {
		s.kind = worker.KindLoRA
	}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if err := s.SyncWeights(ctx, 0); err != nil {
		return nil, fmt.Errorf("copy the policy's weights to the sampler: %w", err)
	}
	rss := residentBytes() - rss0
	log.Info().Int64("weights_mib", s.Bytes>>20).Int64("rss_added_mib", rss>>20).Int("threads", opts.Threads).Msg("async: sampling with a copy of the policy")
	// The copy batches as the synchronous engine does (engine.batching).
	if s.Builtin, err = newBuiltinEngine(ctx, cfg, m, log); err != nil {
		return nil, err
	}
	return s, nil
}

// SyncWeights copies the policy's trainable weights into the sampler's
// model, one tensor at a time. The loop calls it only while no round is
// generating.
func (s *samplerCopy) SyncWeights(ctx context.Context, step int) error {
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
		if err := s.m.WriteTensor(s.kind, model.Tensor{Name: t.Name, DType: t.DType, Shape: t.Shape, Data: data}); err != nil {
			return fmt.Errorf("sync step %d: %w", step, err)
		}
		n += int64(len(data))
	}
	s.Bytes = n
	return nil
}

// SamplerLogprobs scores rows with the sampler's weights (temperature
// applied, no top-k/top-p truncation), in one deterministic pass.
func (s *samplerCopy) SamplerLogprobs(ctx context.Context, rows []grpo.Row, temperature float64) ([][]float32, error) {
	lp, _, err := s.m.Logprobs(ctx, rows, temperature, false)
	return lp, err
}

// Close stops the batcher, then frees the copy and its library handle.
func (s *samplerCopy) Close() error {
	if s.Builtin != nil {
		_ = s.Builtin.Close()
	}
	return s.close()
}

func (s *samplerCopy) close() error {
	err := s.m.Close()
	_ = s.lib.Close()
	return err
}

// residentBytes is the process's resident set size (0 where /proc is absent).
func residentBytes() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if f := bytes.Fields(sc.Bytes()); len(f) >= 2 && string(f[0]) == "VmRSS:" {
			kb, _ := strconv.ParseInt(string(f[1]), 10, 64)
			return kb << 10
		}
	}
	return 0
}
