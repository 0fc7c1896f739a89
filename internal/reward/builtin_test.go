package reward

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestOverlongPenalty(t *testing.T) {
	// DAPO: Lmax = 512, Lcache = 64, so the ramp runs over 448 < L <= 512.
	spec := Spec{Name: "overlong", Kind: KindBuiltin, Function: "overlong_penalty", MaxLength: 512, Cache: 64}
	tests := []struct {
		tokens int
		want   float64
	}{
		{0, 0},
		{448, 0},         // Lmax - Lcache: still free
		{449, -1.0 / 64}, // (448-449)/64
		{480, -0.5},      // (448-480)/64
		{512, -1},        // (448-512)/64
		{513, -1},        // beyond Lmax
		{4096, -1},
	}
	set := compile(t, []Spec{spec}, Options{})
	for _, tt := range tests {
		scores, err := set.Score(context.Background(), []Trajectory{{CompletionTokens: tt.tokens}})
		require.NoError(t, err)
		assertFloat(t, tt.want, scores[0].Values[0], "%d tokens", tt.tokens)
	}
}

func TestLengthPenalty(t *testing.T) {
	set := compile(t, []Spec{{Name: "len", Kind: KindBuiltin, Function: "length_penalty", MaxLength: 200}}, Options{})
	for _, tt := range []struct {
		tokens int
		want   float64
	}{{0, 0}, {50, -0.25}, {100, -0.5}, {200, -1}, {300, -1}} {
		scores, err := set.Score(context.Background(), []Trajectory{{CompletionTokens: tt.tokens}})
		require.NoError(t, err)
		assertFloat(t, tt.want, scores[0].Values[0], "%d tokens", tt.tokens)
	}
}

func TestToolCallFormat(t *testing.T) {
	call := []ToolCall{{Name: "submit"}}
	tests := []struct {
		name  string
		turns []Turn
		want  float64
	}{
		{"no turns declines", nil, nan()},
		{"no tool call tried declines", []Turn{{Role: "assistant", Text: "hi"}}, nan()},
		{"all parsed", []Turn{{Role: "assistant", ToolCalls: call}, {Role: "tool"}, {Role: "assistant", ToolCalls: call}}, 1},
		{"one of three failed, plain turn not counted", []Turn{
			{Role: "assistant", ToolCalls: call}, {Role: "tool"},
			{Role: "assistant", FormatError: true},
			{Role: "assistant", ToolCalls: call}, {Role: "tool"},
			{Role: "assistant", Text: "done"},
		}, 2.0 / 3},
		{"only failures", []Turn{{Role: "assistant", FormatError: true}, {Role: "assistant", FormatError: true}}, 0},
		{"tool turns are not assistant turns", []Turn{{Role: "tool", FormatError: true}, {Role: "assistant", ToolCalls: call}}, 1},
	}
	set := compile(t, []Spec{{Name: "format", Kind: KindBuiltin, Function: "tool_call_format"}}, Options{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			scores, err := set.Score(context.Background(), []Trajectory{{Turns: tt.turns}})
			require.NoError(t, err)
			assertFloat(t, tt.want, scores[0].Values[0])
		})
	}
}
