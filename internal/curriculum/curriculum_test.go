package curriculum

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPassRateWindowAndFailures(t *testing.T) {
	s, err := NewSampler([]EnvTasks{{Indices: indices(4), Weight: 1}}, 1, 4, 1, true)
	require.NoError(t, err)
	s.SetCurriculum(Config{Enabled: true, PassThreshold: 0.5, MinPassRate: 0, MaxPassRate: 1, RevisitProbability: 0, Window: 6})
	nan := math.NaN()
	s.Observe([]Outcome{
		{Task: Task{0, 2}, Round: 1, Rewards: []float64{1, 0, 0.5, nan}},
		{Task: Task{0, 3}, Round: 1, Rewards: []float64{nan, nan}},
		{Task: Task{0, 2}, Round: 2, Rewards: []float64{0.2, 0.9, 0.7, 0.1}},
	})
	st := s.State()
	require.Len(t, st.Tasks, 1, "a group of failed rollouts says nothing about its task")
	r := st.Tasks[0]
	assert.Equal(t, "010110", r.Recent, "the last 6 scored rollouts, oldest first (reward >= 0.5 passes)")
	assert.Equal(t, 7, r.Rollouts)
	assert.Equal(t, 2, r.LastRound)
	assert.InDelta(t, 0.5, r.PassRate(), 1e-15)
	assert.InDelta(t, (0+0.5+0.2+0.9+0.7+0.1)/6, r.MeanReward, 1e-15)
	assert.True(t, math.IsNaN(TaskRate{}.PassRate()))
}

// A solved and an unsolvable task are skipped once known; with revisit
// probability 0 never drawn again, with 1 always; unknown tasks are drawn.
func TestCurriculumSkipsOutOfBandTasks(t *testing.T) {
	tests := []struct {
		name    string
		revisit float64
		enabled bool
		wantOut bool // whether the out-of-band tasks are still drawn
	}{
		{"never revisit", 0, true, false},
		{"always revisit", 1, true, true},
		{"curriculum off: rates tracked, nothing skipped", 0, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewSampler([]EnvTasks{{Indices: indices(6), Weight: 1}}, 2, 2, 9, true)
			require.NoError(t, err)
			s.SetCurriculum(Config{Enabled: tc.enabled, PassThreshold: 1, MinPassRate: 0, MaxPassRate: 1, RevisitProbability: tc.revisit, Window: 4})
			s.Observe([]Outcome{
				{Task: Task{0, 0}, Rewards: []float64{1, 1}},   // too easy
				{Task: Task{0, 1}, Rewards: []float64{0, 0}},   // too hard
				{Task: Task{0, 2}, Rewards: []float64{1, 0}},   // in band
				{Task: Task{0, 3}, Rewards: []float64{0, 1.0}}, // in band
			})
			drawn := map[int]int{}
			for range 30 {
				round := s.Next()
				require.Len(t, round, 4, "a round is never short")
				for _, task := range round {
					drawn[task.Index]++
				}
			}
			assert.Equal(t, tc.wantOut, drawn[0] > 0, "task 0 (solved)")
			assert.Equal(t, tc.wantOut, drawn[1] > 0, "task 1 (unsolvable)")
			for _, i := range []int{2, 3, 4, 5} {
				assert.Positive(t, drawn[i], "task %d (in band or unknown)", i)
			}
			assert.Equal(t, tc.enabled && tc.revisit == 0, s.TakeSkipped() > 0)
			m := s.Metrics()
			assert.Equal(t, 4.0, m["curriculum/tasks_seen"])
			assert.Equal(t, 0.25, m["curriculum/too_easy_fraction"])
			assert.Equal(t, 0.25, m["curriculum/too_hard_fraction"])
			assert.Equal(t, 0.5, m["curriculum/mean_pass_rate"])
		})
	}
}

// With every task out of band and no revisits, a round still fills.
func TestCurriculumNeverStarvesARound(t *testing.T) {
	s, err := NewSampler([]EnvTasks{{Indices: indices(3), Weight: 1}}, 2, 1, 1, true)
	require.NoError(t, err)
	s.SetCurriculum(Config{Enabled: true, PassThreshold: 1, MinPassRate: 0, MaxPassRate: 1, RevisitProbability: 0, Window: 4})
	for i := range 3 {
		s.Observe([]Outcome{{Task: Task{0, i}, Rewards: []float64{1}}})
	}
	for range 5 {
		assert.Len(t, s.Next(), 2)
	}
}

// The pass rates travel with the sampler's state (a checkpoint), so a
// resumed sampler skips and draws exactly as the uninterrupted one.
func TestCurriculumResumeIsExact(t *testing.T) {
	mk := func() *Sampler {
		s, err := NewSampler([]EnvTasks{{Indices: indices(7), Weight: 1}, {Indices: indices(5), Weight: 2}}, 3, 2, 42, true)
		require.NoError(t, err)
		s.SetCurriculum(Config{Enabled: true, PassThreshold: 1, MinPassRate: 0, MaxPassRate: 1, RevisitProbability: 0.3, Window: 4})
		return s
	}
	observe := func(s *Sampler, round []Task) {
		for i := 0; i < len(round); i += 2 {
			pass := float64((round[i].Index + round[i].Env) % 2)
			s.Observe([]Outcome{{Task: round[i], Rewards: []float64{pass, pass}}})
		}
	}
	a := mk()
	for range 4 {
		observe(a, a.Next())
	}
	b, err := json.Marshal(a.State())
	require.NoError(t, err)
	var st SamplerState
	require.NoError(t, json.Unmarshal(b, &st))
	var want [][]Task
	for range 6 {
		r := a.Next()
		observe(a, r)
		want = append(want, r)
	}
	c := mk()
	require.NoError(t, c.Restore(st))
	for i, w := range want {
		r := c.Next()
		observe(c, r)
		assert.Equal(t, w, r, "round %d", i)
	}
	assert.Equal(t, a.State(), c.State())
	require.Error(t, c.Restore(SamplerState{Cursors: []int{0, 0}, Epochs: []int{0, 0}, Tasks: []TaskRate{{Env: 2}}}))
}

// A refill sampler is a pure function of the sampler's rates at the time
// and the round: drawing from it changes nothing in the sampler, and two
// refills of the same round draw the same tasks.
func TestRefillIsIndependentAndRepeatable(t *testing.T) {
	s, err := NewSampler([]EnvTasks{{Indices: indices(10), Weight: 1}}, 2, 3, 5, false)
	require.NoError(t, err)
	before := s.State()
	a, b := s.Refill(4), s.Refill(4)
	for range 3 {
		ra, rb := a.Next(), b.Next()
		assert.Equal(t, ra, rb)
		require.Len(t, ra, 6)
	}
	assert.Equal(t, before, s.State())
	assert.NotEqual(t, s.Refill(4).Next(), s.Refill(5).Next(), "each round refills from its own permutation")
	// Observed after the refill was made: the refill does not see it.
	r := s.Refill(1)
	s.Observe([]Outcome{{Task: Task{0, 0}, Rewards: []float64{1, 1}}})
	assert.Empty(t, r.State().Tasks)
}

func TestHasSpreadAndSelectGroups(t *testing.T) {
	nan := math.NaN()
	assert.True(t, HasSpread([]float64{0, 1}))
	assert.False(t, HasSpread([]float64{1, 1, 1}))
	assert.False(t, HasSpread([]float64{1, nan, nan}), "one scored rollout has no spread")
	assert.True(t, HasSpread([]float64{1, nan, 0}))
	assert.False(t, HasSpread(nil))

	groups := [][]float64{{1, 1}, {0, 1}, {0, 0}, {0.5, 1}, {1, 0}, {0, 1}}
	keep, filled := SelectGroups(groups, 3)
	assert.Equal(t, []int{1, 3, 4}, keep, "the first K with a spread, in order")
	assert.Zero(t, filled)
	keep, filled = SelectGroups(groups[:4], 3)
	assert.Equal(t, []int{0, 1, 3}, keep, "short: the first uniform group fills")
	assert.Equal(t, 1, filled)
}

func TestConfigValidate(t *testing.T) {
	ok := DefaultConfig()
	require.NoError(t, ok.Validate())
	tests := []struct {
		field string
		edit  func(*Config)
	}{
		{"min_pass_rate", func(c *Config) { c.MinPassRate = -0.1 }},
		{"max_pass_rate", func(c *Config) { c.MaxPassRate = 0 }},
		{"max_pass_rate", func(c *Config) { c.MinPassRate, c.MaxPassRate = 0.5, 0.4 }},
		{"revisit_probability", func(c *Config) { c.RevisitProbability = 2 }},
		{"window", func(c *Config) { c.Window = 0 }},
		{"pass_threshold", func(c *Config) { c.PassThreshold = math.NaN() }},
	}
	for _, tc := range tests {
		c := DefaultConfig()
		tc.edit(&c)
		var fe *FieldError
		require.True(t, errors.As(c.Validate(), &fe), tc.field)
		assert.Equal(t, tc.field, fe.Field)
	}
}

func TestSnapshotRoundTrips(t *testing.T) {
	dir := t.TempDir()
	want := Snapshot{Step: 3, Envs: []string{"ladder"}, Splits: []string{"train"}, Config: DefaultConfig(),
		Tasks: []TaskRate{{Env: 0, Index: 2, Recent: "0110", Rollouts: 4, MeanReward: 0.5, Rewards: []float64{0, 1, 1, 0}}}}
	b, err := json.Marshal(want)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, SnapshotFile), b, 0o644))
	got, err := ReadSnapshot(dir)
	require.NoError(t, err)
	assert.Equal(t, want, *got)
	_, err = ReadSnapshot(t.TempDir())
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// A refill keeps the envs' mixing weights.
func TestRefillKeepsEnvWeights(t *testing.T) {
	s, err := NewSampler([]EnvTasks{{Indices: indices(40), Weight: 1}, {Indices: indices(40), Weight: 3}}, 10, 1, 3, true)
	require.NoError(t, err)
	r := s.Refill(7)
	counts := [2]int{}
	for range 100 {
		for _, task := range r.Next() {
			counts[task.Env]++
		}
	}
	assert.InDelta(t, 0.75, float64(counts[1])/float64(counts[0]+counts[1]), 0.05)
}
