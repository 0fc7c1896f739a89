package reward

import (
	"math"
	"sort"
)

// builtin is one named function of kind builtin.
type builtin struct {
	usesLength, usesCache bool
	score                 func(s Spec, t *Trajectory) float64
}

// builtins maps function names to their definitions. It is never written
// after initialisation.
var builtins = map[string]builtin{
	"overlong_penalty": {usesLength: true, usesCache: true, score: overlongPenalty},
	"tool_call_format": {score: toolCallFormat},
	"length_penalty":   {usesLength: true, score: lengthPenalty},
}

func builtinNames() []string {
	names := make([]string, 0, len(builtins))
	for n := range builtins {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// overlongPenalty is DAPO's soft overlong punishment (Yu et al. 2025,
// arXiv:2503.14476, "Soft Overlong Punishment") with L = completion tokens, Lmax = max_length, Lcache = cache:
// 0 while L <= Lmax-Lcache, then (Lmax-Lcache-L)/Lcache falling linearly
// to -1 at L = Lmax, and -1 beyond.
func overlongPenalty(s Spec, t *Trajectory) float64 {
	l, limit, cache := t.CompletionTokens, s.MaxLength, s.Cache
	switch {
	case l <= limit-cache:
		return 0
	case l <= limit:
		return float64(limit-cache-l) / float64(cache)
	}
	return -1
}

// toolCallFormat is the fraction of the assistant turns that wrote a tool
// call (parsed or not) whose calls all parsed. A rollout that never tried a
// tool call declines (NaN), so it neither gains nor loses.
func toolCallFormat(_ Spec, t *Trajectory) float64 {
	tried, parsed := 0, 0
	for _, turn := range t.Turns {
		if turn.Role != "assistant" || (len(turn.ToolCalls) == 0 && !turn.FormatError) {
			continue
		}
		tried++
		if !turn.FormatError {
			parsed++
		}
	}
	if tried == 0 {
		return math.NaN()
	}
	return float64(parsed) / float64(tried)
}

// lengthPenalty is -min(1, L/max_length) for L completion tokens: 0 for an
// empty completion, falling linearly to -1 at max_length and staying there.
func lengthPenalty(s Spec, t *Trajectory) float64 {
	return -math.Min(1, float64(t.CompletionTokens)/float64(s.MaxLength))
}
