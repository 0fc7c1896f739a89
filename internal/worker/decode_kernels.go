package worker

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Decode kernel modes (ModelOptions.DecodeKernels, worker.decode_kernels).
const (
	// KernelsAuto measures oneDNN's sgemm against at::mm, and the fused
	// decode attention against ATen's, on the model's own shapes at load
	// (once per machine: the numbers are cached) and takes the faster.
	KernelsAuto = "auto"
	// KernelsTorch runs every decode product on at::mm and attention on
	// ATen's ops: libtorch's own kernels, as training uses.
	KernelsTorch = "torch"
	// KernelsOneDNN runs every decode product on oneDNN's sgemm and
	// attention on the fused loop (ortrain's choice before it measured);
	// loading fails where oneDNN's sgemm is unavailable.
	KernelsOneDNN = "onednn"
)

// KernelModes lists the accepted modes, for help and errors.
var KernelModes = []string{KernelsAuto, KernelsTorch, KernelsOneDNN}

// Backend names in DecodeKernels and the spec the C side parses.
const (
	backendOneDNN = "onednn"
	backendATen   = "aten"
	attnFused     = "fused"
)

// oneDNNMargin is how much faster oneDNN's sgemm must measure before auto
// prefers it to at::mm: the kernel training uses keeps the sampler's
// log-probs nearest the trainer's, so a tie goes to it.
const oneDNNMargin = 1.10

// timedRows mirrors kTimedRows (csrc/decode_kernels.cpp): a product with
// more output columns is timed on this many.
const timedRows = 4096

// GemmTiming is one measured decode product, x [Rows, K] times w [N, K]^T
// (csrc: ort_gemm_timing). Seconds are the fastest of several runs;
// OneDNNSeconds < 0 means oneDNN's sgemm is unavailable, 0 (in a
// hand-made KernelBench) not measured.
type GemmTiming struct {
	Rows          int64   `json:"rows"`
	K             int64   `json:"k"`
	N             int64   `json:"n"`
	Serial        bool    `json:"serial,omitempty"` // timed on one thread, as the decode step of these rows runs
	OneDNNSeconds float64 `json:"onednn_s"`
	ATenSeconds   float64 `json:"aten_s"`
}

// GFLOPS is the product's rate at seconds per product.
func (t GemmTiming) GFLOPS(seconds float64) float64 {
	if seconds <= 0 {
		return 0
	}
	return 2 * float64(t.Rows*t.K*min(t.N, timedRows)) / seconds / 1e9
}

func (t GemmTiming) measured() bool { return t.ATenSeconds > 0 }

// AttentionTiming is one measured decode attention: Rows queries of Heads
// heads against Keys cached keys of KVHeads heads.
type AttentionTiming struct {
	Rows         int64   `json:"rows"`
	Heads        int64   `json:"heads"`
	KVHeads      int64   `json:"kv_heads"`
	HeadDim      int64   `json:"head_dim"`
	Keys         int64   `json:"keys"`
	Serial       bool    `json:"serial,omitempty"`
	FusedSeconds float64 `json:"fused_s"`
	ATenSeconds  float64 `json:"aten_s"`
}

func (t AttentionTiming) measured() bool { return t.ATenSeconds > 0 && t.FusedSeconds > 0 }

// KernelMeasurement is one run of the decode-kernel micro-benchmark.
type KernelMeasurement struct {
	CPU       CPU         `json:"cpu"`
	Threads   int         `json:"threads"`
	Bench     KernelBench `json:"bench"`
	FromCache bool        `json:"from_cache"`
	CachePath string      `json:"cache_path,omitempty"`
	// CacheProblem says why the cache was not used or not written ("" when
	// it was): the measurement still holds, a later load measures again.
	CacheProblem string  `json:"cache_problem,omitempty"`
	Seconds      float64 `json:"seconds"` // spent measuring in this call
}

// KernelBench is what the micro-benchmark measured.
type KernelBench struct {
	Gemm      []GemmTiming      `json:"gemm"`
	Attention []AttentionTiming `json:"attention"`
}

// GemmChoice is the backend of one (K, N) product at 1, 16 and 128 rows
// (a product of M rows takes the nearest).
type GemmChoice struct {
	K        int64     `json:"k"`
	N        int64     `json:"n"`
	Backends [3]string `json:"backends"`
}

// DecodeKernels is a model's choice of CPU float32 decode kernels.
type DecodeKernels struct {
	// Applies is false for a model that never runs them (CUDA, 16-bit,
	// float64): the fields below are then empty.
	Applies bool   `json:"applies"`
	Mode    string `json:"mode"` // auto, torch, onednn
	// Source says where an auto choice's numbers came from: "measured" (in
	// MeasureSeconds), or "cached" (a file of this machine's earlier
	// measurements, CachePath).
	Source         string       `json:"source,omitempty"`
	CachePath      string       `json:"cache_path,omitempty"`
	MeasureSeconds float64      `json:"measure_s,omitempty"`
	Fallback       string       `json:"fallback,omitempty"` // products not measured
	Gemm           []GemmChoice `json:"gemm,omitempty"`
	Attention      string       `json:"attention,omitempty"` // fused or aten
	Bench          KernelBench  `json:"bench"`
}

// OneDNNProducts counts the (shape, rows) products that run on oneDNN.
func (k DecodeKernels) OneDNNProducts() (onednn, all int) {
	for _, g := range k.Gemm {
		for _, b := range g.Backends {
			all++
			if b == backendOneDNN {
				onednn++
			}
		}
	}
	return onednn, all
}

// Summary is one line for logs: the choice and where it came from.
func (k DecodeKernels) Summary() string {
	if !k.Applies {
		return "not used (a CUDA or non-float32 model)"
	}
	if k.Mode != KernelsAuto {
		return fmt.Sprintf("%s (set by worker.decode_kernels): matmuls on %s, attention %s", k.Mode, k.Fallback, k.Attention)
	}
	o, n := k.OneDNNProducts()
	src := k.Source
	if k.Source == "measured" {
		src = fmt.Sprintf("measured in %.2f s", k.MeasureSeconds)
	}
	return fmt.Sprintf("auto (%s): oneDNN sgemm on %d of %d products, at::mm on the rest; attention %s", src, o, n, k.Attention)
}

// ErrOneDNNUnavailable is wrapped by the error of decode_kernels: onednn
// where the worker's libtorch carries no oneDNN sgemm.
var ErrOneDNNUnavailable = errors.New("oneDNN's sgemm is unavailable")

// chooseDecodeKernels turns a mode and, for auto, the measurements into a
// choice. oneDNN is taken only where measured faster by oneDNNMargin;
// anything unmeasured or unavailable runs on libtorch's own kernels.
func chooseDecodeKernels(mode string, bench KernelBench, oneDNN *OneDNNInfo) (DecodeKernels, error) {
	k := DecodeKernels{Applies: true, Mode: mode, Bench: bench}
	switch mode {
	case KernelsTorch:
		k.Fallback, k.Attention = backendATen, backendATen
		return k, nil
	case KernelsOneDNN:
		if oneDNN == nil || !oneDNN.Active {
			why := "the worker library does not report it"
			if oneDNN != nil {
				why = oneDNN.Detail
			}
			return k, fmt.Errorf("worker.decode_kernels: onednn: %w (%s); use auto or torch", ErrOneDNNUnavailable, why)
		}
		k.Fallback, k.Attention = backendOneDNN, attnFused
		return k, nil
	case KernelsAuto:
	default:
		return k, fmt.Errorf("worker.decode_kernels: %q is unknown (allowed: %s)", mode, strings.Join(KernelModes, ", "))
	}
	k.Fallback = backendATen
	byShape := map[[2]int64]*GemmChoice{}
	for _, t := range bench.Gemm {
		key := [2]int64{t.K, t.N}
		c := byShape[key]
		if c == nil {
			c = &GemmChoice{K: t.K, N: t.N, Backends: [3]string{backendATen, backendATen, backendATen}}
			byShape[key] = c
		}
		if t.measured() && t.OneDNNSeconds > 0 && t.OneDNNSeconds*oneDNNMargin < t.ATenSeconds {
			c.Backends[rowsClass(t.Rows)] = backendOneDNN
		}
	}
	for _, c := range byShape {
		k.Gemm = append(k.Gemm, *c)
	}
	slices.SortFunc(k.Gemm, func(a, b GemmChoice) int {
		if a.K != b.K {
			return int(a.K - b.K)
		}
		return int(a.N - b.N)
	})
	var fused, aten float64
	for _, t := range bench.Attention {
		if t.measured() {
			fused += t.FusedSeconds
			aten += t.ATenSeconds
		}
	}
	k.Attention = backendATen
	if fused > 0 && fused < aten {
		k.Attention = attnFused
	}
	return k, nil
}

// rowsClass mirrors rows_class (csrc/onednn.cpp): 1, 16 or 128 rows.
func rowsClass(rows int64) int {
	switch {
	case rows <= 4:
		return 0
	case rows <= 45:
		return 1
	}
	return 2
}

// spec is the choice in ort_model_set_decode_kernels's format.
func (k DecodeKernels) spec() string {
	f := []string{"fallback=" + k.Fallback, "attention=" + k.Attention}
	for _, g := range k.Gemm {
		f = append(f, fmt.Sprintf("gemm:%dx%d=%s", g.K, g.N, strings.Join(g.Backends[:], ",")))
	}
	return strings.Join(f, " ")
}
