package report

import (
	"bytes"
	"context"
	"math"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRunSummary(t *testing.T) {
	tests := []struct {
		name     string
		rows     []map[string]float64
		outcomes map[string]int // counted from trajectories.jsonl
		want     string
	}{
		{
			name: "several steps, failures named",
			rows: []map[string]float64{
				{"step": 1, "step_time": 30, "reward": 0.2, "rollouts/done": 6, "rollouts/env_error": 2, "rollouts/truncated": 0, "rollouts/unscorable": 1},
				{"step": 2, "step_time": 45.5, "reward": 0.7, "rollouts/done": 7, "rollouts/timeout": 1},
				{"step": 3, "step_time": 3600, "reward": 0.5, "rollouts/done": 8, "rollouts/env_error": 0},
			},
			outcomes: map[string]int{"done": 99},
			want:     "3 steps in 1h1m16s · reward 0.2 → 0.5, best 0.7 at step 2 · 24 rollouts, 3 failed (env_error 2, timeout 1)",
		},
		{
			name: "one step",
			rows: []map[string]float64{{"step": 1, "step_time": 0.25, "reward": 1, "rollouts/done": 1}},
			want: "1 step in 250ms · reward 1 at step 1 · 1 rollout, 0 failed",
		},
		{
			name: "unscored steps and no step time",
			rows: []map[string]float64{{"step": 5, "reward": math.NaN()}, {"step": 6, "reward": 0.25}, {"step": 7, "reward": math.NaN()}},
			want: "3 steps · reward 0.25 at step 6",
		},
		{
			name:     "no metrics: rollouts from trajectories",
			outcomes: map[string]int{"done": 3, "reward_error": 1, "render_error": 2, "stopped": 1},
			want:     "no steps logged yet · 7 rollouts, 3 failed (render_error 2, reward_error 1)",
		},
		{
			name: "nothing logged",
			want: "no steps logged yet",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			table := &metricsTable{}
			for _, r := range tt.rows {
				table.steps = append(table.steps, r["step"])
				table.rows = append(table.rows, r)
			}
			assert.Equal(t, tt.want, runSummary(table, &trajectorySample{Outcomes: tt.outcomes}))
		})
	}
}

// TestGenerateShowsRunSummary: the line is at the top of the page, read
// from the recorded run's files.
func TestGenerateShowsRunSummary(t *testing.T) {
	var page bytes.Buffer
	require.NoError(t, Generate(context.Background(), filepath.Join("testdata", "quickstart-run"), &page, Options{}))
	html := page.String()
	const want = `<div class="runline" id="run-summary">4 steps in 1m33s · reward 0.0104 → 0.007999, best 0.0104 at step 1 · 128 rollouts, 0 failed</div>`
	at := strings.Index(html, want)
	require.NotEqual(t, -1, at, "summary line %s", regexp.MustCompile(`<div class="runline".*`).FindString(html))
	assert.Less(t, at, strings.Index(html, "<main>"), "summary in the header")

	// A run directory with only a manifest (a run still starting).
	dir := t.TempDir()
	writeJSONL(t, filepath.Join(dir, manifestFile), []map[string]any{{"model": "m"}})
	page.Reset()
	require.NoError(t, Generate(context.Background(), dir, &page, Options{}))
	assert.Equal(t, `<div class="runline" id="run-summary">no steps logged yet</div>`,
		regexp.MustCompile(`<div class="runline".*`).FindString(page.String()))
}
