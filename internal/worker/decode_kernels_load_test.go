//go:build cgo

package worker

import (
	"context"
	"math"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/grpo"
)

// TestDecodeKernelsMeasuredAtLoad: a CPU float32 model measures its decode
// kernels at load and takes, per product, the faster by the margin; a second
// load finds the numbers cached and chooses the same; whatever the choice
// or mode, sampling's log-probs are the training forward's.
func TestDecodeKernelsMeasuredAtLoad(t *testing.T) {
	cache := t.TempDir()
	m := loadTiny(t, ModelOptions{KernelCacheDir: cache})
	k := m.DecodeKernels()
	require.True(t, k.Applies)
	assert.Equal(t, KernelsAuto, k.Mode)
	assert.Equal(t, "measured", k.Source)
	assert.Less(t, k.MeasureSeconds, 1.0, "the micro-benchmark is bounded well under a second")
	require.NotEmpty(t, k.Bench.Gemm)
	for _, g := range k.Bench.Gemm {
		require.Greater(t, g.ATenSeconds, 0.0, "tiny's shapes all fit the budget: %+v", g)
		want := backendATen
		if g.OneDNNSeconds > 0 && g.OneDNNSeconds*oneDNNMargin < g.ATenSeconds {
			want = backendOneDNN
		}
		found := false
		for _, c := range k.Gemm {
			if c.K == g.K && c.N == g.N {
				assert.Equal(t, want, c.Backends[rowsClass(g.Rows)], "%+v", g)
				found = true
			}
		}
		assert.True(t, found, "shape %dx%d has a choice", g.K, g.N)
	}
	t.Logf("tiny: %s", k.Summary())

	again := loadTiny(t, ModelOptions{KernelCacheDir: cache}).DecodeKernels()
	assert.Equal(t, "cached", again.Source)
	assert.Equal(t, k.Gemm, again.Gemm)
	assert.Equal(t, k.Attention, again.Attention)

	for _, mode := range []string{KernelsAuto, KernelsTorch, KernelsOneDNN} {
		t.Run(mode, func(t *testing.T) {
			if mode == KernelsOneDNN && !testLib(t).Info().OneDNN.Active {
				t.Skip("this libtorch carries no oneDNN sgemm (TestDecodeKernelsWithoutOneDNN covers the refusal)")
			}
			m := loadTiny(t, ModelOptions{KernelCacheDir: cache, DecodeKernels: mode})
			assert.Equal(t, mode, m.DecodeKernels().Mode)
			assertSamplerMatchesTraining(t, m)
		})
	}
}

// assertSamplerMatchesTraining samples with the model's decode kernels and
// compares every log-prob with the training forward's (one GEMM, at::mm).
func assertSamplerMatchesTraining(t *testing.T, m *Model) {
	t.Helper()
	ctx := context.Background()
	const temp = 0.8
	var reqs []SampleRequest
	for i, p := range mixedPrompts() {
		reqs = append(reqs, SampleRequest{PromptIDs: p, MaxNewTokens: 20, Temperature: temp, Seed: int64(i)})
	}
	res, err := m.Sample(ctx, reqs)
	require.NoError(t, err)
	var rows []grpo.Row
	for i, r := range res {
		rows = append(rows, grpo.Row{Tokens: append(append([]int32{}, reqs[i].PromptIDs...), r.IDs...),
			PromptLen: len(reqs[i].PromptIDs), LossMask: make([]uint8, len(r.IDs))})
	}
	lp, _, err := m.Logprobs(ctx, rows, temp, false)
	require.NoError(t, err)
	maxDiff := 0.0
	for i := range res {
		for j := range res[i].Logprobs {
			maxDiff = math.Max(maxDiff, math.Abs(float64(res[i].Logprobs[j]-lp[i][j])))
		}
	}
	require.Less(t, maxDiff, 1e-5)
}

// TestDecodeKernelsWithoutOneDNN runs itself in a child whose libtorch
// shows no oneDNN (ORTRAIN_WORKER_ONEDNN=off): auto then runs every product
// on at::mm, still measures the attention, and an explicit onednn is
// refused at load with ErrOneDNNUnavailable.
func TestDecodeKernelsWithoutOneDNN(t *testing.T) {
	if os.Getenv("ORTRAIN_WORKER_ONEDNN") != "off" {
		testLib(t)
		cmd := exec.Command(os.Args[0], "-test.run=^TestDecodeKernelsWithoutOneDNN$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "ORTRAIN_WORKER_ONEDNN=off", "ORTRAIN_REQUIRE_WORKER=1")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "--- PASS: TestDecodeKernelsWithoutOneDNN")
		return
	}
	lib := testLib(t)
	require.NotNil(t, lib.Info().OneDNN)
	require.False(t, lib.Info().OneDNN.Active)
	assert.Contains(t, lib.Info().OneDNN.Detail, "ORTRAIN_WORKER_ONEDNN=off")
	m := loadTiny(t, ModelOptions{KernelCacheDir: t.TempDir()})
	k := m.DecodeKernels()
	onednn, all := k.OneDNNProducts()
	assert.Zero(t, onednn)
	assert.Positive(t, all)
	for _, g := range k.Bench.Gemm {
		assert.Less(t, g.OneDNNSeconds, 0.0, "oneDNN is reported unavailable, not timed: %+v", g)
	}
	assert.Contains(t, []string{attnFused, backendATen}, k.Attention)
	assertSamplerMatchesTraining(t, m)

	_, err := lib.LoadModel(context.Background(), ModelOptions{Dir: tinyDir(t, 1), Threads: 2, DecodeKernels: KernelsOneDNN})
	require.ErrorIs(t, err, ErrOneDNNUnavailable)
}
