package grpo

import (
	"math"
	"slices"
	"sort"
)

// RoundMetrics are the generation-side metrics of one round, with TRL's
// names in Map (grpo-reference.md §5).
type RoundMetrics struct {
	Reward, RewardStd    float64
	FracRewardZeroStd    float64
	MeanLength           float64
	MinLength, MaxLength float64
	ClippedRatio         float64
	MeanTerminatedLength float64
	MinTerminatedLength  float64
	MaxTerminatedLength  float64
	ToolCallFrequency    float64
	ToolFailureFrequency float64
	Unscorable           int
	// IdenticalGroups counts groups whose samples are token-identical
	// (set by the caller from IdenticalGroups; rollouts/identical_groups).
	IdenticalGroups             int
	PromptTokens, SampledTokens int
	// PerEnv holds reward mean and std per environment.
	PerEnv map[string][2]float64
}

// ComputeRoundMetrics reduces one round's samples. Lengths count only
// sampled tokens (tool mask 1); unscorable rows are left out of the reward
// statistics.
func ComputeRoundMetrics(samples []Sample, adv Advantages) RoundMetrics {
	var m RoundMetrics
	n := len(samples)
	if n == 0 {
		return m
	}
	rewards := make([]float64, n)
	perEnv := map[string][]float64{}
	var lengths, terminated []float64
	calls, failures, zero := 0, 0, 0
	for i, s := range samples {
		rewards[i] = s.Reward
		if isNaN(s.Reward) {
			m.Unscorable++
		} else {
			perEnv[s.Env] = append(perEnv[s.Env], s.Reward)
		}
		l := 0
		for _, t := range s.ToolMask {
			l += int(t)
		}
		lengths = append(lengths, float64(l))
		if s.Truncated {
			m.ClippedRatio++
		} else {
			terminated = append(terminated, float64(l))
		}
		m.PromptTokens += len(s.PromptIDs)
		m.SampledTokens += l
		calls += s.ToolCalls
		failures += s.ToolFailures
		if i < len(adv.StdZero) && adv.StdZero[i] {
			zero++
		}
	}
	m.Reward, m.RewardStd = nanMean(rewards), nanStd(rewards)
	m.FracRewardZeroStd = float64(zero) / float64(n)
	m.ClippedRatio /= float64(n)
	m.MeanLength, m.MinLength, m.MaxLength = meanMinMax(lengths)
	m.MeanTerminatedLength, m.MinTerminatedLength, m.MaxTerminatedLength = meanMinMax(terminated)
	m.ToolCallFrequency = float64(calls) / float64(n)
	if calls > 0 {
		m.ToolFailureFrequency = float64(failures) / float64(calls)
	}
	m.PerEnv = map[string][2]float64{}
	for env, rs := range perEnv {
		m.PerEnv[env] = [2]float64{nanMean(rs), nanStd(rs)}
	}
	return m
}

// meanMinMax returns 0s for an empty slice, as TRL does.
func meanMinMax(xs []float64) (mean, lo, hi float64) {
	if len(xs) == 0 {
		return 0, 0, 0
	}
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, x := range xs {
		mean += x
		lo, hi = math.Min(lo, x), math.Max(hi, x)
	}
	return mean / float64(len(xs)), lo, hi
}

// Map returns the metrics under TRL's keys; NaN values are left out.
func (m RoundMetrics) Map() map[string]float64 {
	out := map[string]float64{
		"reward":                             m.Reward,
		"reward_std":                         m.RewardStd,
		"frac_reward_zero_std":               m.FracRewardZeroStd,
		"completions/mean_length":            m.MeanLength,
		"completions/min_length":             m.MinLength,
		"completions/max_length":             m.MaxLength,
		"completions/clipped_ratio":          m.ClippedRatio,
		"completions/mean_terminated_length": m.MeanTerminatedLength,
		"completions/min_terminated_length":  m.MinTerminatedLength,
		"completions/max_terminated_length":  m.MaxTerminatedLength,
		"tools/call_frequency":               m.ToolCallFrequency,
		"tools/failure_frequency":            m.ToolFailureFrequency,
		"rollouts/unscorable":                float64(m.Unscorable),
		"rollouts/identical_groups":          float64(m.IdenticalGroups),
	}
	envs := make([]string, 0, len(m.PerEnv))
	for e := range m.PerEnv {
		envs = append(envs, e)
	}
	sort.Strings(envs)
	for _, e := range envs {
		// Per env under env/, so an env key never collides with a reward
		// function's rewards/<name>/ metrics.
		out["env/"+e+"/reward_mean"] = m.PerEnv[e][0]
		out["env/"+e+"/reward_std"] = m.PerEnv[e][1]
	}
	for k, v := range out {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			delete(out, k)
		}
	}
	return out
}

// IdenticalGroups counts the groups (g consecutive samples of one task)
// whose samples are token for token the same: every sample scorable, with
// the same prompt, completion and forks. Such a group has no reward spread
// and teaches nothing; many of them at a temperature above 0 mean the
// samples were not drawn independently (one seed for every rollout).
// Groups of one sample are never counted.
func IdenticalGroups(samples []Sample, g int) int {
	if g < 2 {
		return 0
	}
	n := 0
	for start := 0; start+g <= len(samples); start += g {
		group := samples[start : start+g]
		same := !isNaN(group[0].Reward)
		for _, s := range group[1:] {
			if !same {
				break
			}
			same = !isNaN(s.Reward) && sameTokens(group[0], s)
		}
		if same {
			n++
		}
	}
	return n
}

func sameTokens(a, b Sample) bool {
	if !slices.Equal(a.PromptIDs, b.PromptIDs) || !slices.Equal(a.CompletionIDs, b.CompletionIDs) || len(a.Forks) != len(b.Forks) {
		return false
	}
	for i := range a.Forks {
		if !slices.Equal(a.Forks[i].PromptIDs, b.Forks[i].PromptIDs) || !slices.Equal(a.Forks[i].CompletionIDs, b.Forks[i].CompletionIDs) {
			return false
		}
	}
	return true
}
