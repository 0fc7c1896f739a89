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
}

// BuildRows pairs samples with their advantages and applies the loss-mask
// rules of grpo-reference.md §4.2 and §4.12: unscorable rows and, with
// maskTruncated, truncated rows get an all-zero loss mask.
func BuildRows(samples []Sample, adv Advantages, maskTruncated bool) ([]Row, error) {
	if len(adv.A) != len(samples) {
		return nil, fmt.Errorf("build rows: %d samples but %d advantages", len(samples), len(adv.A))
	}
	rows := make([]Row, len(samples))
	for i, s := range samples {
		T := len(s.CompletionIDs)
		if len(s.ToolMask) != T {
			return nil, fmt.Errorf("build rows: sample %d has %d completion tokens but a tool mask of %d", i, T, len(s.ToolMask))
		}
		if s.SamplerLogprobs != nil && len(s.SamplerLogprobs) != T {
			return nil, fmt.Errorf("build rows: sample %d has %d completion tokens but %d sampler log-probs", i, T, len(s.SamplerLogprobs))
		}
		tokens := make([]int32, 0, len(s.PromptIDs)+T)
		tokens = append(append(tokens, s.PromptIDs...), s.CompletionIDs...)
		mask := make([]uint8, T)
		if !isNaN(s.Reward) && !(maskTruncated && s.Truncated) {
			copy(mask, s.ToolMask)
		}
		rows[i] = Row{
			Tokens:          tokens,
			PromptLen:       len(s.PromptIDs),
			LossMask:        mask,
			SamplerLogprobs: s.SamplerLogprobs,
			Advantage:       float32(adv.A[i]),
		}
	}
	return rows, nil
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
func SplitRound(rows []Row, s, b, gradAccum int, rng *rand.Rand) ([]MicroBatch, error) {
	if s < 1 || b < 1 || len(rows) != s*b {
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
	return out, nil
}
