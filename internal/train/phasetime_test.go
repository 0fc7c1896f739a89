package train

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/rollout"
)

func TestUnionDuration(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	span := func(from, to int) rollout.Span {
		return rollout.Span{Start: t0.Add(time.Duration(from) * time.Second), End: t0.Add(time.Duration(to) * time.Second)}
	}
	tests := []struct {
		name  string
		spans []rollout.Span
		want  time.Duration
	}{
		{"none", nil, 0},
		{"one", []rollout.Span{span(2, 5)}, 3 * time.Second},
		{"disjoint", []rollout.Span{span(0, 1), span(3, 5)}, 3 * time.Second},
		{"overlapping", []rollout.Span{span(0, 4), span(2, 6)}, 6 * time.Second},
		{"nested", []rollout.Span{span(0, 10), span(2, 3), span(4, 9)}, 10 * time.Second},
		{"touching", []rollout.Span{span(0, 2), span(2, 4)}, 4 * time.Second},
		{"unsorted", []rollout.Span{span(8, 9), span(0, 3), span(1, 2), span(2, 5)}, 6 * time.Second},
		{"identical", []rollout.Span{span(1, 4), span(1, 4), span(1, 4)}, 3 * time.Second},
		{"empty and inverted count nothing", []rollout.Span{span(3, 3), span(5, 4), span(0, 1)}, time.Second},
		// 8 concurrent rollouts each generating 10 s in the same 11 s: the
		// summed 80 s is busy time, the wall time is 11 s.
		{"concurrent", []rollout.Span{span(0, 10), span(1, 11), span(0, 10), span(1, 11), span(0, 10), span(1, 11), span(0, 10), span(1, 11)}, 11 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, unionDuration(tt.spans))
		})
	}
}

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
