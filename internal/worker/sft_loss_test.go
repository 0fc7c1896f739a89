package worker

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The sft reference runs on a tiny model whose attention and MLP outputs are
// zeroed (o_proj, down_proj = 0): every layer then passes the residual
// through, so the hidden state predicting a token is the final RMSNorm of
// the previous token's embedding, and the logits, the cross-entropy and its
// gradient w.r.t. the (tied) embedding and the final norm have closed forms
// that sftRef evaluates in float64, independently of the worker.
type sftRef struct {
	W   [][]float64 // model.embed_tokens.weight = the tied LM head, [V][H]
	g   []float64   // model.norm.weight
	eps float64
}

// sftStep is the reference's value of one optimizer step.
type sftStep struct {
	loss            float64 // sum over active tokens of -log p(label), / RoundTokens
	active, correct float64 // active tokens; those whose argmax is the label
	minMargin       float64 // smallest top-1 minus top-2 logit gap (argmax robustness)
	gradW           [][]float64
	gradG           []float64
}

// step evaluates the sft loss of rows (every micro-batch of the step) at
// temperature temp, normalised by roundTokens, and its gradient.
func (r sftRef) step(rows []grpo.Row, temp, roundTokens float64) sftStep {
	V, H := len(r.W), len(r.g)
	out := sftStep{minMargin: math.Inf(1), gradW: make([][]float64, V), gradG: make([]float64, H)}
	for v := range out.gradW {
		out.gradW[v] = make([]float64, H)
	}
	z, dz := make([]float64, V), make([]float64, V)
	for _, row := range rows {
		for j, m := range row.LossMask {
			if m == 0 {
				continue
			}
			u, y := row.Tokens[row.PromptLen+j-1], row.Tokens[row.PromptLen+j]
			x := r.W[u]
			var ms float64
			for _, a := range x {
				ms += a * a
			}
			rs := 1 / math.Sqrt(ms/float64(H)+r.eps)
			xhat, hn := make([]float64, H), make([]float64, H)
			for k := range x {
				xhat[k] = x[k] * rs
				hn[k] = r.g[k] * xhat[k]
			}
			zmax, arg := math.Inf(-1), -1
			for v := range z {
				var d float64
				for k := range hn {
					d += hn[k] * r.W[v][k]
				}
				z[v] = d / temp
				if z[v] > zmax {
					zmax, arg = z[v], v
				}
			}
			se, second := 0.0, math.Inf(-1)
			for v := range z {
				se += math.Exp(z[v] - zmax)
				if v != arg {
					second = math.Max(second, z[v])
				}
			}
			lse := zmax + math.Log(se)
			out.loss += (lse - z[y]) / roundTokens
			out.active++
			if arg == int(y) {
				out.correct++
			}
			out.minMargin = math.Min(out.minMargin, zmax-second)
			// d loss / d z = (softmax - onehot) / RoundTokens; z = hn . W[v] / temp.
			dhn := make([]float64, H)
			for v := range z {
				dz[v] = math.Exp(z[v]-lse) / roundTokens
				if v == int(y) {
					dz[v] -= 1 / roundTokens
				}
				for k := range hn {
					out.gradW[v][k] += dz[v] / temp * hn[k] // LM head path
					dhn[k] += dz[v] / temp * r.W[v][k]
				}
			}
			// Final RMSNorm backward into its weight and the input embedding.
			var dot float64
			dxhat := make([]float64, H)
			for k := range hn {
				out.gradG[k] += dhn[k] * xhat[k]
				dxhat[k] = dhn[k] * r.g[k]
				dot += dxhat[k] * xhat[k]
			}
			for k := range x {
				out.gradW[u][k] += rs * (dxhat[k] - xhat[k]*dot/float64(H))
			}
		}
	}
	return out
}

// readF64 reads a tensor of any float dtype as float64.
func readF64(t *testing.T, m *Model, kind TensorKind, info TensorInfo) []float64 {
	t.Helper()
	b, err := m.ReadTensor(kind, info)
	require.NoError(t, err)
	switch info.DType {
	case model.F64:
		return f64s(b)
	case model.F32:
		out := make([]float64, len(b)/4)
		for i, x := range model.DecodeF32(b) {
			out[i] = float64(x)
		}
		return out
	}
	t.Fatalf("%s: dtype %s", info.Name, info.DType)
	return nil
}

// sftModel loads the tiny model in dtype with its blocks zeroed as sftRef
// assumes, a larger random embedding (so the argmax is a clear winner: the
// input token itself) and a non-trivial final norm, and returns the
// reference built from the weights as stored.
func sftModel(t *testing.T, dtype string, path LogprobPath) (*Model, sftRef) {
	t.Helper()
	m := loadTiny(t, ModelOptions{DType: dtype, LogprobPath: path})
	infos, err := m.Tensors(KindWeight)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(21, 5))
	byName := map[string]TensorInfo{}
	for _, info := range infos {
		byName[info.Name] = info
		n := 1
		for _, d := range info.Shape {
			n *= int(d)
		}
		v := make([]float64, n)
		switch {
		case strings.HasSuffix(info.Name, "o_proj.weight"), strings.HasSuffix(info.Name, "down_proj.weight"):
			// zeros: the block adds nothing to the residual stream
		case info.Name == "model.embed_tokens.weight":
			for k := range v {
				v[k] = 0.3 * rng.NormFloat64()
			}
		case info.Name == "model.norm.weight":
			for k := range v {
				v[k] = 1 + 0.2*rng.NormFloat64()
			}
		default:
			continue
		}
		require.NoError(t, m.WriteTensor(KindWeight, model.Tensor{Name: info.Name, DType: model.F64, Shape: info.Shape, Data: f64bytes(v)}))
	}
	emb, norm := byName["model.embed_tokens.weight"], byName["model.norm.weight"]
	require.NotEmpty(t, emb.Name, "tied embedding")
	_, untied := byName["lm_head.weight"]
	require.False(t, untied, "the reference assumes tied embeddings")
	flat := readF64(t, m, KindWeight, emb)
	V, H := int(emb.Shape[0]), int(emb.Shape[1])
	ref := sftRef{W: make([][]float64, V), g: readF64(t, m, KindWeight, norm), eps: 1e-6}
	for v := range V {
		ref.W[v] = flat[v*H : (v+1)*H]
	}
	return m, ref
}

// sftRows are multi-turn rows of different lengths: assistant tokens, tool
// tokens masked out, assistant tokens again. A token repeats the previous
// one often, so some labels are the argmax and CorrectTokens is neither 0
// nor all.
func sftRows(vocab int) []grpo.Row {
	rng := rand.New(rand.NewPCG(8, 9))
	segs := [][]int{{4, -3, 3}, {2}, {3, -2, 2, -1, 2}, {5}, {1, -4, 3}} // > 0 assistant, < 0 tool
	prompts := []int{3, 2, 4, 1, 2}
	rows := make([]grpo.Row, len(segs))
	for i, ss := range segs {
		var mask []uint8
		for _, s := range ss {
			bit := uint8(0)
			if s > 0 {
				bit = 1
			}
			for range max(s, -s) {
				mask = append(mask, bit)
			}
		}
		toks := []int32{int32(rng.IntN(vocab))}
		for len(toks) < prompts[i]+len(mask) {
			next := int32(rng.IntN(vocab))
			if rng.Float64() < 0.4 {
				next = toks[len(toks)-1]
			}
			toks = append(toks, next)
		}
		rows[i] = grpo.Row{Tokens: toks, PromptLen: prompts[i], LossMask: mask, Advantage: float32(rng.NormFloat64())}
	}
	return rows
}

func activeTokens(rows []grpo.Row) float64 {
	var n float64
	for _, r := range rows {
		for _, m := range r.LossMask {
			n += float64(m)
		}
	}
	return n
}

func sftConfig(temp float64) grpo.LossConfig {
	c := grpo.DefaultLossConfig()
	c.Type, c.Temperature, c.ISCorrection = grpo.LossSFT, temp, grpo.ISCorrectionOff
	return c
}

// TestSFTLossMatchesReference checks the sft loss, its gradient and
// CorrectTokens against sftRef, for one micro-batch and for the same rows
// split into two accumulated micro-batches (RoundTokens = the step's active
// tokens, so both are the token mean over the step), on the fused and the
// recompute paths, in float64 and float32.
func TestSFTLossMatchesReference(t *testing.T) {
	cases := []struct {
		dtype      string
		path       LogprobPath
		temp       float64
		split      []int // rows per micro-batch
		rtol, gtol float64
	}{
		{"float64", LogprobAuto, 1, []int{5}, 1e-10, 1e-9},
		{"float64", LogprobAuto, 1, []int{2, 3}, 1e-10, 1e-9},
		{"float64", LogprobRecompute, 0.7, []int{2, 3}, 1e-10, 1e-9},
		{"float32", LogprobAuto, 1, []int{5}, 1e-5, 1e-4},
		{"float32", LogprobRecompute, 1, []int{3, 2}, 1e-5, 1e-4},
	}
	ctx := context.Background()
	for _, tc := range cases {
		name := fmt.Sprintf("%s_path%d_temp%g_mb%d", tc.dtype, tc.path, tc.temp, len(tc.split))
		t.Run(name, func(t *testing.T) {
			m, ref := sftModel(t, tc.dtype, tc.path)
			rows := sftRows(len(ref.W))
			N := activeTokens(rows)
			want := ref.step(rows, tc.temp, N)
			require.Greater(t, want.minMargin, 1e-3, "argmax must be unambiguous for an exact count")
			require.Greater(t, want.correct, 0.0)
			require.Less(t, want.correct, want.active)
			cfg := sftConfig(tc.temp)
			require.NoError(t, m.ZeroGrad(ctx))
			var loss, correct, active, evalLoss, evalCorrect float64
			off := 0
			for _, n := range tc.split {
				mb := grpo.MicroBatch{Rows: rows[off : off+n], RoundTokens: N, GradAccumSteps: len(tc.split)}
				off += n
				ev, err := m.EvalLoss(ctx, mb, cfg)
				require.NoError(t, err)
				st, err := m.ForwardBackward(ctx, mb, cfg)
				require.NoError(t, err)
				loss, correct, active = loss+st.Loss, correct+st.CorrectTokens, active+st.ActiveTokens
				evalLoss, evalCorrect = evalLoss+ev.Loss, evalCorrect+ev.CorrectTokens
				assert.Zero(t, st.ClipDenom+st.KLSum+st.CISPOClip, "no clip or KL metrics")
			}
			t.Logf("loss %.9g, reference %.9g; correct %v of %v", loss, want.loss, correct, active)
			assert.InDelta(t, want.loss, loss, tc.rtol*want.loss)
			assert.InDelta(t, want.loss, evalLoss, tc.rtol*want.loss)
			assert.Equal(t, want.active, active)
			assert.Equal(t, want.correct, correct, "ForwardBackward CorrectTokens")
			assert.Equal(t, want.correct, evalCorrect, "EvalLoss CorrectTokens")

			grads, err := m.Tensors(KindGrad)
			require.NoError(t, err)
			got := map[string][]float64{}
			for _, g := range grads {
				got[g.Name] = readF64(t, m, KindGrad, g)
			}
			var flatW []float64
			for _, w := range want.gradW {
				flatW = append(flatW, w...)
			}
			for name, w := range map[string][]float64{"model.embed_tokens.weight": flatW, "model.norm.weight": want.gradG} {
				g := got[name]
				require.Len(t, g, len(w), name)
				scale, maxErr := 0.0, 0.0
				for _, x := range w {
					scale = math.Max(scale, math.Abs(x))
				}
				require.Greater(t, scale, 0.0, name)
				for k := range w {
					maxErr = math.Max(maxErr, math.Abs(g[k]-w[k]))
				}
				t.Logf("%s: max |grad - reference| = %.3g (max |reference| %.3g)", name, maxErr, scale)
				require.LessOrEqual(t, maxErr, tc.gtol*scale, name)
			}
		})
	}
}

// TestCorrectTokensEveryLossType: CorrectTokens does not depend on the loss
// type or the log-prob path (argmax is taken in the shared chunked pass).
func TestCorrectTokensEveryLossType(t *testing.T) {
	m, ref := sftModel(t, "float64", LogprobAuto)
	rows := sftRows(len(ref.W))
	want := ref.step(rows, 0.9, 1)
	require.Greater(t, want.minMargin, 1e-3)
	ctx := context.Background()
	for _, lc := range lossCases() {
		cfg := lc.cfg
		cfg.ISCorrection, cfg.Beta = grpo.ISCorrectionOff, 0 // the rows carry no sampler or reference log-probs
		mb := grpo.MicroBatch{Rows: rows, RoundTokens: 9, GradAccumSteps: 1}
		ev, err := m.EvalLoss(ctx, mb, cfg)
		require.NoError(t, err, lc.name)
		st, err := m.ForwardBackward(ctx, mb, cfg)
		require.NoError(t, err, lc.name)
		assert.Equal(t, want.correct, ev.CorrectTokens, "%s EvalLoss", lc.name)
		assert.Equal(t, want.correct, st.CorrectTokens, "%s ForwardBackward", lc.name)
	}
}

// TestSFTIgnoresAdvantagesAndRatios: advantages, old and sampler log-probs
// (with an importance-sampling correction configured) and the importance
// sampling level change neither the sft loss nor its gradient.
func TestSFTIgnoresAdvantagesAndRatios(t *testing.T) {
	m := loadTiny(t, ModelOptions{DType: "float64"})
	ctx := context.Background()
	rows := sftRows(300)
	run := func(rows []grpo.Row, cfg grpo.LossConfig) (LossStats, map[string][]byte) {
		require.NoError(t, m.ZeroGrad(ctx))
		st, err := m.ForwardBackward(ctx, grpo.MicroBatch{Rows: rows, RoundTokens: 13, GradAccumSteps: 2}, cfg)
		require.NoError(t, err)
		return st, tensorBytes(t, m, KindGrad)
	}
	base, gBase := run(rows, sftConfig(1))
	rng := rand.New(rand.NewPCG(3, 3))
	other := make([]grpo.Row, len(rows))
	for i, r := range rows {
		r.Advantage = float32(5 * rng.NormFloat64())
		r.OldLogprobs, r.SamplerLogprobs = make([]float32, len(r.LossMask)), make([]float32, len(r.LossMask))
		for j := range r.LossMask {
			r.OldLogprobs[j], r.SamplerLogprobs[j] = float32(-3*rng.Float64()), float32(-3*rng.Float64())
		}
		other[i] = r
	}
	for _, mod := range []func(*grpo.LossConfig){
		func(*grpo.LossConfig) {},
		func(c *grpo.LossConfig) {
			c.ISCorrection, c.ISClipMin, c.ISClipMax = grpo.ISCorrectionTokenTruncate, 0.5, 1.5
		},
		func(c *grpo.LossConfig) {
			c.ISLevel, c.ISCorrection = grpo.ISLevelSequence, grpo.ISCorrectionSequenceMask
		},
	} {
		cfg := sftConfig(1)
		mod(&cfg)
		st, g := run(other, cfg)
		require.InDelta(t, base.Loss, st.Loss, 1e-12)
		require.Equal(t, base.CorrectTokens, st.CorrectTokens)
		for name, b := range gBase {
			x, y := f64s(b), f64s(g[name])
			for k := range x {
				require.InDelta(t, x[k], y[k], 1e-12, "%s[%d]", name, k)
			}
		}
	}
}

// TestSFTGradientFiniteDifference checks the whole random tiny model's sft
// gradient (fused path) against finite differences.
func TestSFTGradientFiniteDifference(t *testing.T) {
	m := loadTiny(t, ModelOptions{DType: "float64"})
	rows := sftRows(300)
	pick := func(i TensorInfo) bool {
		switch i.Name {
		case "model.embed_tokens.weight", "model.norm.weight", "model.layers.0.self_attn.q_proj.weight",
			"model.layers.1.mlp.down_proj.weight", "model.layers.1.self_attn.v_proj.weight":
			return true
		}
		return false
	}
	gradCheck(t, m, KindWeight, grpo.MicroBatch{Rows: rows, RoundTokens: activeTokens(rows), GradAccumSteps: 1}, sftConfig(1), pick)
}

// TestSFTLossType covers the name table, the helpers and the refusal of a
// KL term (beta != 0) by Validate, which ForwardBackward runs before the
// worker (whose own check, in loss.cpp, guards other callers of the ABI).
func TestSFTLossType(t *testing.T) {
	lt, err := grpo.ParseLossType("sft")
	require.NoError(t, err)
	assert.Equal(t, grpo.LossSFT, lt)
	assert.Equal(t, "sft", lt.String())
	assert.True(t, lt.NormalisedByRoundTokens())
	assert.False(t, lt.UsesClip())
	assert.Contains(t, grpo.LossTypeNames(), "sft")

	cfg := sftConfig(1)
	require.NoError(t, cfg.Validate())
	cfg.Beta = 0.04
	err = cfg.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "beta")
	assert.Contains(t, err.Error(), "sft")

	m := loadTiny(t, ModelOptions{DType: "float64"})
	rows := sftRows(300)
	for i := range rows {
		rows[i].RefLogprobs = make([]float32, len(rows[i].LossMask))
	}
	mb := grpo.MicroBatch{Rows: rows, RoundTokens: activeTokens(rows), GradAccumSteps: 1}
	_, err = m.ForwardBackward(context.Background(), mb, cfg)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "beta: 0.04 must be 0 for loss_type sft")
}
