package grpo

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSamplingMetrics(t *testing.T) {
	rows := []Row{
		// token 1 is tool output (mask 0) and must not count
		{LossMask: []uint8{1, 0, 1}, OldLogprobs: []float32{-1, -5, -2}, SamplerLogprobs: []float32{-1.5, 0, -1}},
		{LossMask: []uint8{1}, OldLogprobs: []float32{-0.5}, SamplerLogprobs: []float32{-0.5}},
		{LossMask: []uint8{1}}, // no log-probs: left out
	}
	c := DefaultLossConfig() // sequence_mask, max 3
	m := SamplingMetrics(rows, c)
	assert.InDelta(t, (0.5+1+0)/3, m["sampling/sampling_logp_difference/mean"], 1e-6)
	assert.InDelta(t, 1.0, m["sampling/sampling_logp_difference/max"], 1e-6)
	// Sequence ratios: exp(0.5 - 1) = exp(-0.5) and exp(0) = 1; both within [0, 3].
	assert.InDelta(t, math.Exp(-0.5), m["sampling/importance_sampling_ratio/min"], 1e-6)
	assert.InDelta(t, 1.0, m["sampling/importance_sampling_ratio/max"], 1e-6)

	c.ISCorrection, c.ISClipMax = ISCorrectionTokenTruncate, 1.2
	m = SamplingMetrics(rows, c)
	// Token ratios exp(0.5)=1.65→1.2 (truncated), exp(-1)=0.37, exp(0)=1.
	assert.InDelta(t, math.Exp(-1), m["sampling/importance_sampling_ratio/min"], 1e-6)
	assert.InDelta(t, 1.2, m["sampling/importance_sampling_ratio/max"], 1e-6)
	assert.InDelta(t, (1.2+math.Exp(-1)+1)/3, m["sampling/importance_sampling_ratio/mean"], 1e-6)

	c.ISCorrection = ISCorrectionTokenMask
	m = SamplingMetrics(rows, c)
	assert.InDelta(t, 0, m["sampling/importance_sampling_ratio/min"], 1e-12, "masked ratio counts as 0")

	assert.Nil(t, SamplingMetrics([]Row{{LossMask: []uint8{1}}}, c))
}
