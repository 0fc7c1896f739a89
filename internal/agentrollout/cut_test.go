package agentrollout

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ortrain/ortrain/internal/gateway"
)

// TestCutSegment: a sequence longer than its prompt plus the completion
// budget is cut there (tokens, mask and log-probs alike), as ortrain's own
// loop never trains past max_completion_length; shorter ones, or no
// budget, are kept whole.
func TestCutSegment(t *testing.T) {
	seg := func() gateway.Segment {
		return gateway.Segment{Tokens: []int32{1, 2, 3, 4, 5, 6}, PromptLen: 2,
			LossMask: []uint8{1, 0, 1, 1}, Logprobs: []float32{-1, 0, -3, -4}}
	}
	for _, tc := range []struct {
		name  string
		limit int
		cut   bool
		want  gateway.Segment
	}{
		{"no budget", 0, false, seg()},
		{"within the budget", 4, false, seg()},
		{"beyond it", 3, true, gateway.Segment{Tokens: []int32{1, 2, 3, 4, 5}, PromptLen: 2, LossMask: []uint8{1, 0, 1}, Logprobs: []float32{-1, 0, -3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := seg()
			assert.Equal(t, tc.cut, cutSegment(&s, tc.limit))
			assert.Equal(t, tc.want, s)
		})
	}
}
