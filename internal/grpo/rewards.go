package grpo

import (
	"fmt"
	"math"
	"strings"
)

// RewardAggregation turns the rewards of one rollout's tool calls into the
// rollout's reward.
type RewardAggregation int

const (
	// RewardLast is the last non-null reward (TRL's OpenRewardSpec default).
	RewardLast RewardAggregation = iota
	RewardSum
	RewardMax
	RewardMean
)

// ParseRewardAggregation parses last, sum, max or mean.
func ParseRewardAggregation(s string) (RewardAggregation, error) {
	switch strings.ToLower(s) {
	case "last":
		return RewardLast, nil
	case "sum":
		return RewardSum, nil
	case "max":
		return RewardMax, nil
	case "mean":
		return RewardMean, nil
	}
	return 0, fmt.Errorf("unknown reward_aggregation %q (allowed: last, sum, max, mean)", s)
}

// Aggregate reduces per-call rewards (nil = the call returned no reward) to
// one value. With no non-null reward the result is 0, as TRL's env.reward.
func (a RewardAggregation) Aggregate(calls []*float64) float64 {
	var vals []float64
	for _, r := range calls {
		if r != nil && !math.IsNaN(*r) {
			vals = append(vals, *r)
		}
	}
	if len(vals) == 0 {
		return 0
	}
	switch a {
	case RewardSum, RewardMean:
		s := 0.0
		for _, v := range vals {
			s += v
		}
		if a == RewardMean {
			s /= float64(len(vals))
		}
		return s
	case RewardMax:
		m := vals[0]
		for _, v := range vals[1:] {
			m = math.Max(m, v)
		}
		return m
	}
	return vals[len(vals)-1]
}
