package curriculum

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func indices(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func TestTaskSamplerRepeatsAndCoversEpoch(t *testing.T) {
	s, err := NewSampler([]EnvTasks{{Indices: indices(10), Weight: 1}}, 3, 4, 7, true)
	require.NoError(t, err)
	assert.Equal(t, 3, s.RoundsPerEpoch())
	seen := map[int]int{}
	for range 3 {
		round := s.Next()
		require.Len(t, round, 12)
		for i := 0; i < 12; i += 4 {
			for j := 1; j < 4; j++ {
				assert.Equal(t, round[i], round[i+j], "each task is repeated G times in a row")
			}
			seen[round[i].Index]++
		}
	}
	assert.Len(t, seen, 9, "one epoch draws 9 distinct tasks; the incomplete tail is dropped")
	assert.Equal(t, 0, s.Epoch())
	s.Next()
	assert.Equal(t, 1, s.Epoch(), "the fourth round starts a new permutation")
}

func TestTaskSamplerNoShuffleIsInOrder(t *testing.T) {
	s, err := NewSampler([]EnvTasks{{Indices: []int{5, 6, 7, 8}, Weight: 1}}, 2, 2, 1, false)
	require.NoError(t, err)
	assert.Equal(t, []Task{{0, 5}, {0, 5}, {0, 6}, {0, 6}}, s.Next())
	assert.Equal(t, []Task{{0, 7}, {0, 7}, {0, 8}, {0, 8}}, s.Next())
}

func TestTaskSamplerResumeIsExact(t *testing.T) {
	envs := []EnvTasks{{Indices: indices(7), Weight: 1}, {Indices: indices(5), Weight: 3}}
	a, err := NewSampler(envs, 4, 2, 42, true)
	require.NoError(t, err)
	for range 5 {
		a.Next()
	}
	st := a.State()
	want := [][]Task{a.Next(), a.Next(), a.Next()}

	b, err := NewSampler(envs, 4, 2, 42, true)
	require.NoError(t, err)
	require.NoError(t, b.Restore(st))
	for _, w := range want {
		assert.Equal(t, w, b.Next())
	}
	require.Error(t, b.Restore(SamplerState{Cursors: []int{0}, Epochs: []int{0}}))
}

func TestTaskSamplerMixesByWeight(t *testing.T) {
	s, err := NewSampler([]EnvTasks{{Indices: indices(50), Weight: 1}, {Indices: indices(50), Weight: 3}}, 10, 2, 3, true)
	require.NoError(t, err)
	counts := [2]int{}
	for range 100 {
		for _, r := range s.Next() {
			counts[r.Env]++
		}
	}
	frac := float64(counts[1]) / float64(counts[0]+counts[1])
	assert.InDelta(t, 0.75, frac, 0.05)
}

func TestTaskSamplerErrors(t *testing.T) {
	_, err := NewSampler(nil, 1, 2, 0, true)
	assert.Error(t, err)
	_, err = NewSampler([]EnvTasks{{Weight: 1}}, 1, 2, 0, true)
	assert.Error(t, err)
	_, err = NewSampler([]EnvTasks{{Indices: []int{1}, Weight: 0}}, 1, 2, 0, true)
	assert.Error(t, err)
}
