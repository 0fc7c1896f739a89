package curriculum

import (
	"math"
	"slices"
)

// DAPO's dynamic sampling (verl's filter_groups): a group whose rollouts
// all earned the same reward has advantage 0 everywhere and teaches the
// policy nothing, so a round keeps only groups with a reward spread and
// generates more tasks until it has K of them.

// HasSpread reports whether a group's scored rewards differ; failed
// rollouts (NaN) are left out, and fewer than two scored ones have none.
func HasSpread(rewards []float64) bool {
	lo, hi, n := math.Inf(1), math.Inf(-1), 0
	for _, r := range rewards {
		if math.IsNaN(r) {
			continue
		}
		lo, hi, n = min(lo, r), max(hi, r), n+1
	}
	return n >= 2 && hi > lo
}

// SelectGroups picks the k groups a round trains on out of those
// generated for it, in generation order: the first k with a reward
// spread. When fewer have one, the rest are the first uniform groups
// (filled counts them): the batch keeps its shape, and the caller says
// that part of it carries no policy gradient. Fewer than k groups in
// all is the caller's error.
func SelectGroups(groups [][]float64, k int) (keep []int, filled int) {
	var uniform []int
	for i, g := range groups {
		if len(keep) == k {
			break
		}
		if HasSpread(g) {
			keep = append(keep, i)
		} else {
			uniform = append(uniform, i)
		}
	}
	for _, i := range uniform {
		if len(keep) == k {
			break
		}
		keep = append(keep, i)
		filled++
	}
	slices.Sort(keep)
	return keep, filled
}

// DynamicStats is what dynamic sampling did for one round: the groups
// generated (the round's own and its refills'), those trained on with a
// reward spread (Kept), the uniform ones trained on because the round
// stayed short (Filled), the extra rounds, and the completion tokens of
// the groups dropped.
type DynamicStats struct {
	Generated, Kept, Filled, ExtraRounds, DroppedTokens int
}

// Metrics are the round's dynamic_sampling/* metrics.
func (d DynamicStats) Metrics() map[string]float64 {
	return map[string]float64{
		"dynamic_sampling/groups_generated": float64(d.Generated),
		"dynamic_sampling/groups_dropped":   float64(d.Generated - d.Kept - d.Filled),
		"dynamic_sampling/filled_groups":    float64(d.Filled),
		"dynamic_sampling/extra_rounds":     float64(d.ExtraRounds),
		"dynamic_sampling/dropped_tokens":   float64(d.DroppedTokens),
	}
}
