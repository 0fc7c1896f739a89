package worker

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mixedPrompts have different lengths, so one batch exercises per-row
// positions in the KV cache.
func mixedPrompts() [][]int32 {
	return [][]int32{{1, 60, 61, 62, 63, 64, 65, 66, 67}, {1, 200}, {1, 100, 101, 102, 5}}
}

func TestSampleGreedyEqualsTopK1(t *testing.T) {
	m := loadTiny(t, ModelOptions{})
	ctx := context.Background()
	var greedy, topk []SampleRequest
	for i, p := range mixedPrompts() {
		greedy = append(greedy, SampleRequest{PromptIDs: p, MaxNewTokens: 12, Temperature: 0, Seed: int64(i)})
		topk = append(topk, SampleRequest{PromptIDs: p, MaxNewTokens: 12, Temperature: 1, TopK: 1, Seed: int64(100 + i)})
	}
	g, err := m.Sample(ctx, greedy)
	require.NoError(t, err)
	k, err := m.Sample(ctx, topk)
	require.NoError(t, err)
	for i := range g {
		require.Equal(t, g[i].IDs, k[i].IDs, "request %d", i)
		require.Len(t, g[i].IDs, 12)
		assert.Equal(t, StopLength, g[i].StopReason)
		for _, lp := range k[i].Logprobs {
			assert.Equal(t, float32(0), lp, "top-k 1 leaves one token: its processed log-prob is 0")
		}
	}
}

func TestSampleSeedReproduces(t *testing.T) {
	m := loadTiny(t, ModelOptions{})
	ctx := context.Background()
	req := func(seed int64) []SampleRequest {
		var out []SampleRequest
		for _, p := range mixedPrompts() {
			out = append(out, SampleRequest{PromptIDs: p, MaxNewTokens: 16, Temperature: 1, TopP: 0.95, Seed: seed})
		}
		return out
	}
	a, err := m.Sample(ctx, req(7))
	require.NoError(t, err)
	b, err := m.Sample(ctx, req(7))
	require.NoError(t, err)
	c, err := m.Sample(ctx, req(8))
	require.NoError(t, err)
	require.Equal(t, a, b)
	require.NotEqual(t, a[0].IDs, c[0].IDs)
	// A request's sample does not depend on its batch neighbours.
	solo, err := m.Sample(ctx, req(7)[1:2])
	require.NoError(t, err)
	require.Equal(t, a[1].IDs, solo[0].IDs)
}

// TestSamplerLogprobsMatchTraining: KV-cache decoding of a batch with mixed
// prompt lengths gives the same log-probs (fp32, 1e-5) as the training
// forward over the full sequences, at the same temperature. (The tiny
// model's decode steps take decode_attention, training attention()'s bmm;
// with Debian's libtorch the sampler's matmuls are oneDNN's sgemm, training's
// OpenBLAS; the biased model covers matmul_nt's bias.)
func TestSamplerLogprobsMatchTraining(t *testing.T) {
	biased, ok := model.PresetByName("tiny")
	require.True(t, ok)
	biased.Config.AttentionBias = true // q/k/v and o_proj biases
	biasedDir := filepath.Join(t.TempDir(), "tiny-biased")
	require.NoError(t, model.Init(biasedDir, biased, 3))
	for _, tc := range []struct {
		name string
		dir  string
	}{{"qwen3", ""}, {"attention_bias", biasedDir}} {
		t.Run(tc.name, func(t *testing.T) {
			m := loadTiny(t, ModelOptions{Dir: tc.dir})
			if tc.dir == biasedDir {
				randomizeBiases(t, m)
			}
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
			t.Logf("max |sampler - training| log-prob = %.3g", maxDiff)
			require.Less(t, maxDiff, 1e-5)
		})
	}
}

func TestSampleStopsAndFilters(t *testing.T) {
	m := loadTiny(t, ModelOptions{})
	ctx := context.Background()
	p := mixedPrompts()[0]
	g, err := m.Sample(ctx, []SampleRequest{{PromptIDs: p, MaxNewTokens: 8}})
	require.NoError(t, err)
	stop := g[0].IDs[2]
	s, err := m.Sample(ctx, []SampleRequest{{PromptIDs: p, MaxNewTokens: 8, StopIDs: []int32{stop}}})
	require.NoError(t, err)
	require.Equal(t, StopToken, s[0].StopReason)
	require.Equal(t, stop, s[0].IDs[len(s[0].IDs)-1])
	require.LessOrEqual(t, len(s[0].IDs), 3)
	// top-p so small that only the most likely token survives, and min-p 1-.
	for _, r := range []SampleRequest{
		{PromptIDs: p, MaxNewTokens: 8, Temperature: 1, TopP: 1e-6, Seed: 3},
		{PromptIDs: p, MaxNewTokens: 8, Temperature: 1, MinP: 0.999999, Seed: 3},
	} {
		out, err := m.Sample(ctx, []SampleRequest{r})
		require.NoError(t, err)
		require.Equal(t, g[0].IDs, out[0].IDs)
	}
}

func TestSampleCancelled(t *testing.T) {
	m := loadTiny(t, ModelOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := m.Sample(ctx, []SampleRequest{{PromptIDs: []int32{1, 2}, MaxNewTokens: 4}})
	require.ErrorIs(t, err, context.Canceled)
}

// TestSampleCancelledMidway: the C++ decoding loop polls the cancel flag.
func TestSampleCancelledMidway(t *testing.T) {
	m := loadTiny(t, ModelOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(50 * time.Millisecond)
		cancel()
	}()
	start := time.Now()
	var reqs []SampleRequest
	for range 8 {
		reqs = append(reqs, SampleRequest{PromptIDs: []int32{1, 2, 3}, MaxNewTokens: 20000, Temperature: 1})
	}
	_, err := m.Sample(ctx, reqs)
	require.ErrorIs(t, err, context.Canceled)
	// The whole run takes minutes; a loose bound still tells a per-step
	// poll from a check at the end, on a busy machine too.
	require.Less(t, time.Since(start), 30*time.Second)
}

// randomizeBiases sets m's (float32) bias vectors, which model.Init leaves
// at zero, to random values.
func randomizeBiases(t *testing.T, m *Model) {
	t.Helper()
	infos, err := m.Tensors(KindWeight)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(9, 9))
	n := 0
	for _, info := range infos {
		if !strings.HasSuffix(info.Name, ".bias") {
			continue
		}
		require.Equal(t, model.F32, info.DType, info.Name)
		data := make([]byte, 4*info.Shape[0])
		for k := range int(info.Shape[0]) {
			binary.LittleEndian.PutUint32(data[4*k:], math.Float32bits(float32(0.5*rng.NormFloat64())))
		}
		require.NoError(t, m.WriteTensor(KindWeight, model.Tensor{Name: info.Name, DType: info.DType, Shape: info.Shape, Data: data}))
		n++
	}
	require.Positive(t, n, "no biases")
}
