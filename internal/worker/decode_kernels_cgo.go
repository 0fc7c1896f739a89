//go:build cgo

package worker

/*
#include <stdlib.h>
#include "dlapi.h"
*/
import "C"

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"
	"unsafe"

	"github.com/ortrain/ortrain/internal/model"
)

// Measurement budgets: past one, each remaining product is timed once, so
// the micro-benchmark stays under a second on an idle machine and every
// product still gets a number.
const (
	gemmBudget      = 0.6 // seconds
	attentionBudget = 0.15
)

// MeasureDecodeKernels times oneDNN's sgemm against at::mm and the fused
// decode attention against ATen's on the decode shapes of a model with
// config cfg, on threads intra-op threads (process-wide, as LoadModel sets
// them). Numbers for this machine already in cacheDir are reused and new
// ones added; cacheDir "" measures everything and keeps nothing.
func (l *Library) MeasureDecodeKernels(ctx context.Context, cfg *model.Config, threads int, cacheDir string) (KernelMeasurement, error) {
	a, err := arch(cfg)
	if err != nil {
		return KernelMeasurement{}, err
	}
	eb := newErrBuf()
	defer eb.free()
	var ng, na C.int32_t
	if err := l.call(eb, "decode shapes", func() C.int {
		return C.ort_call_decode_shapes(l.api, &a, nil, 0, &ng, nil, 0, &na, eb.p, errLen)
	}); err != nil {
		return KernelMeasurement{}, err
	}
	gemm := make([]C.ort_gemm_timing, int(ng))
	attn := make([]C.ort_attention_timing, int(na))
	if err := l.call(eb, "decode shapes", func() C.int {
		return C.ort_call_decode_shapes(l.api, &a, unsafe.SliceData(gemm), ng, &ng, unsafe.SliceData(attn), na, &na, eb.p, errLen)
	}); err != nil {
		return KernelMeasurement{}, err
	}
	var want KernelBench
	for _, g := range gemm {
		want.Gemm = append(want.Gemm, GemmTiming{Rows: int64(g.rows), K: int64(g.k), N: int64(g.n), Serial: g.serial != 0})
	}
	for _, t := range attn {
		want.Attention = append(want.Attention, AttentionTiming{Rows: int64(t.rows), Heads: int64(t.heads), KVHeads: int64(t.kv_heads),
			HeadDim: int64(t.head_dim), Keys: int64(t.keys), Serial: t.serial != 0})
	}
	info := l.Info()
	machine := KernelMeasurements{CPU: HostCPU(), Libtorch: info.LibtorchVersion, Threads: threads}
	if info.OneDNN != nil && info.OneDNN.Active {
		machine.OneDNN = info.OneDNN.Library
	}
	res := KernelMeasurement{CPU: machine.CPU, Threads: threads}
	measure := func(b KernelBench) (KernelBench, error) {
		t0 := time.Now()
		defer func() { res.Seconds += time.Since(t0).Seconds() }()
		return l.benchDecodeKernels(eb, b, threads)
	}
	bench, fromCache, cacheErr, err := cachedBench(ctx, cacheDir, machine, want, measure)
	if err != nil {
		return res, err
	}
	res.Bench, res.FromCache = bench, fromCache
	if cacheDir != "" {
		res.CachePath = filepath.Join(cacheDir, kernelCacheFile)
	}
	if cacheErr != nil {
		res.CacheProblem = cacheErr.Error()
	}
	return res, nil
}

// BenchGemm times oneDNN's sgemm and at::mm on the given products (their
// seconds are filled in) on threads intra-op threads: scripts/bench-worker's
// sgemm peak.
func (l *Library) BenchGemm(shapes []GemmTiming, threads int) ([]GemmTiming, error) {
	eb := newErrBuf()
	defer eb.free()
	b, err := l.benchDecodeKernels(eb, KernelBench{Gemm: slices.Clone(shapes)}, threads)
	return b.Gemm, err
}

// benchDecodeKernels runs ort_bench_gemm and ort_bench_attention on b.
func (l *Library) benchDecodeKernels(eb errBuf, b KernelBench, threads int) (KernelBench, error) {
	gemm := make([]C.ort_gemm_timing, len(b.Gemm))
	for i, g := range b.Gemm {
		gemm[i] = C.ort_gemm_timing{rows: C.int64_t(g.Rows), k: C.int64_t(g.K), n: C.int64_t(g.N), serial: cbool(g.Serial)}
	}
	attn := make([]C.ort_attention_timing, len(b.Attention))
	for i, t := range b.Attention {
		attn[i] = C.ort_attention_timing{rows: C.int64_t(t.Rows), heads: C.int64_t(t.Heads), kv_heads: C.int64_t(t.KVHeads),
			head_dim: C.int64_t(t.HeadDim), keys: C.int64_t(t.Keys), serial: cbool(t.Serial)}
	}
	if len(gemm) > 0 {
		if err := l.call(eb, "measure decode matmuls", func() C.int {
			return C.ort_call_bench_gemm(l.api, unsafe.SliceData(gemm), C.int32_t(len(gemm)), C.int32_t(threads), C.double(gemmBudget), eb.p, errLen)
		}); err != nil {
			return b, err
		}
	}
	if len(attn) > 0 {
		if err := l.call(eb, "measure decode attention", func() C.int {
			return C.ort_call_bench_attention(l.api, unsafe.SliceData(attn), C.int32_t(len(attn)), C.int32_t(threads), C.double(attentionBudget), eb.p, errLen)
		}); err != nil {
			return b, err
		}
	}
	for i := range b.Gemm {
		b.Gemm[i].OneDNNSeconds, b.Gemm[i].ATenSeconds = float64(gemm[i].onednn_s), float64(gemm[i].aten_s)
	}
	for i := range b.Attention {
		b.Attention[i].FusedSeconds, b.Attention[i].ATenSeconds = float64(attn[i].fused_s), float64(attn[i].aten_s)
	}
	return b, nil
}

// call runs one library-level C entry point on the library's thread.
func (l *Library) call(eb errBuf, what string, f func() C.int) error {
	rc, err := l.run(f)
	if err != nil {
		return err
	}
	return eb.err(rc, what)
}

// ChooseDecodeKernels makes the choice LoadModel makes for a CPU float32
// model with config cfg: for auto, from measurements (MeasureDecodeKernels);
// for torch and onednn, without measuring.
func (l *Library) ChooseDecodeKernels(ctx context.Context, mode string, cfg *model.Config, threads int, cacheDir string) (DecodeKernels, error) {
	var bench KernelMeasurement
	if mode == KernelsAuto {
		var err error
		if bench, err = l.MeasureDecodeKernels(ctx, cfg, threads, cacheDir); err != nil {
			return DecodeKernels{}, err
		}
	}
	k, err := chooseDecodeKernels(mode, bench.Bench, l.Info().OneDNN)
	if err != nil || mode != KernelsAuto {
		return k, err
	}
	k.Source, k.CachePath, k.MeasureSeconds = "measured", bench.CachePath, bench.Seconds
	if bench.FromCache {
		k.Source = "cached"
	}
	if bench.CacheProblem != "" {
		fmt.Fprintf(os.Stderr, "ortrain worker: decode kernels measured but not cached (%s); the next load measures again\n", bench.CacheProblem)
	}
	return k, nil
}

// chooseKernels picks a loaded model's decode kernels (o.DecodeKernels) and
// sets them; a model that never runs them (CUDA, 16-bit) gets Applies false.
func (m *Model) chooseKernels(ctx context.Context, o ModelOptions) error {
	if o.Device != "cpu" || m.dtype != model.F32 {
		m.kernels = DecodeKernels{Mode: o.DecodeKernels}
		return nil
	}
	k, err := m.lib.ChooseDecodeKernels(ctx, o.DecodeKernels, m.cfg, o.Threads, o.KernelCacheDir)
	if err != nil {
		return fmt.Errorf("load model %s: choose decode kernels: %w", o.Dir, err)
	}
	eb := newErrBuf()
	defer eb.free()
	spec := C.CString(k.spec())
	defer C.free(unsafe.Pointer(spec))
	if err := m.call(eb, "set decode kernels", func() C.int { return C.ort_call_set_decode_kernels(m.api, m.h, spec, eb.p, errLen) }); err != nil {
		return err
	}
	m.kernels = k
	return nil
}

// DecodeKernels is the model's choice of CPU decode kernels (set at load).
func (m *Model) DecodeKernels() DecodeKernels {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.kernels
}
