//go:build cgo

package worker

/*
#include "dlapi.h"
*/
import "C"

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/ortrain/ortrain/internal/grpo"
)

// cBatch copies rows into a C ort_batch.
func cBatch(ar *arena, rows []grpo.Row, roundTokens float64, gradAccum, packTokens int) (*C.ort_batch, error) {
	if len(rows) == 0 {
		return nil, ErrEmptyBatch
	}
	var nTok, nComp int
	var anySampler, anyOld, anyRef bool
	for i, r := range rows {
		T := r.CompletionLen()
		if r.PromptLen < 1 || T < 0 {
			return nil, fmt.Errorf("row %d: PromptLen %d must be in [1, %d]", i, r.PromptLen, len(r.Tokens))
		}
		for name, n := range map[string]int{"LossMask": len(r.LossMask), "SamplerLogprobs": len(r.SamplerLogprobs),
			"OldLogprobs": len(r.OldLogprobs), "RefLogprobs": len(r.RefLogprobs)} {
			if (name == "LossMask" || n != 0) && n != T {
				return nil, fmt.Errorf("row %d: %s has %d entries, want %d (the completion length)", i, name, n, T)
			}
		}
		nTok += len(r.Tokens)
		nComp += T
		anySampler = anySampler || r.SamplerLogprobs != nil
		anyOld = anyOld || r.OldLogprobs != nil
		anyRef = anyRef || r.RefLogprobs != nil
	}
	bp, _ := carray[C.ort_batch](ar, 1)
	b := (*C.ort_batch)(bp)
	tokp, tok := carray[int32](ar, nTok)
	toffp, toff := carray[int64](ar, len(rows)+1)
	coffp, coff := carray[int64](ar, len(rows)+1)
	plenp, plen := carray[int32](ar, len(rows))
	maskp, mask := carray[uint8](ar, nComp)
	advp, adv := carray[float32](ar, len(rows))
	opt := func(present bool, get func(grpo.Row) []float32, dst **C.float, has **C.uint8_t) {
		if !present {
			return
		}
		vp, v := carray[float32](ar, nComp)
		hp, h := carray[uint8](ar, len(rows))
		for i, r := range rows {
			if x := get(r); x != nil {
				copy(v[coff[i]:], x)
				h[i] = 1
			}
		}
		*dst, *has = (*C.float)(vp), (*C.uint8_t)(hp)
	}
	for i, r := range rows {
		copy(tok[toff[i]:], r.Tokens)
		toff[i+1] = toff[i] + int64(len(r.Tokens))
		coff[i+1] = coff[i] + int64(r.CompletionLen())
		copy(mask[coff[i]:], r.LossMask)
		plen[i] = int32(r.PromptLen)
		adv[i] = r.Advantage
	}
	opt(anySampler, func(r grpo.Row) []float32 { return r.SamplerLogprobs }, &b.sampler_logps, &b.has_sampler)
	opt(anyOld, func(r grpo.Row) []float32 { return r.OldLogprobs }, &b.old_logps, &b.has_old)
	opt(anyRef, func(r grpo.Row) []float32 { return r.RefLogprobs }, &b.ref_logps, &b.has_ref)
	b.n_rows = C.int32_t(len(rows))
	b.tokens, b.token_off, b.comp_off = (*C.int32_t)(tokp), (*C.int64_t)(toffp), (*C.int64_t)(coffp)
	b.prompt_len, b.loss_mask, b.advantages = (*C.int32_t)(plenp), (*C.uint8_t)(maskp), (*C.float)(advp)
	b.round_tokens, b.grad_accum = C.double(roundTokens), C.int32_t(gradAccum)
	if packTokens > 0 {
		lengths := make([]int, len(rows))
		for i, r := range rows {
			lengths[i] = len(r.Tokens)
		}
		seq := PackRows(lengths, packTokens).Seq
		sp, s := carray[int32](ar, len(rows))
		copy(s, seq)
		b.pack_seq = (*C.int32_t)(sp)
	}
	return b, nil
}

// begin locks the model and checks it is usable and ctx is live.
func (m *Model) begin(ctx context.Context) (func(), error) {
	m.mu.Lock()
	if m.h == nil {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		m.mu.Unlock()
		return nil, err
	}
	return m.mu.Unlock, nil
}

// Logprobs returns per-token log-probs and entropies of each row's
// completion tokens at temperature (grpo-reference.md §4.1), with the
// reference policy when ref is set. No gradients are kept.
func (m *Model) Logprobs(ctx context.Context, rows []grpo.Row, temperature float64, ref bool) (logps, entropies [][]float32, err error) {
	nComp := 0
	for _, r := range rows {
		nComp += max(r.CompletionLen(), 0)
	}
	lp, ent := make([]float32, nComp), make([]float32, nComp)
	if err := m.logprobsInto(ctx, rows, temperature, ref, lp, ent); err != nil {
		return nil, nil, err
	}
	off := 0
	for _, r := range rows {
		T := r.CompletionLen()
		logps = append(logps, append([]float32(nil), lp[off:off+T]...))
		entropies = append(entropies, append([]float32(nil), ent[off:off+T]...))
		off += T
	}
	return logps, entropies, nil
}

// logprobsInto writes the rows' completion log-probs and entropies, one
// after another, into logps and entropies; the worker checks that they have
// room.
func (m *Model) logprobsInto(ctx context.Context, rows []grpo.Row, temperature float64, ref bool, logps, entropies []float32) error {
	if err := m.checkRowsWindow(rows); err != nil {
		return fmt.Errorf("logprobs: %w", err)
	}
	unlock, err := m.begin(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	var ar arena
	defer ar.free()
	b, err := cBatch(&ar, rows, 1, 1, m.opts.PackTokens)
	if err != nil {
		return fmt.Errorf("logprobs: %w", err)
	}
	cf := watchCancel(ctx)
	defer cf.stop()
	eb := newErrBuf()
	defer eb.free()
	// The slices hold no Go pointers, so the worker may write into them.
	err = m.call(eb, "logprobs", func() C.int {
		return C.ort_call_logprobs(m.api, m.h, b, C.double(temperature), cbool(ref),
			(*C.float)(unsafe.SliceData(logps)), C.size_t(len(logps)),
			(*C.float)(unsafe.SliceData(entropies)), C.size_t(len(entropies)), cf.p, eb.p, errLen)
	})
	return callErr(ctx, err)
}

// ForwardBackward computes the micro-batch loss of cfg and accumulates its
// gradients; call OptimizerStep after the last micro-batch of a step.
func (m *Model) ForwardBackward(ctx context.Context, mb grpo.MicroBatch, cfg grpo.LossConfig) (LossStats, error) {
	return m.loss(ctx, mb, cfg, true)
}

// EvalLoss computes the same loss and metrics without gradients.
func (m *Model) EvalLoss(ctx context.Context, mb grpo.MicroBatch, cfg grpo.LossConfig) (LossStats, error) {
	return m.loss(ctx, mb, cfg, false)
}

func (m *Model) loss(ctx context.Context, mb grpo.MicroBatch, cfg grpo.LossConfig, backward bool) (LossStats, error) {
	if err := cfg.Validate(); err != nil {
		return LossStats{}, err
	}
	if err := m.checkRowsWindow(mb.Rows); err != nil {
		return LossStats{}, fmt.Errorf("forward/backward: %w", err)
	}
	unlock, err := m.begin(ctx)
	if err != nil {
		return LossStats{}, err
	}
	defer unlock()
	var ar arena
	defer ar.free()
	b, err := cBatch(&ar, mb.Rows, mb.RoundTokens, mb.GradAccumSteps, m.opts.PackTokens)
	if err != nil {
		return LossStats{}, fmt.Errorf("forward/backward: %w", err)
	}
	c := C.ort_loss_config{
		loss_type: C.int32_t(cfg.Type), is_level: C.int32_t(cfg.ISLevel), is_correction: C.int32_t(cfg.ISCorrection),
		epsilon: C.double(cfg.Epsilon), epsilon_high: C.double(cfg.EpsilonHigh), delta: C.double(cfg.Delta),
		beta: C.double(cfg.Beta), temperature: C.double(cfg.Temperature), max_completion_length: C.int32_t(cfg.MaxCompletionLength),
		sapo_temp_pos: C.double(cfg.SAPOTemperaturePos), sapo_temp_neg: C.double(cfg.SAPOTemperatureNeg),
		vespo_k_pos: C.double(cfg.VESPOKPos), vespo_lambda_pos: C.double(cfg.VESPOLambdaPos),
		vespo_k_neg: C.double(cfg.VESPOKNeg), vespo_lambda_neg: C.double(cfg.VESPOLambdaNeg),
		is_clip_min: C.double(cfg.ISClipMin), is_clip_max: C.double(cfg.ISClipMax), entropy_coef: C.double(cfg.EntropyCoef),
		logprob_path: C.int32_t(m.opts.LogprobPath),
	}
	// LossStats holds no Go pointers, so the worker may write into it.
	var st LossStats
	cf := watchCancel(ctx)
	defer cf.stop()
	eb := newErrBuf()
	defer eb.free()
	err = m.call(eb, "forward/backward", func() C.int {
		return C.ort_call_forward_backward(m.api, m.h, b, &c, cbool(backward), (*C.ort_loss_stats)(unsafe.Pointer(&st)), cf.p, eb.p, errLen)
	})
	if err := callErr(ctx, err); err != nil {
		return LossStats{}, err
	}
	return st, nil
}

// OptimizerStep clips the accumulated gradients by global norm, applies
// AdamW at lr and zeroes the gradients.
func (m *Model) OptimizerStep(ctx context.Context, lr float64) (StepStats, error) {
	if !(lr >= 0) {
		return StepStats{}, fmt.Errorf("optimizer step: learning rate %v must be >= 0", lr)
	}
	unlock, err := m.begin(ctx)
	if err != nil {
		return StepStats{}, err
	}
	defer unlock()
	eb := newErrBuf()
	defer eb.free()
	var norm C.double
	if err := m.call(eb, "optimizer step", func() C.int { return C.ort_call_optimizer_step(m.api, m.h, C.double(lr), &norm, eb.p, errLen) }); err != nil {
		return StepStats{}, err
	}
	return StepStats{GradNorm: float64(norm), LR: lr}, nil
}

// ZeroGrad drops accumulated gradients (e.g. after a skipped step).
func (m *Model) ZeroGrad(ctx context.Context) error {
	unlock, err := m.begin(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	eb := newErrBuf()
	defer eb.free()
	return m.call(eb, "zero grad", func() C.int { return C.ort_call_zero_grad(m.api, m.h, eb.p, errLen) })
}

// DeviceMemory reads the device allocator's bytes (CUDA, with libtorch 2.10
// or later: torch.cuda.memory_allocated and max_memory_allocated) and, with
// resetPeak, starts a new peak. ok is false where the allocator cannot tell:
// a CPU model (the process's RSS is its memory) or an older libtorch.
func (m *Model) DeviceMemory(ctx context.Context, resetPeak bool) (mem DeviceMemory, ok bool, err error) {
	unlock, err := m.begin(ctx)
	if err != nil {
		return DeviceMemory{}, false, err
	}
	defer unlock()
	eb := newErrBuf()
	defer eb.free()
	var out C.ort_device_memory_stats
	if err := m.call(eb, "device memory", func() C.int {
		return C.ort_call_device_memory(m.api, m.h, cbool(resetPeak), &out, eb.p, errLen)
	}); err != nil {
		return DeviceMemory{}, false, err
	}
	return DeviceMemory{Allocated: int64(out.allocated), PeakAllocated: int64(out.peak_allocated)}, out.available != 0, nil
}
