package worker

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/stretchr/testify/require"
)

// benchRows are 4 rows of 32 prompt + 96 completion tokens.
func benchRows() grpo.MicroBatch {
	rng := rand.New(rand.NewPCG(1, 2))
	rows := make([]grpo.Row, 4)
	for i := range rows {
		toks := make([]int32, 128)
		for j := range toks {
			toks[j] = int32(rng.IntN(300))
		}
		mask := make([]uint8, 96)
		for j := range mask {
			mask[j] = 1
		}
		rows[i] = grpo.Row{Tokens: toks, PromptLen: 32, LossMask: mask, Advantage: float32(rng.NormFloat64())}
	}
	return grpo.MicroBatch{Rows: rows, RoundTokens: 384, GradAccumSteps: 1}
}

// BenchmarkTrainStep is one dapo forward/backward plus AdamW step on the
// tiny preset (512 tokens per op).
func BenchmarkTrainStep(b *testing.B) {
	m := loadTiny(b, ModelOptions{})
	mb := benchRows()
	cfg := grpo.DefaultLossConfig()
	cfg.ISCorrection = grpo.ISCorrectionOff
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		if _, err := m.ForwardBackward(ctx, mb, cfg); err != nil {
			b.Fatal(err)
		}
		if _, err := m.OptimizerStep(ctx, 1e-5); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(512*b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkSample decodes 4 rows x 64 new tokens on the tiny preset.
func BenchmarkSample(b *testing.B) {
	m := loadTiny(b, ModelOptions{})
	reqs := make([]SampleRequest, 4)
	for i := range reqs {
		reqs[i] = SampleRequest{PromptIDs: benchRows().Rows[i].Tokens[:32], MaxNewTokens: 64, Temperature: 1, Seed: int64(i)}
	}
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		if _, err := m.Sample(ctx, reqs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(4*64*b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkListAndReadState lists and reads every weight and every AdamW
// tensor (what SaveHF and SaveOptimizer do) of the tiny preset deepened to
// 64 layers: 706 weights, 1413 optimizer tensors. Each op is one full pass.
func BenchmarkListAndReadState(b *testing.B) {
	p, ok := model.PresetByName("tiny")
	require.True(b, ok)
	p.Config.NumHiddenLayers = 64
	dir := filepath.Join(b.TempDir(), "deep")
	require.NoError(b, model.Init(dir, p, 1))
	m := loadTiny(b, ModelOptions{Dir: dir})
	ctx := context.Background()
	cfg := grpo.DefaultLossConfig()
	cfg.ISCorrection = grpo.ISCorrectionOff
	_, err := m.ForwardBackward(ctx, benchRows(), cfg)
	require.NoError(b, err)
	_, err = m.OptimizerStep(ctx, 1e-5) // creates the optimizer state
	require.NoError(b, err)
	b.ResetTimer()
	for b.Loop() {
		for _, kind := range []TensorKind{KindWeight, KindOptim} {
			infos, err := m.Tensors(kind)
			if err != nil {
				b.Fatal(err)
			}
			for _, info := range infos {
				if _, err := m.ReadTensor(kind, info); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
}

// BenchmarkForwardBackwardLogprobPath compares the fused and recompute
// log-prob paths where the vocab projection dominates: the tiny preset
// widened to a 32,000-token vocabulary, one dapo forward/backward (512 tokens).
func BenchmarkForwardBackwardLogprobPath(b *testing.B) {
	p, ok := model.PresetByName("tiny")
	require.True(b, ok)
	p.Config.VocabSize = 32000
	dir := filepath.Join(b.TempDir(), "tiny-v32000")
	require.NoError(b, model.Init(dir, p, 1))
	mb := benchRows()
	cfg := grpo.DefaultLossConfig()
	cfg.ISCorrection = grpo.ISCorrectionOff
	ctx := context.Background()
	for _, path := range []struct {
		name string
		p    LogprobPath
	}{{"fused", LogprobFused}, {"recompute", LogprobRecompute}} {
		b.Run(path.name, func(b *testing.B) {
			m := loadTiny(b, ModelOptions{Dir: dir, LogprobPath: path.p})
			for b.Loop() {
				if _, err := m.ForwardBackward(ctx, mb, cfg); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(512*b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}
