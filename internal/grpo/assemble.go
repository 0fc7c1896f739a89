package grpo

import (
	"fmt"
	"math/rand/v2"
)

// Sample is one finished rollout as the trainer hands it to grpo: its tokens,
// which of them the policy sampled, and its reward. Shapes: T = len(CompletionIDs).
type Sample struct {
	PromptIDs     []int32
	CompletionIDs []int32
	// ToolMask has length T: 1 on sampled tokens, 0 on tool output and glue.
	ToolMask []uint8
	// SamplerLogprobs has length T, or is nil when the engine's sampler
	// log-probs are not used for importance-sampling correction.
	SamplerLogprobs []float32
	// Reward is the aggregated rollout reward; NaN marks an unscorable
	// (failed) rollout, which gets advantage 0 and no loss.
	Reward float64
	// Truncated: the completion ran into its token budget rather than ending
	// with an end-of-turn token.
	Truncated bool
	// Env names the environment, for per-env metrics.
	Env string
	// ToolCalls and ToolFailures count the rollout's tool calls.
	ToolCalls, ToolFailures int
	// Forks are further sequences of the same rollout (an agent that
	// rewrote its history): each becomes one more row with the rollout's
	// advantage, after all the samples' own rows.
	Forks []Fork
}

// Fork is one more sequence of a sample's rollout, shaped as a Sample's
// prompt, completion, tool mask and sampler log-probs.
type Fork struct {
	PromptIDs, CompletionIDs []int32
	ToolMask                 []uint8
	SamplerLogprobs          []float32
}

// BuildRows pairs samples with their advantages and applies the loss-mask
// rules of grpo-reference.md §4.2 and §4.12: unscorable rows and, with
// maskTruncated, truncated rows get an all-zero loss mask.
func BuildRows(samples []Sample, adv Advantages, maskTruncated bool) ([]Row, error) {
	if len(adv.A) != len(samples) {
		return nil, fmt.Errorf("build rows: %d samples but %d advantages", len(samples), len(adv.A))
	}
	rows := make([]Row, len(samples))
	var forks []Row
	for i, s := range samples {
		row, err := buildRow(i, Fork{s.PromptIDs, s.CompletionIDs, s.ToolMask, s.SamplerLogprobs}, s, adv.A[i], maskTruncated)
		if err != nil {
			return nil, err
		}
		rows[i] = row
		for _, f := range s.Forks {
			row, err := buildRow(i, f, s, adv.A[i], maskTruncated)
			if err != nil {
				return nil, fmt.Errorf("%w (a fork)", err)
			}
			forks = append(forks, row)
		}
	}
	return append(rows, forks...), nil
}

// buildRow is sample i's sequence seq (its own, or one of its forks) as a
// row with advantage a.
func buildRow(i int, seq Fork, s Sample, a float64, maskTruncated bool) (Row, error) {
	T := len(seq.CompletionIDs)
	if len(seq.ToolMask) != T {
		return Row{}, fmt.Errorf("build rows: sample %d has %d completion tokens but a tool mask of %d", i, T, len(seq.ToolMask))
	}
	if seq.SamplerLogprobs != nil && len(seq.SamplerLogprobs) != T {
		return Row{}, fmt.Errorf("build rows: sample %d has %d completion tokens but %d sampler log-probs", i, T, len(seq.SamplerLogprobs))
	}
	tokens := make([]int32, 0, len(seq.PromptIDs)+T)
	tokens = append(append(tokens, seq.PromptIDs...), seq.CompletionIDs...)
	mask := make([]uint8, T)
	if !isNaN(s.Reward) && !(maskTruncated && s.Truncated) {
		copy(mask, seq.ToolMask)
	}
	return Row{
		Tokens:          tokens,
		PromptLen:       len(seq.PromptIDs),
		LossMask:        mask,
		SamplerLogprobs: seq.SamplerLogprobs,
		Advantage:       float32(a),
	}, nil
}

func isNaN(f float64) bool { return f != f }

// ActiveTokens is N, the number of loss-mask ones over rows.
func ActiveTokens(rows []Row) int {
	n := 0
	for _, r := range rows {
		for _, m := range r.LossMask {
			n += int(m)
		}
	}
	return n
}

// SplitRound shuffles one generation round's rows and cuts them into s
// micro-batches of b rows (grpo-reference.md §1.3). Every micro-batch
// carries the round's token normaliser max(1, N) (P = 1) and the GA divisor.
//
// A round may hold more than s*b rows: the forks of agent rollouts that
// rewrote their history (BuildRows puts them last). They are shuffled with
// the rest and the rows beyond s*b are dealt to the micro-batches in turn,
// so a round without forks splits exactly as before.
func SplitRound(rows []Row, s, b, gradAccum int, rng *rand.Rand) ([]MicroBatch, error) {
	if s < 1 || b < 1 || len(rows) < s*b {
		return nil, fmt.Errorf("split round: %d rows do not fill %d micro-batches of %d", len(rows), s, b)
	}
	perm := rng.Perm(len(rows))
	roundTokens := float64(max(1, ActiveTokens(rows)))
	out := make([]MicroBatch, s)
	for i := range out {
		mb := MicroBatch{Rows: make([]Row, b), RoundTokens: roundTokens, GradAccumSteps: gradAccum}
		for j := range b {
			mb.Rows[j] = rows[perm[i*b+j]]
		}
		out[i] = mb
	}
	for k, p := range perm[s*b:] {
		out[k%s].Rows = append(out[k%s].Rows, rows[p])
	}
	return out, nil
}
