package worker

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/stretchr/testify/require"
)

// fusedLossCases are the configs the fused pass applies to: every loss type
// with a KL term (beta > 0), importance-sampling corrections at token and
// sequence level, entropy bonuses, on-policy rows and rows lacking old log-probs.
func fusedLossCases() []lossCase {
	mk := func(name string, typ grpo.LossType, f func(*grpo.LossConfig)) lossCase {
		c := grpo.DefaultLossConfig()
		c.Type, c.ISCorrection, c.Temperature, c.MaxCompletionLength = typ, grpo.ISCorrectionTokenTruncate, 0.9, 12
		c.Beta, c.ISClipMin, c.ISClipMax = 0.05, 0.9, 1.2
		lc := lossCase{name: name, cfg: c, sampler: true, ref: true}
		if f != nil {
			f(&lc.cfg)
		}
		return lc
	}
	cases := []lossCase{
		mk("dapo_beta", grpo.LossDAPO, nil),
		mk("grpo_beta", grpo.LossGRPO, nil),
		mk("bnpo_beta", grpo.LossBNPO, nil),
		mk("dr_grpo_beta", grpo.LossDrGRPO, nil),
		mk("cispo_beta", grpo.LossCISPO, func(c *grpo.LossConfig) { c.EpsilonHigh = 1.1 }),
		mk("sapo_beta_entropy", grpo.LossSAPO, func(c *grpo.LossConfig) { c.EntropyCoef = 0.2 }),
		mk("luspo_token_beta", grpo.LossLUSPO, nil),
		mk("dapo_delta_token_mask", grpo.LossDAPO, func(c *grpo.LossConfig) {
			c.Delta, c.ISCorrection, c.ISClipMax, c.Beta = 1.25, grpo.ISCorrectionTokenMask, 1.3, 0
		}),
		mk("grpo_beta_sequence_mask", grpo.LossGRPO, func(c *grpo.LossConfig) {
			c.ISCorrection, c.ISClipMax = grpo.ISCorrectionSequenceMask, 1.5
		}),
		mk("bnpo_sequence_truncate_entropy", grpo.LossBNPO, func(c *grpo.LossConfig) {
			c.ISCorrection, c.ISClipMax, c.EntropyCoef = grpo.ISCorrectionSequenceTruncate, 1.1, 0.1
		}),
	}
	onPolicy := mk("dapo_on_policy_entropy_temp1", grpo.LossDAPO, func(c *grpo.LossConfig) {
		c.ISCorrection, c.Beta, c.EntropyCoef, c.Temperature = grpo.ISCorrectionOff, 0, 0.3, 1
	})
	onPolicy.noOld, onPolicy.sampler, onPolicy.ref = true, false, false
	return append(cases, onPolicy)
}

// fusedBatch has rows of different lengths (padding), masked tool tokens,
// and off-policy old, sampler and reference log-probs near the policy's.
// Row 0 lacks sampler log-probs and, with a token-level correction, row 1
// lacks old ones (its ratio is then 1).
func fusedBatch(t *testing.T, m *Model, lc lossCase, vocab int) grpo.MicroBatch {
	t.Helper()
	rng := rand.New(rand.NewPCG(17, uint64(vocab)))
	rows := make([]grpo.Row, 6)
	for i := range rows {
		P, T := 1+rng.IntN(5), 1+rng.IntN(11)
		toks := make([]int32, P+T)
		for j := range toks {
			toks[j] = int32(rng.IntN(vocab))
		}
		mask := make([]uint8, T)
		for j := range mask {
			mask[j] = uint8(min(1, rng.IntN(5)))
		}
		rows[i] = grpo.Row{Tokens: toks, PromptLen: P, LossMask: mask, Advantage: float32(rng.NormFloat64())}
	}
	lp, _, err := m.Logprobs(context.Background(), rows, lc.cfg.Temperature, false)
	require.NoError(t, err)
	seqCorrection := lc.cfg.ISCorrection == grpo.ISCorrectionSequenceMask || lc.cfg.ISCorrection == grpo.ISCorrectionSequenceTruncate
	for i := range rows {
		near := func(sd float64) []float32 {
			out := make([]float32, len(lp[i]))
			for j := range out {
				out[j] = lp[i][j] + float32(sd*rng.NormFloat64())
			}
			return out
		}
		if !lc.noOld && (i != 1 || seqCorrection) {
			rows[i].OldLogprobs = near(0.15)
		}
		if lc.sampler && i > 0 {
			rows[i].SamplerLogprobs = near(0.1)
		}
		if lc.ref {
			rows[i].RefLogprobs = near(0.3)
		}
	}
	return grpo.MicroBatch{Rows: rows, RoundTokens: 23.5, GradAccumSteps: 2}
}

// TestFusedEqualsRecompute: the fused pass (log-probs and the loss gradient
// through the vocab projection in one pass) gives the recompute path's loss
// and metrics bit for bit (so the same per-token log-probs and entropies
// went in) and its gradients to the floating-point floor: relative to each
// gradient tensor's largest entry, 1e-13 in float64 and 1e-5 in float32 (measured: 2e-15 and 8e-7).
// Models: full fine-tuning with tied and untied heads, small chunks,
// activation recomputation, LoRA with and without modules_to_save.
func TestFusedEqualsRecompute(t *testing.T) {
	ctx := context.Background()
	llama := filepath.Join("..", "..", "testdata", "worker", "micro-llama")
	lora := func(save ...string) *LoRAOptions {
		return &LoRAOptions{Rank: 2, Alpha: 4, TargetModules: []string{"q_proj", "v_proj", "down_proj"}, ModulesToSave: save}
	}
	models := []struct {
		name  string
		opts  ModelOptions
		vocab int
		tol   float64
	}{
		{"full_fp64", ModelOptions{DType: "float64"}, 300, 1e-13},
		{"full_fp32", ModelOptions{}, 300, 1e-5},
		{"untied_head_fp64", ModelOptions{Dir: llama, DType: "float64"}, 61, 1e-13},
		{"chunks_of_5_fp64", ModelOptions{DType: "float64", LogprobChunkRows: 5}, 300, 1e-13},
		{"checkpointing_fp32", ModelOptions{GradientCheckpointing: true}, 300, 1e-5},
		{"lora_fp64", ModelOptions{DType: "float64", LoRA: lora()}, 300, 1e-13},
		{"lora_save_tied_lm_head_fp64", ModelOptions{DType: "float64", LoRA: lora("lm_head")}, 300, 1e-13},
		{"lora_save_untied_lm_head_fp64", ModelOptions{Dir: llama, DType: "float64", LoRA: lora("lm_head", "norm")}, 61, 1e-13},
		{"lora_save_untied_embed_fp32", ModelOptions{Dir: llama, LoRA: lora("embed_tokens"), LogprobChunkRows: 4}, 61, 1e-5},
	}
	for _, mc := range models {
		t.Run(mc.name, func(t *testing.T) {
			fusedOpts, recomputeOpts := mc.opts, mc.opts
			fusedOpts.LogprobPath, recomputeOpts.LogprobPath = LogprobFused, LogprobRecompute
			fused, recompute := loadTiny(t, fusedOpts), loadTiny(t, recomputeOpts)
			if mc.opts.LoRA != nil { // B = 0 at init hides A's gradient: perturb the adapters alike
				perturbLoRA(t, fused, recompute)
			}
			for _, lc := range fusedLossCases() {
				mb := fusedBatch(t, recompute, lc, mc.vocab)
				var stats [2]LossStats
				var grads [2]map[string][]byte
				for i, m := range []*Model{fused, recompute} {
					require.NoError(t, m.ZeroGrad(ctx))
					st, err := m.ForwardBackward(ctx, mb, lc.cfg)
					require.NoError(t, err, lc.name)
					stats[i], grads[i] = st, tensorBytes(t, m, KindGrad)
				}
				require.Equal(t, stats[1], stats[0], "%s: loss and metrics", lc.name)
				require.NotZero(t, stats[0].Loss, lc.name)
				infos, err := fused.Tensors(KindGrad)
				require.NoError(t, err)
				require.NotEmpty(t, infos)
				worst := 0.0
				for _, info := range infos {
					a, b := floats(t, info.DType, grads[0][info.Name]), floats(t, info.DType, grads[1][info.Name])
					scale := 0.0
					for _, x := range b {
						scale = math.Max(scale, math.Abs(x))
					}
					require.NotZero(t, scale, "%s: %s has a zero gradient, so the comparison would prove nothing", lc.name, info.Name)
					for k := range a {
						e := math.Abs(a[k]-b[k]) / scale
						worst = math.Max(worst, e)
						require.LessOrEqual(t, e, mc.tol, "%s: %s[%d] fused %.17g, recompute %.17g", lc.name, info.Name, k, a[k], b[k])
					}
				}
				t.Logf("%s: loss %.9g, max |fused - recompute| / max |grad| = %.3g", lc.name, stats[0].Loss, worst)
			}
		})
	}
}

// perturbLoRA writes the same random adapter weights into every model.
func perturbLoRA(t *testing.T, models ...*Model) {
	t.Helper()
	infos, err := models[0].Tensors(KindLoRA)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(5, 5))
	for _, info := range infos {
		if !strings.Contains(info.Name, ".lora_") {
			continue // modules_to_save copies start as the base
		}
		v := make([]float64, info.Shape[0]*info.Shape[1])
		for k := range v {
			v[k] = 0.3 * rng.NormFloat64()
		}
		data := f64bytes(v)
		if info.DType == model.F32 {
			data = make([]byte, 4*len(v))
			for k, x := range v {
				binary.LittleEndian.PutUint32(data[4*k:], math.Float32bits(float32(x)))
			}
		}
		for _, m := range models {
			require.NoError(t, m.WriteTensor(KindLoRA, model.Tensor{Name: info.Name, DType: info.DType, Shape: info.Shape, Data: data}))
		}
	}
}

// TestFusedRefusesNonSeparableLosses: where a token's gradient depends on
// other tokens' log-probs the fused pass does not apply, LogprobFused says
// why, and LogprobAuto takes the recompute path (same loss and gradients).
func TestFusedRefusesNonSeparableLosses(t *testing.T) {
	ctx := context.Background()
	fused := loadTiny(t, ModelOptions{DType: "float64", LogprobPath: LogprobFused})
	auto := loadTiny(t, ModelOptions{DType: "float64"})
	recompute := loadTiny(t, ModelOptions{DType: "float64", LogprobPath: LogprobRecompute})
	seqNoOld := fusedLossCases()[8] // sequence_mask correction
	require.Equal(t, grpo.ISCorrectionSequenceMask, seqNoOld.cfg.ISCorrection)
	seqNoOld.name, seqNoOld.noOld = "sequence_correction_without_old", true
	cases := []struct {
		lc   lossCase
		want string
	}{
		{lossCases()[7], "vespo"},
		{lossCases()[8], "importance_sampling_level sequence"},
		{lossCases()[6], "importance_sampling_level sequence"},
		{seqNoOld, "sampler but no old log-probs"},
	}
	for _, c := range cases {
		t.Run(c.lc.name, func(t *testing.T) {
			mb := fusedBatch(t, auto, c.lc, 300)
			_, err := fused.ForwardBackward(ctx, mb, c.lc.cfg)
			require.ErrorContains(t, err, "logprob_path fused does not apply")
			require.ErrorContains(t, err, c.want)
			var stats [2]LossStats
			var grads [2]map[string][]byte
			for i, m := range []*Model{auto, recompute} {
				require.NoError(t, m.ZeroGrad(ctx))
				stats[i], err = m.ForwardBackward(ctx, mb, c.lc.cfg)
				require.NoError(t, err)
				grads[i] = tensorBytes(t, m, KindGrad)
			}
			require.Equal(t, stats[1], stats[0])
			require.Equal(t, grads[1], grads[0], "the same (recompute) path, bit for bit")
		})
	}
}

// TestGradientsAccumulateAcrossMicroBatches: two micro-batches in a row
// leave in .grad the sum of their separate gradients, on both log-prob paths.
// The fused pass adds the LM head's gradient into an existing .grad in place,
// and the embedding lookup adds its rows there too (tied heads share that
// tensor), so this checks both against plain sums (1e-13 relative, float64).
func TestGradientsAccumulateAcrossMicroBatches(t *testing.T) {
	ctx := context.Background()
	llama := filepath.Join("..", "..", "testdata", "worker", "micro-llama")
	cases := fusedLossCases()
	for _, mc := range []struct {
		name  string
		opts  ModelOptions
		vocab int
	}{
		{"tied_head", ModelOptions{DType: "float64"}, 300},
		{"untied_head", ModelOptions{Dir: llama, DType: "float64"}, 61},
		{"lora_save_untied_embed", ModelOptions{Dir: llama, DType: "float64", LoRA: &LoRAOptions{
			Rank: 2, Alpha: 4, TargetModules: []string{"q_proj", "down_proj"}, ModulesToSave: []string{"embed_tokens", "lm_head"}}}, 61},
	} {
		for _, path := range []struct {
			name string
			p    LogprobPath
		}{{"fused", LogprobFused}, {"recompute", LogprobRecompute}} {
			t.Run(mc.name+"_"+path.name, func(t *testing.T) {
				o := mc.opts
				o.LogprobPath = path.p
				m := loadTiny(t, o)
				if o.LoRA != nil {
					perturbLoRA(t, m)
				}
				lc1, lc2 := cases[0], cases[1]
				mb1, mb2 := fusedBatch(t, m, lc1, mc.vocab), fusedBatch(t, m, lc2, mc.vocab)
				grads := func(steps ...func() error) map[string][]byte {
					require.NoError(t, m.ZeroGrad(ctx))
					for _, s := range steps {
						require.NoError(t, s())
					}
					return tensorBytes(t, m, KindGrad)
				}
				one := func() error { _, err := m.ForwardBackward(ctx, mb1, lc1.cfg); return err }
				two := func() error { _, err := m.ForwardBackward(ctx, mb2, lc2.cfg); return err }
				g1, g2, both := grads(one), grads(two), grads(one, two)
				infos, err := m.Tensors(KindGrad)
				require.NoError(t, err)
				require.NotEmpty(t, infos)
				for _, info := range infos {
					name := info.Name
					a, b, c := floats(t, info.DType, g1[name]), floats(t, info.DType, g2[name]), floats(t, info.DType, both[name])
					scale := 0.0
					for k := range c {
						scale = math.Max(scale, math.Abs(a[k]+b[k]))
					}
					require.NotZero(t, scale, "%s: zero gradient", name)
					for k := range c {
						require.LessOrEqual(t, math.Abs(c[k]-(a[k]+b[k]))/scale, 1e-13, "%s[%d]: accumulated %.17g, sum %.17g", name, k, c[k], a[k]+b[k])
					}
				}
			})
		}
	}
}
