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

	"github.com/stretchr/testify/require"
)

func TestLogprobsShapesAndRange(t *testing.T) {
	m := loadTiny(t, ModelOptions{})
	rows := randomRows(rand.New(rand.NewPCG(1, 2)), 4, m.Config().VocabSize)
	lp, ent, err := m.Logprobs(context.Background(), rows, 1.0, false)
	require.NoError(t, err)
	require.Len(t, lp, len(rows))
	maxEnt := math.Log(float64(m.Config().VocabSize))
	for i, r := range rows {
		require.Len(t, lp[i], r.CompletionLen())
		for j := range lp[i] {
			require.Less(t, lp[i][j], float32(0))
			require.Greater(t, ent[i][j], float32(0))
			require.LessOrEqual(t, float64(ent[i][j]), maxEnt+1e-4)
		}
	}
}

// TestLogprobsMatchTorchReference compares the worker (fp32 and fp64) with
// scripts/torch_reference.py, an independent PyTorch-eager implementation,
// on micro checkpoints covering Qwen3 (q/k norm, tied embeddings) and Llama
// (q/k/v/o biases, untied head, llama3 rope scaling, GQA).
// Fixtures: testdata/worker/README.md.
func TestLogprobsMatchTorchReference(t *testing.T) {
	for _, arch := range []string{"micro-qwen3", "micro-llama"} {
		for _, tc := range []struct {
			dtype string
			tol   float64
		}{{"float32", 2e-5}, {"float64", 1e-6}} { // log-probs come back as float32
			t.Run(arch+"/"+tc.dtype, func(t *testing.T) {
				dir := filepath.Join("..", "..", "testdata", "worker", arch)
				var fx struct {
					Temperature float64 `json:"temperature"`
					Rows        []struct {
						Tokens    []int32 `json:"tokens"`
						PromptLen int     `json:"prompt_len"`
					} `json:"rows"`
					Logprobs [][]float64 `json:"logprobs"`
				}
				raw, err := os.ReadFile(filepath.Join(dir, "expected_logprobs.json"))
				require.NoError(t, err)
				require.NoError(t, json.Unmarshal(raw, &fx))
				m := loadTiny(t, ModelOptions{Dir: dir, DType: tc.dtype})
				var rows []grpo.Row
				for _, r := range fx.Rows {
					rows = append(rows, grpo.Row{Tokens: r.Tokens, PromptLen: r.PromptLen, LossMask: make([]uint8, len(r.Tokens)-r.PromptLen)})
				}
				lp, _, err := m.Logprobs(context.Background(), rows, fx.Temperature, false)
				require.NoError(t, err)
				maxDiff := 0.0
				for i := range rows {
					for j, want := range fx.Logprobs[i] {
						maxDiff = math.Max(maxDiff, math.Abs(float64(lp[i][j])-want))
					}
				}
				t.Logf("max |worker - torch reference| = %.3g", maxDiff)
				require.Less(t, maxDiff, tc.tol)
			})
		}
	}
}

// TestTrainingMatchesTorchReference: five AdamW steps of the worker follow
// torch.optim.AdamW on the same loss in scripts/torch_reference.py
// (train-golden): the NLL before each step agrees (float64 model).
func TestTrainingMatchesTorchReference(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "worker", "micro-qwen3")
	var fx struct {
		Tokens      []int32   `json:"tokens"`
		PromptLen   int       `json:"prompt_len"`
		LR          float64   `json:"lr"`
		WeightDecay float64   `json:"weight_decay"`
		NLL         []float64 `json:"nll"`
	}
	raw, err := os.ReadFile(filepath.Join(dir, "expected_train.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &fx))
	m := loadTiny(t, ModelOptions{Dir: dir, DType: "float64",
		Optim: AdamWOptions{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: fx.WeightDecay}})
	T := len(fx.Tokens) - fx.PromptLen
	mask := make([]uint8, T)
	for i := range mask {
		mask[i] = 1
	}
	mb := grpo.MicroBatch{Rows: []grpo.Row{{Tokens: fx.Tokens, PromptLen: fx.PromptLen, LossMask: mask, Advantage: 1}},
		RoundTokens: float64(T), GradAccumSteps: 1}
	cfg := grpo.DefaultLossConfig()
	cfg.ISCorrection = grpo.ISCorrectionOff
	ctx := context.Background()
	maxDiff := 0.0
	for step, want := range fx.NLL {
		lp, _, err := m.Logprobs(ctx, mb.Rows, 1, false)
		require.NoError(t, err)
		var nll float64
		for _, x := range lp[0] {
			nll -= float64(x)
		}
		nll /= float64(T)
		maxDiff = math.Max(maxDiff, math.Abs(nll-want))
		require.InDelta(t, want, nll, 1e-6, "NLL before step %d", step)
		_, err = m.ForwardBackward(ctx, mb, cfg)
		require.NoError(t, err)
		_, err = m.OptimizerStep(ctx, fx.LR)
		require.NoError(t, err)
	}
	t.Logf("max |NLL worker - torch| over %d steps = %.3g", len(fx.NLL), maxDiff)
}
