package worker

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestChooseDecodeKernels: auto takes oneDNN's sgemm only where it measured
// faster by the margin; a missing, slower, tied or unmeasured oneDNN falls
// back to at::mm, and the fixed modes ignore the numbers.
func TestChooseDecodeKernels(t *testing.T) {
	on := &OneDNNInfo{Active: true, Library: "/usr/lib/libdnnl.so.2"}
	off := &OneDNNInfo{Detail: "no libdnnl.so* is loaded"}
	g := func(rows int64, onednn, aten float64) GemmTiming {
		return GemmTiming{Rows: rows, K: 64, N: 128, OneDNNSeconds: onednn, ATenSeconds: aten}
	}
	attn := func(fused, aten float64) AttentionTiming {
		return AttentionTiming{Rows: 16, Heads: 4, KVHeads: 2, HeadDim: 16, Keys: 128, FusedSeconds: fused, ATenSeconds: aten}
	}
	for _, tc := range []struct {
		name      string
		mode      string
		bench     KernelBench
		oneDNN    *OneDNNInfo
		backends  [3]string // of the one shape
		attention string
		fallback  string
		err       error
	}{
		{"faster onednn wins", KernelsAuto, KernelBench{Gemm: []GemmTiming{g(1, 1, 3), g(16, 1, 3), g(128, 1, 3)}, Attention: []AttentionTiming{attn(1, 2)}}, on,
			[3]string{"onednn", "onednn", "onednn"}, "fused", "aten", nil},
		{"slower onednn loses", KernelsAuto, KernelBench{Gemm: []GemmTiming{g(1, 3, 1), g(16, 1, 3), g(128, 3, 1)}, Attention: []AttentionTiming{attn(2, 1)}}, on,
			[3]string{"aten", "onednn", "aten"}, "aten", "aten", nil},
		{"a tie goes to at::mm", KernelsAuto, KernelBench{Gemm: []GemmTiming{g(1, 1, 1.05), g(16, 1, 1), g(128, 1, 1.2)}}, on,
			[3]string{"aten", "aten", "onednn"}, "aten", "aten", nil},
		{"missing onednn falls back", KernelsAuto, KernelBench{Gemm: []GemmTiming{g(1, -1, 3), g(16, -1, 3), g(128, -1, 3)}, Attention: []AttentionTiming{attn(1, 2)}}, off,
			[3]string{"aten", "aten", "aten"}, "fused", "aten", nil},
		{"unmeasured falls back", KernelsAuto, KernelBench{Gemm: []GemmTiming{g(1, 1, 3), g(16, 0, 0), g(128, 0, 0)}, Attention: []AttentionTiming{attn(0, 0)}}, on,
			[3]string{"onednn", "aten", "aten"}, "aten", "aten", nil},
		{"torch fixes at::mm", KernelsTorch, KernelBench{Gemm: []GemmTiming{g(16, 1, 3)}}, on,
			[3]string{}, "aten", "aten", nil},
		{"onednn fixes onednn", KernelsOneDNN, KernelBench{}, on, [3]string{}, "fused", "onednn", nil},
		{"onednn without it fails", KernelsOneDNN, KernelBench{}, off, [3]string{}, "", "", ErrOneDNNUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, err := chooseDecodeKernels(tc.mode, tc.bench, tc.oneDNN)
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.True(t, k.Applies)
			assert.Equal(t, tc.attention, k.Attention)
			assert.Equal(t, tc.fallback, k.Fallback)
			if tc.mode != KernelsAuto {
				assert.Empty(t, k.Gemm)
				return
			}
			require.Len(t, k.Gemm, 1)
			assert.Equal(t, tc.backends, k.Gemm[0].Backends)
		})
	}
	_, err := chooseDecodeKernels("fastest", KernelBench{}, on)
	require.Error(t, err)
}

func TestDecodeKernelsSpec(t *testing.T) {
	k := DecodeKernels{Fallback: "aten", Attention: "fused", Gemm: []GemmChoice{
		{K: 64, N: 128, Backends: [3]string{"onednn", "aten", "onednn"}}, {K: 128, N: 64, Backends: [3]string{"aten", "aten", "aten"}}}}
	assert.Equal(t, "fallback=aten attention=fused gemm:64x128=onednn,aten,onednn gemm:128x64=aten,aten,aten", k.spec())
	o, n := k.OneDNNProducts()
	assert.Equal(t, 2, o)
	assert.Equal(t, 6, n)
	for rows, class := range map[int64]int{1: 0, 4: 0, 5: 1, 16: 1, 45: 1, 46: 2, 512: 2} {
		assert.Equal(t, class, rowsClass(rows), "rows %d", rows)
	}
}

// TestKernelCacheMeasuresOnce: the first load measures and writes the
// cache, later ones with the same shapes measure nothing and get the same
// numbers, new shapes are measured alone and added; concurrent loads agree.
func TestKernelCacheMeasuresOnce(t *testing.T) {
	dir := t.TempDir()
	machine := KernelMeasurements{CPU: CPU{Model: "test cpu", FlagsHash: "abc"}, Libtorch: "1.13.0", Threads: 2}
	var mu sync.Mutex
	measured := 0
	fake := func(b KernelBench) (KernelBench, error) {
		mu.Lock()
		defer mu.Unlock()
		measured += len(b.Gemm) + len(b.Attention)
		for i := range b.Gemm {
			b.Gemm[i].OneDNNSeconds, b.Gemm[i].ATenSeconds = float64(measured), float64(i+1)
		}
		for i := range b.Attention {
			b.Attention[i].FusedSeconds, b.Attention[i].ATenSeconds = 1, 2
		}
		return b, nil
	}
	want := func(ns ...int64) KernelBench {
		var b KernelBench
		for _, n := range ns {
			b.Gemm = append(b.Gemm, GemmTiming{Rows: 16, K: 64, N: n})
		}
		b.Attention = []AttentionTiming{{Rows: 16, Heads: 4, KVHeads: 2, HeadDim: 16, Keys: 128}}
		return b
	}
	ctx := context.Background()
	first, fromCache, cacheErr, err := cachedBench(ctx, dir, machine, want(64, 128), fake)
	require.NoError(t, err)
	require.NoError(t, cacheErr)
	assert.False(t, fromCache)
	assert.Equal(t, 3, measured)

	again, fromCache, _, err := cachedBench(ctx, dir, machine, want(64, 128), fake)
	require.NoError(t, err)
	assert.True(t, fromCache)
	assert.Equal(t, 3, measured, "nothing measured again")
	assert.Equal(t, first, again)

	more, _, _, err := cachedBench(ctx, dir, machine, want(64, 128, 256), fake)
	require.NoError(t, err)
	assert.Equal(t, 4, measured, "only the new shape is measured")
	assert.Equal(t, first.Gemm, more.Gemm[:2])

	other := machine
	other.Threads = 1
	_, fromCache, _, err = cachedBench(ctx, dir, other, want(64), fake)
	require.NoError(t, err)
	assert.False(t, fromCache, "another thread count is another machine key")

	// Loads at once (ranks, the sampler copy) serialise on the lock and
	// agree on every number.
	fresh := t.TempDir()
	results := make([]KernelBench, 6)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, _, _, err := cachedBench(ctx, fresh, machine, want(64, 128), fake)
			assert.NoError(t, err)
			results[i] = b
		}()
	}
	wg.Wait()
	for _, r := range results[1:] {
		assert.Equal(t, results[0], r)
	}

	ms, err := ReadKernelCache(dir)
	require.NoError(t, err)
	assert.Len(t, ms, 2)
}

// TestKernelCacheSurvivesBadFiles: a damaged cache is measured over, an
// unusable directory still measures (and says why nothing was kept), and a
// failed measurement is the load's error.
func TestKernelCacheSurvivesBadFiles(t *testing.T) {
	ctx := context.Background()
	machine := KernelMeasurements{CPU: CPU{Model: "test cpu"}, Threads: 2}
	want := KernelBench{Gemm: []GemmTiming{{Rows: 1, K: 8, N: 8}}}
	ok := func(b KernelBench) (KernelBench, error) {
		b.Gemm[0].OneDNNSeconds, b.Gemm[0].ATenSeconds = 1, 2
		return b, nil
	}
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, kernelCacheFile), []byte("{not json"), 0o644))
	got, _, cacheErr, err := cachedBench(ctx, dir, machine, want, ok)
	require.NoError(t, err)
	require.NoError(t, cacheErr)
	assert.Equal(t, 2.0, got.Gemm[0].ATenSeconds)
	_, fromCache, _, err := cachedBench(ctx, dir, machine, want, ok)
	require.NoError(t, err)
	assert.True(t, fromCache, "the damaged file was replaced")

	blocked := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(blocked, nil, 0o644))
	got, _, cacheErr, err = cachedBench(ctx, filepath.Join(blocked, "sub"), machine, want, ok)
	require.NoError(t, err)
	require.Error(t, cacheErr, "a directory that cannot be made is reported")
	assert.Equal(t, 2.0, got.Gemm[0].ATenSeconds)

	boom := errors.New("boom")
	_, _, _, err = cachedBench(ctx, t.TempDir(), machine, want, func(KernelBench) (KernelBench, error) { return KernelBench{}, boom })
	require.ErrorIs(t, err, boom)
}

func TestParseCPUInfo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpuinfo")
	require.NoError(t, os.WriteFile(path, []byte("processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu fma avx2 avx512f avx512_bf16\n\n"+
		"processor\t: 1\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu fma avx2 avx512f avx512_bf16\n"), 0o644))
	c := parseCPUInfo(path)
	assert.Equal(t, "AMD EPYC 9R14", c.Model)
	assert.Equal(t, []string{"fma", "avx2", "avx512f", "avx512_bf16"}, c.ISA)
	assert.NotEmpty(t, c.FlagsHash)
	assert.Equal(t, "AMD EPYC 9R14 (fma avx2 avx512f avx512_bf16)", c.String())
	missing := parseCPUInfo(filepath.Join(t.TempDir(), "none"))
	assert.NotEmpty(t, missing.Model)
}
