package worker

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/grpo"
)

func TestPackRows(t *testing.T) {
	cases := []struct {
		name    string
		lengths []int
		budget  int
		want    Packing
	}{
		{"all fit in one", []int{3, 4, 2}, 16, Packing{Seq: []int32{0, 0, 0}, Sequences: 1, Positions: 9, PaddedPositions: 12}},
		{"next sequence when full", []int{5, 4, 3, 6}, 9, Packing{Seq: []int32{0, 0, 1, 1}, Sequences: 2, Positions: 18, PaddedPositions: 24}},
		{"a row over the budget alone", []int{12, 2, 2}, 8, Packing{Seq: []int32{0, 1, 1}, Sequences: 2, Positions: 24, PaddedPositions: 36}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { assert.Equal(t, tc.want, PackRows(tc.lengths, tc.budget)) })
	}
}

// mixedRows are rows of very different lengths, as a multi-turn batch.
func mixedRows(rng *rand.Rand, n, vocab int) []grpo.Row {
	rows := randomRows(rng, n, vocab)
	for i := range rows {
		if i%3 == 0 { // a long multi-turn row
			extra := make([]int32, 20+rng.IntN(20))
			for j := range extra {
				extra[j] = int32(rng.IntN(vocab))
			}
			rows[i].Tokens = append(rows[i].Tokens, extra...)
			mask := make([]uint8, len(extra))
			for j := range mask {
				mask[j] = uint8(j % 2)
			}
			rows[i].LossMask = append(rows[i].LossMask, mask...)
		}
	}
	return rows
}

// TestPackedMatchesPadded: a batch packed into sequences (each row seeing
// only itself, positions restarting) gives the log-probs, entropies, loss
// and gradients of the same batch padded row by row, to the float32 floor.
func TestPackedMatchesPadded(t *testing.T) {
	ctx := context.Background()
	rows := mixedRows(rand.New(rand.NewPCG(3, 4)), 9, 300)
	padded := loadTiny(t, ModelOptions{})
	packed := loadTiny(t, ModelOptions{PackTokens: 48})
	p := PackRows(func() []int {
		var l []int
		for _, r := range rows {
			l = append(l, len(r.Tokens))
		}
		return l
	}(), 48)
	require.Less(t, p.Positions, p.PaddedPositions, "the batch packs")
	require.Greater(t, p.Sequences, 1)

	wantLp, wantEnt, err := padded.Logprobs(ctx, rows, 1, false)
	require.NoError(t, err)
	gotLp, gotEnt, err := packed.Logprobs(ctx, rows, 1, false)
	require.NoError(t, err)
	for i := range rows {
		assert.InDeltaSlice(t, wantLp[i], gotLp[i], 2e-5, "row %d log-probs", i)
		assert.InDeltaSlice(t, wantEnt[i], gotEnt[i], 2e-5, "row %d entropies", i)
	}

	cfg := grpo.DefaultLossConfig()
	cfg.ISCorrection = grpo.ISCorrectionOff
	mb := grpo.MicroBatch{Rows: rows, RoundTokens: float64(grpo.ActiveTokens(rows)), GradAccumSteps: 1}
	want, err := padded.ForwardBackward(ctx, mb, cfg)
	require.NoError(t, err)
	got, err := packed.ForwardBackward(ctx, mb, cfg)
	require.NoError(t, err)
	assert.InDelta(t, want.Loss, got.Loss, 1e-6)
	gw, gp := tensorBytes(t, padded, KindGrad), tensorBytes(t, packed, KindGrad)
	require.Equal(t, len(gw), len(gp))
	worst := 0.0
	for name, w := range gw {
		g := gp[name]
		require.Len(t, g, len(w), name)
		for i := 0; i+4 <= len(w); i += 4 {
			a := math.Float32frombits(binary.LittleEndian.Uint32(w[i:]))
			b := math.Float32frombits(binary.LittleEndian.Uint32(g[i:]))
			worst = max(worst, math.Abs(float64(a-b))/(1e-3+math.Abs(float64(a))))
		}
	}
	assert.Less(t, worst, 1e-3, "gradients agree to float32 noise")
	t.Logf("positions: padded %d, packed %d (%d sequences); worst relative gradient difference %.2g", p.PaddedPositions, p.Positions, p.Sequences, worst)
}
