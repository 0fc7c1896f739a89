package grpo

import (
	"math"
)

// SamplingMetrics measures the trainer/sampler mismatch of a round whose rows
// carry both old (trainer) and sampler log-probs (grpo-reference.md §4.9, §5):
// sampling/sampling_logp_difference/{mean,max} = |logp_old - logp_sampler|
// over active tokens, and sampling/importance_sampling_ratio/{min,mean,max}
// of the correction rho after truncation or masking, per token or per
// sequence as the mode says. It returns nil when no row has both.
func SamplingMetrics(rows []Row, c LossConfig) map[string]float64 {
	var diffSum, diffMax float64
	var diffN int
	var ratios []float64
	for _, r := range rows {
		if r.OldLogprobs == nil || r.SamplerLogprobs == nil {
			continue
		}
		seq := 0.0
		for t, m := range r.LossMask {
			if m == 0 {
				continue
			}
			d := float64(r.OldLogprobs[t]) - float64(r.SamplerLogprobs[t])
			diffSum += math.Abs(d)
			diffMax = math.Max(diffMax, math.Abs(d))
			diffN++
			if c.ISCorrection.Sequence() {
				seq += d
			} else {
				ratios = append(ratios, c.correct(math.Exp(d)))
			}
		}
		if c.ISCorrection.Sequence() {
			ratios = append(ratios, c.correct(math.Exp(seq)))
		}
	}
	if diffN == 0 {
		return nil
	}
	out := map[string]float64{
		"sampling/sampling_logp_difference/mean": diffSum / float64(diffN),
		"sampling/sampling_logp_difference/max":  diffMax,
	}
	if c.ISCorrection != ISCorrectionOff && len(ratios) > 0 {
		lo, hi, sum := math.Inf(1), math.Inf(-1), 0.0
		for _, x := range ratios {
			lo, hi, sum = math.Min(lo, x), math.Max(hi, x), sum+x
		}
		out["sampling/importance_sampling_ratio/min"] = lo
		out["sampling/importance_sampling_ratio/mean"] = sum / float64(len(ratios))
		out["sampling/importance_sampling_ratio/max"] = hi
	}
	return out
}

// correct applies the mode's truncation (clamp) or masking (zero outside
// [ISClipMin, ISClipMax]) to one ratio.
func (c LossConfig) correct(rho float64) float64 {
	if c.ISCorrection.Mask() {
		if rho < c.ISClipMin || rho > c.ISClipMax {
			return 0
		}
		return rho
	}
	return math.Min(math.Max(rho, c.ISClipMin), c.ISClipMax)
}
