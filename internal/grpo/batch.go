package grpo

// Row is one completion ready for the worker: the prompt and completion
// tokens as one sequence, the loss mask over the completion, and everything
// the loss needs per token. Shapes: P = PromptLen, T = len(Tokens) - P.
type Row struct {
	// Tokens is prompt followed by completion (tool turns included). The
	// completion part is exactly what was sampled and rendered, never
	// re-tokenised.
	Tokens    []int32
	PromptLen int
	// LossMask has length T: 1 on tokens the policy sampled (its end-of-turn
	// token included), 0 on tool output and template glue, and all 0 for a
	// truncated completion when mask_truncated_completions is on.
	LossMask []uint8
	// SamplerLogprobs has length T (0 where the sampler did not produce the
	// token) or is nil when the sampler reported none (vLLM IS correction off).
	SamplerLogprobs []float32
	// OldLogprobs has length T, or is nil: then pi_old = sg(pi_theta) and the
	// ratio is exactly 1 (on-policy, grpo-reference.md §1.3).
	OldLogprobs []float32
	// RefLogprobs has length T, or is nil when beta = 0.
	RefLogprobs []float32
	// Advantage is broadcast over the row's tokens.
	Advantage float32
}

// CompletionLen is T, the number of completion positions.
func (r Row) CompletionLen() int { return len(r.Tokens) - r.PromptLen }

// MicroBatch is one forward/backward pass of the worker.
type MicroBatch struct {
	Rows []Row
	// RoundTokens is max(1, N)/P: the active-token count of the whole
	// generation round divided by the number of processes, the normaliser of
	// dapo, cispo and vespo (grpo-reference.md §4.2, §4.6).
	RoundTokens float64
	// GradAccumSteps is the divisor of the other loss types (GA).
	GradAccumSteps int
}
