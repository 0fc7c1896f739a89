package worker

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// nllBatch is a fixed sequence whose on-policy dapo loss with advantage 1
// has the gradient of its mean negative log-likelihood.
func nllBatch() grpo.MicroBatch {
	toks := []int32{1, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 2}
	mask := make([]uint8, len(toks)-3)
	for i := range mask {
		mask[i] = 1
	}
	return grpo.MicroBatch{Rows: []grpo.Row{{Tokens: toks, PromptLen: 3, LossMask: mask, Advantage: 1}},
		RoundTokens: float64(len(mask)), GradAccumSteps: 1}
}

func meanNLL(t *testing.T, m *Model, mb grpo.MicroBatch) float64 {
	lp, _, err := m.Logprobs(context.Background(), mb.Rows, 1, false)
	require.NoError(t, err)
	var s float64
	for _, x := range lp[0] {
		s -= float64(x)
	}
	return s / float64(len(lp[0]))
}

func TestAdamWDrivesNLLDown(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts ModelOptions
		lr   float64
		drop float64 // required NLL decrease
	}{
		{"full", ModelOptions{}, 1e-2, 2.9},
		// LoRA cannot touch the embeddings or norms; with the tiny preset's
		// 0.02-scale tied embeddings the reachable logit range caps the NLL
		// near 4.5, so it must drop by 1 nat rather than by half.
		{"lora", ModelOptions{LoRA: &LoRAOptions{Rank: 8, Alpha: 16}}, 1e-2, 1.0},
		{"full_checkpointing", ModelOptions{GradientCheckpointing: true}, 1e-2, 2.9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := loadTiny(t, tc.opts)
			ctx := context.Background()
			mb := nllBatch()
			cfg := grpo.DefaultLossConfig()
			cfg.ISCorrection = grpo.ISCorrectionOff
			before := meanNLL(t, m, mb)
			sched := LRSchedule{Kind: "cosine", Peak: tc.lr, WarmupSteps: 3, TotalSteps: 30}
			require.NoError(t, sched.Validate())
			for step := range 30 {
				st, err := m.ForwardBackward(ctx, mb, cfg)
				require.NoError(t, err)
				require.InDelta(t, -1.0, st.Loss, 1e-6, "on-policy dapo value is -sum(A n)/N; its gradient is the mean NLL's")
				ss, err := m.OptimizerStep(ctx, sched.At(step))
				require.NoError(t, err)
				require.Greater(t, ss.GradNorm, 0.0)
			}
			after := meanNLL(t, m, mb)
			t.Logf("mean NLL %.4f -> %.4f after 30 steps", before, after)
			require.Less(t, after, before-tc.drop)
		})
	}
}

// TestAdamWUpdateMatchesFormula checks one step against PyTorch's AdamW: at
// step 1 the bias-corrected update is lr * g / (|g| + eps), after the decoupled
// weight decay p *= 1 - lr*wd; and the reported norm is the global L2 norm.
func TestAdamWUpdateMatchesFormula(t *testing.T) {
	const lr, wd, eps = 1e-3, 0.1, 1e-8
	m := loadTiny(t, ModelOptions{DType: "float64", Optim: AdamWOptions{Beta1: 0.9, Beta2: 0.999, Eps: eps, WeightDecay: wd}})
	ctx := context.Background()
	cfg := grpo.DefaultLossConfig()
	cfg.ISCorrection = grpo.ISCorrectionOff
	_, err := m.ForwardBackward(ctx, nllBatch(), cfg)
	require.NoError(t, err)
	grads, err := m.Tensors(KindGrad)
	require.NoError(t, err)
	weights, err := m.Tensors(KindWeight)
	require.NoError(t, err)
	before := map[string][]float64{}
	var sq float64
	for i, g := range grads {
		b, err := m.ReadTensor(KindGrad, g)
		require.NoError(t, err)
		for _, x := range f64s(b) {
			sq += x * x
		}
		before[g.Name] = f64s(b)
		wb, err := m.ReadTensor(KindWeight, weights[i])
		require.NoError(t, err)
		before[g.Name+"/w"] = f64s(wb)
	}
	st, err := m.OptimizerStep(ctx, lr)
	require.NoError(t, err)
	assert.InDelta(t, math.Sqrt(sq), st.GradNorm, 1e-9)
	for i, w := range weights {
		b, err := m.ReadTensor(KindWeight, w)
		require.NoError(t, err)
		after := f64s(b)
		g, p0 := before[grads[i].Name], before[grads[i].Name+"/w"]
		for k := range after {
			want := p0[k]*(1-lr*wd) - lr*g[k]/(math.Abs(g[k])+eps)
			require.InDelta(t, want, after[k], 1e-12, "%s[%d]", w.Name, k)
		}
	}
}

// TestGradientAccumulationAndCheckpointing: dapo gradients of two
// micro-batches accumulate to those of their union, and activation
// recomputation gives the same gradients as keeping activations.
func TestGradientAccumulationAndCheckpointing(t *testing.T) {
	ctx := context.Background()
	rows := randomRows(rand.New(rand.NewPCG(3, 4)), 6, 300)
	for i := range rows {
		rows[i].OldLogprobs = make([]float32, rows[i].CompletionLen())
		for j := range rows[i].OldLogprobs {
			rows[i].OldLogprobs[j] = -5.5 + 0.1*float32(j)
		}
	}
	cfg := grpo.DefaultLossConfig()
	cfg.ISCorrection = grpo.ISCorrectionOff
	grads := func(m *Model, mbs ...grpo.MicroBatch) [][]float64 {
		require.NoError(t, m.ZeroGrad(ctx))
		for _, mb := range mbs {
			_, err := m.ForwardBackward(ctx, mb, cfg)
			require.NoError(t, err)
		}
		infos, err := m.Tensors(KindGrad)
		require.NoError(t, err)
		var out [][]float64
		for _, info := range infos {
			b, err := m.ReadTensor(KindGrad, info)
			require.NoError(t, err)
			out = append(out, f64s(b))
		}
		return out
	}
	m := loadTiny(t, ModelOptions{DType: "float64"})
	mc := loadTiny(t, ModelOptions{DType: "float64", GradientCheckpointing: true})
	whole := grpo.MicroBatch{Rows: rows, RoundTokens: 20, GradAccumSteps: 2}
	a := grpo.MicroBatch{Rows: rows[:3], RoundTokens: 20, GradAccumSteps: 2}
	b := grpo.MicroBatch{Rows: rows[3:], RoundTokens: 20, GradAccumSteps: 2}
	want := grads(m, whole)
	for name, got := range map[string][][]float64{"accumulated": grads(m, a, b), "checkpointed": grads(mc, whole)} {
		for i := range want {
			for k := range want[i] {
				require.InDelta(t, want[i][k], got[i][k], 1e-12, "%s tensor %d[%d]", name, i, k)
			}
		}
	}
}

func TestLRSchedule(t *testing.T) {
	cases := []struct {
		s    LRSchedule
		step int
		want float64
	}{
		{LRSchedule{Kind: "constant", Peak: 1}, 5, 1},
		{LRSchedule{Kind: "constant", Peak: 1, WarmupSteps: 4}, 1, 0.25},
		{LRSchedule{Kind: "linear", Peak: 2, WarmupSteps: 2, TotalSteps: 12}, 7, 1},
		{LRSchedule{Kind: "linear", Peak: 2, TotalSteps: 10}, 12, 0},
		{LRSchedule{Kind: "cosine", Peak: 1, WarmupSteps: 0, TotalSteps: 10}, 5, 0.5},
		{LRSchedule{Kind: "cosine", Peak: 1, WarmupSteps: 2, TotalSteps: 12}, 2, 1},
		{LRSchedule{Kind: "cosine", Peak: 1, TotalSteps: 10}, 10, 0},
	}
	for _, c := range cases {
		require.NoError(t, c.s.Validate())
		assert.InDelta(t, c.want, c.s.At(c.step), 1e-12, "%+v at %d", c.s, c.step)
	}
	assert.ErrorContains(t, LRSchedule{Kind: "step", Peak: 1}.Validate(), "lr_scheduler_type")
	assert.ErrorContains(t, LRSchedule{Kind: "cosine", Peak: 1}.Validate(), "max_steps")
}

// TestLoRADropoutReplayUnderCheckpointing: with LoRA dropout, activation
// recomputation replays the same dropout masks, so gradients equal those of
// a model that keeps its activations (same seed, same draws).
func TestLoRADropoutReplayUnderCheckpointing(t *testing.T) {
	ctx := context.Background()
	lora := &LoRAOptions{Rank: 4, Alpha: 8, Dropout: 0.3}
	plain := loadTiny(t, ModelOptions{DType: "float64", Seed: 5, LoRA: lora})
	ckpt := loadTiny(t, ModelOptions{DType: "float64", Seed: 5, LoRA: lora, GradientCheckpointing: true})
	mb := nllBatch()
	cfg := grpo.DefaultLossConfig()
	cfg.ISCorrection = grpo.ISCorrectionOff
	noDropout := loadTiny(t, ModelOptions{DType: "float64", Seed: 5, LoRA: &LoRAOptions{Rank: 4, Alpha: 8}})
	var grads [3]map[string][]byte
	for i, m := range []*Model{plain, ckpt, noDropout} {
		// B = 0 at init would hide A's gradient: take one step first.
		_, err := m.ForwardBackward(ctx, mb, cfg)
		require.NoError(t, err)
		_, err = m.OptimizerStep(ctx, 1e-2)
		require.NoError(t, err)
		_, err = m.ForwardBackward(ctx, mb, cfg)
		require.NoError(t, err)
		grads[i] = tensorBytes(t, m, KindGrad)
	}
	require.Equal(t, grads[0], grads[1])
	require.NotEqual(t, grads[0], grads[2], "dropout must change the gradients")
}

// TestLogprobChunkingIsExact: splitting the vocab projection into chunks of
// 3 token rows gives the same log-probs, entropies and gradients.
func TestLogprobChunkingIsExact(t *testing.T) {
	ctx := context.Background()
	whole := loadTiny(t, ModelOptions{DType: "float64"})
	chunked := loadTiny(t, ModelOptions{DType: "float64", LogprobChunkRows: 3})
	mb, _ := lossBatch(t, whole, lossCases()[0], 21)
	cfg := lossCases()[0].cfg
	cfg.EntropyCoef = 0.1 // entropy gradient through the chunks too
	var lps, ents [2][][]float32
	var grads [2]map[string][]byte
	for i, m := range []*Model{whole, chunked} {
		var err error
		lps[i], ents[i], err = m.Logprobs(ctx, mb.Rows, 0.9, false)
		require.NoError(t, err)
		_, err = m.ForwardBackward(ctx, mb, cfg)
		require.NoError(t, err)
		grads[i] = tensorBytes(t, m, KindGrad)
	}
	require.Equal(t, lps[0], lps[1])
	require.Equal(t, ents[0], ents[1])
	for name, g := range grads[0] {
		a, b := f64s(g), f64s(grads[1][name])
		for k := range a {
			require.InDelta(t, a[k], b[k], 1e-13, "%s[%d]", name, k)
		}
	}
}
