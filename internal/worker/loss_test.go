package worker

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type lossCase struct {
	name                string
	cfg                 grpo.LossConfig
	sampler, ref, noOld bool
}

// lossCases covers every loss type and the modifiers of §4.5.
func lossCases() []lossCase {
	mk := func(name string, typ grpo.LossType, f func(*grpo.LossConfig)) lossCase {
		c := grpo.DefaultLossConfig()
		c.Type, c.ISCorrection, c.Temperature, c.MaxCompletionLength = typ, grpo.ISCorrectionOff, 0.9, 8
		c.ISClipMax = math.Inf(1)
		lc := lossCase{name: name, cfg: c}
		if f != nil {
			f(&lc.cfg)
		}
		return lc
	}
	withSampler := func(lc lossCase) lossCase { lc.sampler = true; return lc }
	withRef := func(lc lossCase) lossCase { lc.ref = true; return lc }
	return []lossCase{
		mk("dapo", grpo.LossDAPO, nil),
		mk("grpo", grpo.LossGRPO, nil),
		mk("bnpo", grpo.LossBNPO, nil),
		mk("dr_grpo", grpo.LossDrGRPO, nil),
		mk("cispo", grpo.LossCISPO, func(c *grpo.LossConfig) { c.EpsilonHigh = 1.1 }),
		mk("sapo", grpo.LossSAPO, nil),
		mk("luspo_sequence", grpo.LossLUSPO, func(c *grpo.LossConfig) { c.ISLevel = grpo.ISLevelSequence }),
		withSampler(mk("vespo_token_mask", grpo.LossVESPO, func(c *grpo.LossConfig) {
			c.ISCorrection, c.ISClipMax = grpo.ISCorrectionTokenMask, 1.3
		})),
		mk("gspo_grpo_sequence", grpo.LossGRPO, func(c *grpo.LossConfig) { c.ISLevel = grpo.ISLevelSequence }),
		mk("dapo_delta", grpo.LossDAPO, func(c *grpo.LossConfig) { c.Delta = 1.25 }),
		withRef(withSampler(mk("dapo_beta_token_truncate", grpo.LossDAPO, func(c *grpo.LossConfig) {
			c.Beta, c.ISCorrection, c.ISClipMin, c.ISClipMax = 0.05, grpo.ISCorrectionTokenTruncate, 0.9, 1.2
		}))),
		withSampler(mk("grpo_sequence_mask", grpo.LossGRPO, func(c *grpo.LossConfig) {
			c.ISCorrection, c.ISClipMax = grpo.ISCorrectionSequenceMask, 1.5
		})),
		withSampler(mk("bnpo_sequence_truncate", grpo.LossBNPO, func(c *grpo.LossConfig) {
			c.ISCorrection, c.ISClipMax = grpo.ISCorrectionSequenceTruncate, 1.1
		})),
	}
}

// lossBatch gives rows off-policy old, sampler and reference log-probs near
// the policy's own (so ratios straddle the clip range).
func lossBatch(t *testing.T, m *Model, lc lossCase, seed uint64) (grpo.MicroBatch, [][]float64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	rows := randomRows(rng, 5, 300)
	lp, _, err := m.Logprobs(context.Background(), rows, lc.cfg.Temperature, false)
	require.NoError(t, err)
	lp64 := make([][]float64, len(rows))
	for i := range rows {
		near := func(sd float64) []float32 {
			out := make([]float32, len(lp[i]))
			for j := range out {
				out[j] = lp[i][j] + float32(sd*rng.NormFloat64())
			}
			return out
		}
		if !lc.noOld {
			rows[i].OldLogprobs = near(0.15)
		}
		if lc.sampler && i > 0 { // row 0 has no sampler log-probs: rho = 1 there
			rows[i].SamplerLogprobs = near(0.1)
		}
		if lc.ref {
			rows[i].RefLogprobs = near(0.3)
		}
		for _, x := range lp[i] {
			lp64[i] = append(lp64[i], float64(x))
		}
	}
	return grpo.MicroBatch{Rows: rows, RoundTokens: 17.5, GradAccumSteps: 2}, lp64
}

func TestLossValuesMatchReference(t *testing.T) {
	m := loadTiny(t, ModelOptions{DType: "float64"})
	for _, lc := range lossCases() {
		t.Run(lc.name, func(t *testing.T) {
			mb, lp := lossBatch(t, m, lc, 3)
			st, err := m.EvalLoss(context.Background(), mb, lc.cfg)
			require.NoError(t, err)
			want := refLoss(lc.cfg, mb, lp)
			t.Logf("loss %.9g, reference %.9g, diff %.3g", st.Loss, want, st.Loss-want)
			require.InDelta(t, want, st.Loss, 1e-6*math.Max(1, math.Abs(want)))
			require.NotZero(t, st.Loss)
		})
	}
}

// TestLossOnPolicyHandValues checks values derived by hand from §4.6: with
// no old log-probs the ratio is exactly 1, so the clip losses reduce to
// advantage sums that do not depend on the model.
func TestLossOnPolicyHandValues(t *testing.T) {
	m := loadTiny(t, ModelOptions{DType: "float64"})
	adv := []float32{1, -0.5, 2, -1.5}
	masks := [][]uint8{{1, 1, 1}, {1, 0, 1, 1}, {1}, {0, 1}} // active tokens n = 3, 3, 1, 1
	var rows []grpo.Row
	for i, mk := range masks {
		toks := make([]int32, 2+len(mk))
		for j := range toks {
			toks[j] = int32(10*i + j)
		}
		rows = append(rows, grpo.Row{Tokens: toks, PromptLen: 2, LossMask: mk, Advantage: adv[i]})
	}
	mb := grpo.MicroBatch{Rows: rows, RoundTokens: 10, GradAccumSteps: 2}
	// sum_i A_i n_i = 3 - 1.5 + 2 - 1.5 = 2; mean A = 0.25; N = 8; B = 4.
	cases := []struct {
		typ  grpo.LossType
		want float64
	}{
		{grpo.LossDAPO, -2.0 / 10},
		{grpo.LossGRPO, -0.25 / 2},
		{grpo.LossBNPO, -2.0 / 8 / 2},
		{grpo.LossDrGRPO, -2.0 / (4 * 8) / 2},
		{grpo.LossLUSPO, -2.0 / 4 / 2},
		// sapo at w = 1: -(2/kappa) A, kappa 1 for A > 0 and 1.05 for A < 0.
		{grpo.LossSAPO, -(2*1/1.0 + 2*-0.5/1.05 + 2*2/1.0 + 2*-1.5/1.05) / 4 / 2},
	}
	for _, c := range cases {
		cfg := grpo.DefaultLossConfig()
		cfg.Type, cfg.MaxCompletionLength, cfg.ISCorrection = c.typ, 8, grpo.ISCorrectionOff
		st, err := m.EvalLoss(context.Background(), mb, cfg)
		require.NoError(t, err, c.typ.String())
		assert.InDelta(t, c.want, st.Loss, 1e-12, c.typ.String())
		assert.Equal(t, 8.0, st.ActiveTokens)
		assert.Equal(t, 4.0, st.Rows)
	}
}

// TestLossClipMetrics sets old log-probs so each row's ratio is known:
// row 0 w = 1.5 (A > 0: high-clipped), row 1 w = 0.5 (A < 0: low-clipped),
// row 2 w = 1.1 (inside), row 3 w = 0.5 with A > 0 (not clipped).
func TestLossClipMetrics(t *testing.T) {
	m := loadTiny(t, ModelOptions{DType: "float64"})
	rows := []grpo.Row{
		{Tokens: []int32{1, 2, 3, 4}, PromptLen: 1, LossMask: []uint8{1, 1, 1}, Advantage: 1},
		{Tokens: []int32{5, 6, 7}, PromptLen: 1, LossMask: []uint8{1, 1}, Advantage: -1},
		{Tokens: []int32{8, 9}, PromptLen: 1, LossMask: []uint8{1}, Advantage: 1},
		{Tokens: []int32{8, 9, 10}, PromptLen: 1, LossMask: []uint8{1, 0}, Advantage: 1},
	}
	lp, _, err := m.Logprobs(context.Background(), rows, 1, false)
	require.NoError(t, err)
	for i, w := range []float64{1.5, 0.5, 1.1, 0.5} {
		for _, x := range lp[i] {
			rows[i].OldLogprobs = append(rows[i].OldLogprobs, x-float32(math.Log(w)))
		}
	}
	cfg := grpo.DefaultLossConfig()
	cfg.ISCorrection = grpo.ISCorrectionOff
	st, err := m.EvalLoss(context.Background(), grpo.MicroBatch{Rows: rows, RoundTokens: 7, GradAccumSteps: 1}, cfg)
	require.NoError(t, err)
	assert.Equal(t, 3.0, st.ClipHigh)
	assert.Equal(t, 2.0, st.ClipLow)
	assert.Equal(t, 5.0, st.ClipRegion)
	assert.Equal(t, 7.0, st.ClipDenom)
	assert.Equal(t, 0.0, st.ClipLowMin)
	assert.Equal(t, 1.0, st.ClipHighMax)
}

func f64s(b []byte) []float64 {
	out := make([]float64, len(b)/8)
	for i := range out {
		out[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return out
}

func f64bytes(v []float64) []byte {
	out := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(out[8*i:], math.Float64bits(x))
	}
	return out
}

// gradCheck compares the worker's gradient of the loss with central finite
// differences at a few coordinates of each tensor in names.
func gradCheck(t *testing.T, m *Model, kind TensorKind, mb grpo.MicroBatch, cfg grpo.LossConfig, pick func(TensorInfo) bool) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, m.ZeroGrad(ctx))
	_, err := m.ForwardBackward(ctx, mb, cfg)
	require.NoError(t, err)
	infos, err := m.Tensors(kind)
	require.NoError(t, err)
	grads, err := m.Tensors(KindGrad)
	require.NoError(t, err)
	gradOf := map[string]TensorInfo{}
	for _, g := range grads {
		gradOf[g.Name] = g
	}
	rng := rand.New(rand.NewPCG(11, 13))
	const h = 1e-6
	checked, maxErr := 0, 0.0
	for _, info := range infos {
		if !pick(info) {
			continue
		}
		gb, err := m.ReadTensor(KindGrad, gradOf[info.Name])
		require.NoError(t, err)
		g := f64s(gb)
		wb, err := m.ReadTensor(kind, info)
		require.NoError(t, err)
		w := f64s(wb)
		for range 2 {
			k := rng.IntN(len(w))
			eval := func(x float64) float64 {
				p := append([]float64(nil), w...)
				p[k] = x
				require.NoError(t, m.WriteTensor(kind, model.Tensor{Name: info.Name, DType: model.F64, Shape: info.Shape, Data: f64bytes(p)}))
				st, err := m.EvalLoss(ctx, mb, cfg)
				require.NoError(t, err)
				return st.Loss
			}
			fd := (eval(w[k]+h) - eval(w[k]-h)) / (2 * h)
			require.NoError(t, m.WriteTensor(kind, model.Tensor{Name: info.Name, DType: model.F64, Shape: info.Shape, Data: wb}))
			e := math.Abs(fd - g[k])
			maxErr = math.Max(maxErr, e)
			require.LessOrEqual(t, e, 1e-7+1e-5*math.Abs(g[k]), "%s[%d]: finite difference %.10g, gradient %.10g", info.Name, k, fd, g[k])
			checked++
		}
	}
	require.Greater(t, checked, 0)
	t.Logf("%d coordinates, max |fd - grad| = %.3g", checked, maxErr)
}

// TestGradientFiniteDifference checks the whole tiny model's gradient in
// float64 for every loss case (and the entropy bonus).
func TestGradientFiniteDifference(t *testing.T) {
	m := loadTiny(t, ModelOptions{DType: "float64"})
	var cases []lossCase
	for _, lc := range lossCases() {
		switch lc.cfg.Type {
		case grpo.LossVESPO: // phi is detached: see TestVESPOGradientIsWeightedPolicyGradient
			continue
		case grpo.LossCISPO: // a cap below every ratio makes the detached weight constant, so FD applies
			lc.cfg.EpsilonHigh = 0.5
		}
		cases = append(cases, lc)
	}
	ent := cases[0]
	ent.name, ent.cfg.EntropyCoef = "dapo_entropy_bonus", 0.3
	cases = append(cases, ent)
	pick := func(i TensorInfo) bool {
		switch i.Name {
		case "model.embed_tokens.weight", "model.norm.weight", "model.layers.0.self_attn.q_proj.weight",
			"model.layers.1.self_attn.k_norm.weight", "model.layers.0.mlp.down_proj.weight", "model.layers.1.self_attn.v_proj.weight":
			return true
		}
		return false
	}
	for _, lc := range cases {
		t.Run(lc.name, func(t *testing.T) {
			mb, _ := lossBatch(t, m, lc, 5)
			gradCheck(t, m, KindWeight, mb, lc.cfg, pick)
		})
	}
}

// TestVESPOGradientIsWeightedPolicyGradient: vespo's gradient is
// -sg(phi_i) A_i grad log pi (§4.4), so it must equal the gradient of cispo
// with a constant cap c (every ratio above it) and advantages phi_i A_i / c.
func TestVESPOGradientIsWeightedPolicyGradient(t *testing.T) {
	m := loadTiny(t, ModelOptions{DType: "float64"})
	ctx := context.Background()
	lc := lossCases()[7]
	require.Equal(t, grpo.LossVESPO, lc.cfg.Type)
	mb, lp := lossBatch(t, m, lc, 9)
	gradsOf := func(mb grpo.MicroBatch, cfg grpo.LossConfig) map[string][]float64 {
		require.NoError(t, m.ZeroGrad(ctx))
		_, err := m.ForwardBackward(ctx, mb, cfg)
		require.NoError(t, err)
		infos, err := m.Tensors(KindGrad)
		require.NoError(t, err)
		out := map[string][]float64{}
		for _, info := range infos[:6] {
			b, err := m.ReadTensor(KindGrad, info)
			require.NoError(t, err)
			out[info.Name] = f64s(b)
		}
		return out
	}
	want := gradsOf(mb, lc.cfg)
	const c = 0.5
	cispo := lc.cfg
	cispo.Type, cispo.EpsilonHigh, cispo.ISCorrection = grpo.LossCISPO, c, grpo.ISCorrectionOff
	rows := append([]grpo.Row(nil), mb.Rows...)
	for i, r := range rows {
		old, mask := make([]float64, len(lp[i])), make([]float64, len(lp[i]))
		lr := make([]float64, len(lp[i]))
		for j := range lp[i] {
			old[j], mask[j] = float64(r.OldLogprobs[j]), float64(r.LossMask[j])
			lr[j] = lp[i][j] - old[j]
		}
		phi := refPhi(lc.cfg, lr, mask, refRho(lc.cfg, r, old, mask), float64(r.Advantage))
		rows[i].Advantage = float32(phi * float64(r.Advantage) / c)
		rows[i].SamplerLogprobs = nil
	}
	got := gradsOf(grpo.MicroBatch{Rows: rows, RoundTokens: mb.RoundTokens, GradAccumSteps: mb.GradAccumSteps}, cispo)
	maxErr := 0.0
	for name, g := range want {
		for k := range g {
			e := math.Abs(g[k] - got[name][k])
			maxErr = math.Max(maxErr, e)
			require.LessOrEqual(t, e, 1e-8+1e-4*math.Abs(g[k]), "%s[%d]", name, k) // phi comes from float32 log-probs
		}
	}
	t.Logf("max |vespo grad - weighted cispo grad| = %.3g", maxErr)
}

// TestLoRAGradientFiniteDifference checks adapter gradients (A and B, with
// B made nonzero) in float64.
func TestLoRAGradientFiniteDifference(t *testing.T) {
	m := loadTiny(t, ModelOptions{DType: "float64", LoRA: &LoRAOptions{Rank: 2, Alpha: 4, TargetModules: []string{"q_proj", "v_proj", "down_proj"}}})
	infos, err := m.Tensors(KindLoRA)
	require.NoError(t, err)
	require.Len(t, infos, 2*3*2)
	rng := rand.New(rand.NewPCG(1, 1))
	for _, info := range infos {
		b, err := m.ReadTensor(KindLoRA, info)
		require.NoError(t, err)
		v := f64s(b)
		for k := range v {
			v[k] += 0.3 * rng.NormFloat64()
		}
		require.NoError(t, m.WriteTensor(KindLoRA, model.Tensor{Name: info.Name, DType: info.DType, Shape: info.Shape, Data: f64bytes(v)}))
	}
	lc := lossCases()[0]
	mb, _ := lossBatch(t, m, lc, 5)
	gradCheck(t, m, KindLoRA, mb, lc.cfg, func(TensorInfo) bool { return true })
}

// TestMaskedRowsContributeNothing: a truncated completion (loss mask all 0
// under mask_truncated_completions) or tool tokens (mask 0) change neither
// the loss nor the gradient, whatever their advantage or length.
func TestMaskedRowsContributeNothing(t *testing.T) {
	m := loadTiny(t, ModelOptions{DType: "float64"})
	ctx := context.Background()
	rows := randomRows(rand.New(rand.NewPCG(4, 4)), 3, 300)
	truncated := grpo.Row{Tokens: []int32{5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, PromptLen: 2,
		LossMask: make([]uint8, 10), Advantage: 3}
	for _, lc := range lossCases() {
		run := func(rows []grpo.Row) (LossStats, map[string][]byte) {
			require.NoError(t, m.ZeroGrad(ctx))
			cfg := lc.cfg
			cfg.ISCorrection, cfg.Beta = grpo.ISCorrectionOff, 0 // rows carry no sampler or reference log-probs
			st, err := m.ForwardBackward(ctx, grpo.MicroBatch{Rows: rows, RoundTokens: 9, GradAccumSteps: 1}, cfg)
			require.NoError(t, err)
			return st, tensorBytes(t, m, KindGrad)
		}
		if lc.cfg.Type == grpo.LossGRPO || lc.cfg.Type == grpo.LossSAPO || lc.cfg.Type == grpo.LossLUSPO || lc.cfg.Type == grpo.LossDrGRPO {
			continue // these divide by the row count B, so an extra row rescales by design (§4.6)
		}
		a, ga := run(rows)
		b, gb := run(append(append([]grpo.Row{}, rows...), truncated))
		require.InDelta(t, a.Loss, b.Loss, 1e-12, lc.name)
		require.Equal(t, a.ActiveTokens, b.ActiveTokens, lc.name)
		for name, g := range ga {
			x, y := f64s(g), f64s(gb[name])
			for k := range x {
				require.InDelta(t, x[k], y[k], 1e-12, "%s %s[%d]", lc.name, name, k)
			}
		}
	}
}
