//go:build cgo

package worker

import (
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/stretchr/testify/require"
)

// TestBFloat16MatchesFloat32: a bf16 model computes the same log-probs as
// fp32 up to bf16 rounding, and trains and samples.
func TestBFloat16MatchesFloat32(t *testing.T) {
	ctx := context.Background()
	rows := randomRows(rand.New(rand.NewPCG(2, 2)), 3, 300)
	f32 := loadTiny(t, ModelOptions{})
	bf := loadTiny(t, ModelOptions{DType: "bfloat16"})
	require.Equal(t, model.BF16, bf.DType())
	want, _, err := f32.Logprobs(ctx, rows, 1, false)
	require.NoError(t, err)
	got, _, err := bf.Logprobs(ctx, rows, 1, false)
	require.NoError(t, err)
	maxDiff := 0.0
	for i := range want {
		for j := range want[i] {
			maxDiff = math.Max(maxDiff, math.Abs(float64(want[i][j]-got[i][j])))
		}
	}
	t.Logf("max |bf16 - fp32| log-prob = %.3g", maxDiff)
	require.Less(t, maxDiff, 0.1)
	cfg := grpo.DefaultLossConfig()
	cfg.ISCorrection = grpo.ISCorrectionOff
	_, err = bf.ForwardBackward(ctx, grpo.MicroBatch{Rows: rows, RoundTokens: 10, GradAccumSteps: 1}, cfg)
	require.NoError(t, err)
	_, err = bf.OptimizerStep(ctx, 1e-3)
	require.NoError(t, err)
	_, err = bf.Sample(ctx, []SampleRequest{{PromptIDs: []int32{1, 2, 3}, MaxNewTokens: 4, Temperature: 1}})
	require.NoError(t, err)
}

// TestShardedCheckpoint: a model split over two shards with an index loads
// to the same weights as the single file.
func TestShardedCheckpoint(t *testing.T) {
	src := tinyDir(t, 1)
	dir := copyModel(t, src)
	require.NoError(t, os.Remove(filepath.Join(dir, "model.safetensors")))
	_, tensors, err := model.ReadSafetensors(filepath.Join(src, "model.safetensors"))
	require.NoError(t, err)
	half := len(tensors) / 2
	idx := model.WeightIndex{Metadata: map[string]any{}, WeightMap: map[string]string{}}
	for i, part := range [][]model.Tensor{tensors[:half], tensors[half:]} {
		name := []string{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}[i]
		require.NoError(t, model.WriteSafetensors(filepath.Join(dir, name), part, nil))
		for _, tt := range part {
			idx.WeightMap[tt.Name] = name
		}
	}
	b, err := json.Marshal(idx)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, model.ShardedWeightsFile), b, 0o644))
	single := loadTiny(t, ModelOptions{Dir: src})
	sharded := loadTiny(t, ModelOptions{Dir: dir})
	require.Equal(t, tensorBytes(t, single, KindWeight), tensorBytes(t, sharded, KindWeight))
}

// FuzzBatchInputs feeds arbitrary rows to the worker: every input either
// works or returns an error; none crashes the process.
func FuzzBatchInputs(f *testing.F) {
	f.Add([]byte{3, 1, 2, 3, 4}, 1, uint8(1), float32(0.5))
	f.Add([]byte{0}, 0, uint8(0), float32(-1))
	f.Add([]byte{255, 255, 255, 255, 1}, 5, uint8(2), float32(1e30))
	m := loadTiny(f, ModelOptions{})
	cfg := grpo.DefaultLossConfig()
	f.Fuzz(func(t *testing.T, toks []byte, promptLen int, mask uint8, adv float32) {
		ids := make([]int32, len(toks))
		for i, b := range toks {
			ids[i] = int32(b)*3 - 100 // some ids negative, some past the vocabulary
		}
		T := len(ids) - promptLen
		var lm []uint8
		if T > 0 {
			lm = make([]uint8, T)
			for i := range lm {
				lm[i] = mask
			}
		}
		rows := []grpo.Row{{Tokens: ids, PromptLen: promptLen, LossMask: lm, Advantage: adv}}
		_, _, _ = m.Logprobs(context.Background(), rows, 1, false)
		_, _ = m.EvalLoss(context.Background(), grpo.MicroBatch{Rows: rows, RoundTokens: 3, GradAccumSteps: 1}, cfg)
		_, _ = m.Sample(context.Background(), []SampleRequest{{PromptIDs: ids, MaxNewTokens: 2, Temperature: 1}})
	})
}
