package train

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/rollout"
)

func TestStepMetricsPhaseTimes(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	traj := func(gen, env [][2]float64) *rollout.Trajectory {
		tr := &rollout.Trajectory{Outcome: rollout.OutcomeDone}
		for _, g := range gen {
			tr.GenSpans = append(tr.GenSpans, rollout.Span{Start: at(g[0]), End: at(g[1])})
			tr.GenTime += at(g[1]).Sub(at(g[0]))
		}
		for _, e := range env {
			tr.EnvSpans = append(tr.EnvSpans, rollout.Span{Start: at(e[0]), End: at(e[1])})
			tr.EnvTime += at(e[1]).Sub(at(e[0]))
		}
		return tr
	}
	m := StepMetrics{Extra: map[string]float64{}}
	// Two rollouts in parallel: generate 0–2 and 1–3, env 2–2.5 and 3–4.
	var first roundStats
	first.addPhaseTimes([]*rollout.Trajectory{
		traj([][2]float64{{0, 2}}, [][2]float64{{2, 2.5}}),
		traj([][2]float64{{1, 3}}, [][2]float64{{3, 4}}),
	})
	first.Outcomes = map[string]int{"done": 2}
	m.addRound(first)
	// A second round in the same step, overlapping nothing of the first.
	var second roundStats
	second.addPhaseTimes([]*rollout.Trajectory{traj([][2]float64{{10, 11}}, nil)})
	second.Outcomes = map[string]int{"done": 2}
	m.addRound(second)

	got := m.Map()
	assert.InDelta(t, 4.0, got["time/generation"], 1e-9)
	assert.InDelta(t, 5.0, got["time/generation_busy"], 1e-9)
	assert.InDelta(t, 1.5, got["time/env"], 1e-9)
	assert.InDelta(t, 1.5, got["time/env_busy"], 1e-9)

	for _, o := range rollout.Outcomes() {
		key := "rollouts/" + string(o)
		require.Contains(t, got, key)
		if o == rollout.OutcomeDone {
			assert.Equal(t, 2.0, got[key])
		} else {
			assert.Zero(t, got[key], key)
		}
	}
}
