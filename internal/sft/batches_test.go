package sft_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/sft"
)

// rowsOf makes n rows whose first token is their index and whose i-th row
// trains i%3+1 tokens.
func rowsOf(n int) []grpo.Row {
	rows := make([]grpo.Row, n)
	for i := range rows {
		mask := []uint8{0, 1, 1, 1}[:i%3+2]
		rows[i] = grpo.Row{Tokens: append([]int32{int32(i)}, make([]int32, len(mask))...), PromptLen: 1, LossMask: mask}
	}
	return rows
}

func drawStep(t *testing.T, b *sft.Batches, ga int) []grpo.MicroBatch {
	t.Helper()
	var out []grpo.MicroBatch
	for range ga {
		mb, err := b.NextMicroBatch(context.Background(), nil)
		require.NoError(t, err)
		out = append(out, mb)
	}
	b.Commit()
	return out
}

func ids(mbs []grpo.MicroBatch) []int32 {
	var out []int32
	for _, mb := range mbs {
		for _, r := range mb.Rows {
			out = append(out, r.Tokens[0])
		}
	}
	return out
}

func TestBatchesEpochsAndNormaliser(t *testing.T) {
	const n, b, ranks, ga = 10, 2, 1, 2
	bs := sft.NewBatches(rowsOf(n), 7, b, ranks, ga)
	assert.Equal(t, 7, bs.StepsFor(3), "3 epochs of 10 rows, 4 rows a step")
	var seen []int32
	for range 5 { // 20 rows: two whole epochs
		step := drawStep(t, bs, ga)
		trained := 0
		for _, mb := range step {
			require.Len(t, mb.Rows, b*ranks)
			for _, r := range mb.Rows {
				for _, m := range r.LossMask {
					trained += int(m)
				}
			}
		}
		for _, mb := range step {
			assert.Equal(t, float64(trained), mb.RoundTokens, "every micro-batch is normalised by the step's trained tokens")
			assert.Equal(t, ga, mb.GradAccumSteps)
		}
		seen = append(seen, ids(step)...)
	}
	assert.ElementsMatch(t, []int32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, seen[:10], "an epoch is a permutation")
	assert.ElementsMatch(t, seen[:10], seen[10:])
	assert.NotEqual(t, seen[:10], seen[10:], "each epoch is shuffled anew")
	assert.InDelta(t, 2.0, bs.Epoch(), 1e-12)
}

func TestBatchesResumeExactly(t *testing.T) {
	a := sft.NewBatches(rowsOf(9), 3, 2, 2, 1)
	var want [][]int32
	for range 6 {
		want = append(want, ids(drawStep(t, a, 1)))
	}
	b := sft.NewBatches(rowsOf(9), 3, 2, 2, 1)
	for range 2 {
		drawStep(t, b, 1)
	}
	resumed := sft.NewBatches(rowsOf(9), 3, 2, 2, 1)
	resumed.Restore(b.Position())
	// A step drawn and then rewound (it failed) is drawn again.
	_, err := resumed.NextMicroBatch(context.Background(), nil)
	require.NoError(t, err)
	resumed.Restore(b.Position())
	for i := 2; i < 6; i++ {
		assert.Equal(t, want[i], ids(drawStep(t, resumed, 1)), "step %d", i+1)
	}
	other := sft.NewBatches(rowsOf(9), 4, 2, 2, 1)
	assert.NotEqual(t, want[0], ids(drawStep(t, other, 1)), "another seed, another order")
}
