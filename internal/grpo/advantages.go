package grpo

import (
	"fmt"
	"math"
	"strings"
)

// stdEpsilon is added to the standard deviation (not under a square root),
// as TRL's synchronous GRPOTrainer does (grpo-reference.md §3).
const stdEpsilon = 1e-4

// ScaleRewards is scale_rewards: divide the centred rewards by the group's
// std, by the whole batch's std, or not at all.
type ScaleRewards int

const (
	ScaleGroup ScaleRewards = iota
	ScaleBatch
	ScaleNone
)

// ParseScaleRewards parses group, batch or none (TRL's true/false map to group/none).
func ParseScaleRewards(s string) (ScaleRewards, error) {
	switch strings.ToLower(s) {
	case "group", "true":
		return ScaleGroup, nil
	case "batch":
		return ScaleBatch, nil
	case "none", "false":
		return ScaleNone, nil
	}
	return 0, fmt.Errorf("unknown scale_rewards %q (allowed: group, batch, none)", s)
}

// Advantages is the result of GroupAdvantages, aligned with the rewards.
type Advantages struct {
	// A is the advantage per completion; unscorable rows (NaN reward) get 0.
	A []float64
	// StdZero marks rows whose group (or, in batch mode, the batch) had a
	// reward std of ~0: they carry no learning signal (frac_reward_zero_std).
	StdZero []bool
}

// GroupAdvantages computes GRPO advantages for rewards laid out as
// consecutive groups of g completions of the same prompt
// (grpo-reference.md §3.1, "sum_then_normalize" with one reward source):
// A = r - nanmean(group), divided by nanstd(group|batch, ddof=1) + 1e-4
// unless scale is none; NaN results become 0. NaN rewards are unscorable.
func GroupAdvantages(rewards []float64, g int, scale ScaleRewards) (Advantages, error) {
	if g < 1 || len(rewards)%g != 0 {
		return Advantages{}, fmt.Errorf("group advantages: %d rewards do not form whole groups of %d", len(rewards), g)
	}
	n := len(rewards)
	out := Advantages{A: make([]float64, n), StdZero: make([]bool, n)}
	batchStd := nanStd(rewards)
	for start := 0; start < n; start += g {
		group := rewards[start : start+g]
		mean := nanMean(group)
		std := nanStd(group)
		if scale == ScaleBatch {
			std = batchStd
		}
		zero := isClose0(std)
		for j, r := range group {
			a := r - mean
			if scale != ScaleNone {
				a /= std + stdEpsilon
			}
			if math.IsNaN(a) || math.IsInf(a, 0) {
				a = 0
			}
			out.A[start+j] = a
			out.StdZero[start+j] = zero
		}
	}
	return out, nil
}

// isClose0 mirrors torch.isclose(std, 0): |std| <= atol 1e-8 (NaN is not close).
func isClose0(x float64) bool { return math.Abs(x) <= 1e-8 }

// nanMean is the mean over non-NaN values; NaN when there are none.
func nanMean(xs []float64) float64 {
	sum, n := 0.0, 0
	for _, x := range xs {
		if !math.IsNaN(x) {
			sum += x
			n++
		}
	}
	if n == 0 {
		return math.NaN()
	}
	return sum / float64(n)
}

// nanStd is the sample (Bessel, ddof=1) std over non-NaN values; NaN when
// fewer than two values exist.
func nanStd(xs []float64) float64 {
	mean := nanMean(xs)
	ss, n := 0.0, 0
	for _, x := range xs {
		if !math.IsNaN(x) {
			ss += (x - mean) * (x - mean)
			n++
		}
	}
	if n < 2 {
		return math.NaN()
	}
	return math.Sqrt(ss / float64(n-1))
}
