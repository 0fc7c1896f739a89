package train

import (
	"errors"
	"fmt"
	"math"
)

// ErrSamplerDrift stops a synchronous run whose sampler's log-probs jumped
// away from the trainer's and stayed away: the sampler is no longer running
// the policy being trained (stale or half-loaded weights, a server that
// ignored a reload), so its samples would train the wrong thing.
var ErrSamplerDrift = errors.New("the sampler's log-probs no longer match the trainer's")

// Drift bounds: a step's mean |Δ log p| is a jump when it exceeds both
// driftFloor (what half-precision inference alone can reach) and
// driftFactor times the run's baseline (the smallest of its first
// driftBaselineSteps steps); driftSteps jumps in a row stop the run.
const (
	driftFloor         = 0.05
	driftFactor        = 10
	driftBaselineSteps = 3
	driftSteps         = 2
)

// samplerDrift watches sampling/sampling_logp_difference/mean of a
// synchronous run.
type samplerDrift struct {
	seen     int
	baseline float64
	jumps    int
}

// observe takes one step's mean difference; it returns ErrSamplerDrift
// (wrapped, with the numbers) after driftSteps jumps in a row.
func (d *samplerDrift) observe(step int, mean float64) error {
	if math.IsNaN(mean) {
		return nil
	}
	if d.seen < driftBaselineSteps {
		if d.seen == 0 || mean < d.baseline {
			d.baseline = mean
		}
		d.seen++
		return nil
	}
	bound := max(driftFloor, driftFactor*d.baseline)
	if mean <= bound {
		d.jumps = 0
		return nil
	}
	if d.jumps++; d.jumps < driftSteps {
		return nil
	}
	return fmt.Errorf("%w at step %d: the mean |trainer − sampler| log-prob difference is %.3g for %d steps in a row (the run's first steps: %.3g; bound %.3g). "+
		"The generation server is most likely still serving older weights: check its log for failed reloads, and the vLLM version table in the README",
		ErrSamplerDrift, step, mean, d.jumps, d.baseline, bound)
}
