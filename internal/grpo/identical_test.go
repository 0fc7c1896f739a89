package grpo

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestIdenticalGroups(t *testing.T) {
	s := func(completion ...int32) Sample {
		return Sample{PromptIDs: []int32{1, 2}, CompletionIDs: completion, Reward: 1}
	}
	failed := Sample{PromptIDs: []int32{0}, CompletionIDs: []int32{0}, Reward: math.NaN()}
	fork := func(base Sample, completion ...int32) Sample {
		base.Forks = []Fork{{PromptIDs: []int32{1}, CompletionIDs: completion}}
		return base
	}
	tests := []struct {
		name    string
		samples []Sample
		g       int
		want    int
	}{
		{"every group the same", []Sample{s(5), s(5), s(6), s(6)}, 2, 2},
		{"one group differs", []Sample{s(5), s(5), s(5), s(6)}, 2, 1},
		{"groups of one never count", []Sample{s(5), s(5)}, 1, 0},
		{"a failed rollout is not the same sample", []Sample{s(5), failed, failed, failed}, 2, 0},
		{"forks differ", []Sample{fork(s(5), 1), fork(s(5), 2)}, 2, 0},
		{"forks the same", []Sample{fork(s(5), 1), fork(s(5), 1)}, 2, 1},
		{"a fork on one side only", []Sample{fork(s(5), 1), s(5)}, 2, 0},
		{"prompts differ", []Sample{s(5), {PromptIDs: []int32{3}, CompletionIDs: []int32{5}, Reward: 1}}, 2, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, IdenticalGroups(tc.samples, tc.g))
		})
	}
}
