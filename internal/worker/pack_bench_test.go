package worker

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/ortrain/ortrain/internal/grpo"
)

// multiTurnBatch is 16 rows of mixed lengths, as a multi-turn round has:
// most rollouts end after one or two short turns, a few run long (64 to
// 512 tokens).
func multiTurnBatch() grpo.MicroBatch {
	rng := rand.New(rand.NewPCG(7, 8))
	rows := make([]grpo.Row, 16)
	for i := range rows {
		n := 64 + rng.IntN(64)
		if i%5 == 0 {
			n = 384 + rng.IntN(128)
		}
		toks := make([]int32, n)
		for j := range toks {
			toks[j] = int32(rng.IntN(300))
		}
		P := 32
		mask := make([]uint8, n-P)
		for j := range mask {
			mask[j] = uint8(1 - (j/16)%2) // sampled turns and tool results alternate
		}
		rows[i] = grpo.Row{Tokens: toks, PromptLen: P, LossMask: mask, Advantage: float32(rng.NormFloat64())}
	}
	return grpo.MicroBatch{Rows: rows, RoundTokens: float64(grpo.ActiveTokens(rows)), GradAccumSteps: 1}
}

// BenchmarkPackedStep: one dapo forward/backward + AdamW step on the tiny
// model over a multi-turn batch of mixed lengths, padded row by row and
// packed into sequences of at most 1024 tokens, in alternating rounds. It
// prints BENCH_PACK lines: the positions each computes and the median
// step-time ratio. Run it with
//
//	go test -run '^$' -bench PackedStep -benchtime 1x ./internal/worker/
func BenchmarkPackedStep(b *testing.B) {
	const budget, rounds, stepsPerRound = 1024, 5, 3
	mb := multiTurnBatch()
	lengths := make([]int, len(mb.Rows))
	for i, r := range mb.Rows {
		lengths[i] = len(r.Tokens)
	}
	p := PackRows(lengths, budget)
	padded := loadTiny(b, ModelOptions{Threads: 1})
	packed := loadTiny(b, ModelOptions{Threads: 1, PackTokens: budget})
	cfg := grpo.DefaultLossConfig()
	cfg.ISCorrection = grpo.ISCorrectionOff
	ctx := context.Background()
	step := func(m *Model) time.Duration {
		start := time.Now()
		for range stepsPerRound {
			if _, err := m.ForwardBackward(ctx, mb, cfg); err != nil {
				b.Fatal(err)
			}
			if _, err := m.OptimizerStep(ctx, 1e-4); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start) / stepsPerRound
	}
	step(padded) // warm both
	step(packed)
	var ratios []float64
	for range b.N {
		for r := range rounds {
			var dp, dk time.Duration
			if r%2 == 0 {
				dp, dk = step(padded), step(packed)
			} else {
				dk, dp = step(packed), step(padded)
			}
			ratios = append(ratios, dp.Seconds()/dk.Seconds())
			fmt.Printf("BENCH_PACK round=%d padded_step_s=%.4f packed_step_s=%.4f speedup=%.2fx\n", r, dp.Seconds(), dk.Seconds(), dp.Seconds()/dk.Seconds())
		}
	}
	sort.Float64s(ratios)
	fmt.Printf("BENCH_PACK rows=%d positions padded=%d packed=%d (%d sequences of <= %d): padding removed %.0f%%; median step speedup %.2fx (min %.2f, max %.2f)\n",
		len(mb.Rows), p.PaddedPositions, p.Positions, p.Sequences, budget,
		100*float64(p.PaddedPositions-p.Positions)/float64(p.PaddedPositions), ratios[len(ratios)/2], ratios[0], ratios[len(ratios)-1])
	b.ReportMetric(ratios[len(ratios)/2], "speedup")
}
