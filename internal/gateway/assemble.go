package gateway

import "slices"

// Segment is one token sequence to train on, built from consecutive calls
// each of whose prompt continues the previous call's prompt and completion
// token for token.
type Segment struct {
	Tokens    []int32
	PromptLen int // the first call's prompt
	// LossMask has one entry per token after PromptLen: 1 on sampled ids,
	// 0 on prompt ids the agent added between calls (tool results, the next
	// assistant header).
	LossMask []uint8
	// Logprobs has one entry per token after PromptLen: the sampler's
	// log-prob where the mask is 1, 0 where it is 0.
	Logprobs []float32
	// WeightVersions holds each merged call's weight version, in order.
	WeightVersions []int
	Calls          int
}

// Assembly is a rollout's calls as training segments.
type Assembly struct {
	Segments []Segment
	// PrefixBreaks counts the calls that did not continue the segment
	// before them (the agent rewrote, dropped or re-rendered its history
	// differently), each of which started a new segment.
	PrefixBreaks int
}

// Assemble merges calls, in order, into segments. A call whose prompt ids
// start with the current segment's tokens extends it: the extra prompt ids
// get mask 0, the completion ids mask 1 and their log-probs. Any other call
// closes the segment and starts a new one (a prefix break). Text is never
// re-tokenized: only the recorded ids are compared.
func Assemble(calls []Call) Assembly {
	var out Assembly
	var cur *Segment
	for _, c := range calls {
		if cur != nil && hasPrefix(c.PromptIDs, cur.Tokens) {
			added := len(c.PromptIDs) - len(cur.Tokens)
			cur.Tokens = append(cur.Tokens, c.PromptIDs[len(cur.Tokens):]...)
			cur.LossMask = append(cur.LossMask, make([]uint8, added)...)
			cur.Logprobs = append(cur.Logprobs, make([]float32, added)...)
		} else {
			if cur != nil {
				out.Segments = append(out.Segments, *cur)
				out.PrefixBreaks++
			}
			cur = &Segment{Tokens: slices.Clone(c.PromptIDs), PromptLen: len(c.PromptIDs)}
		}
		cur.Tokens = append(cur.Tokens, c.CompletionIDs...)
		for i := range c.CompletionIDs {
			cur.LossMask = append(cur.LossMask, 1)
			lp := float32(0)
			if i < len(c.Logprobs) { // recorded calls always have one per id
				lp = c.Logprobs[i]
			}
			cur.Logprobs = append(cur.Logprobs, lp)
		}
		cur.WeightVersions = append(cur.WeightVersions, c.WeightVersion)
		cur.Calls++
	}
	if cur != nil {
		out.Segments = append(out.Segments, *cur)
	}
	return out
}

func hasPrefix(ids, prefix []int32) bool {
	return len(ids) >= len(prefix) && slices.Equal(ids[:len(prefix)], prefix)
}
