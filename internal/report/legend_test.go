package report

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// legendNames are the names in the HTML legend of the figure with id.
func legendNames(t *testing.T, html, id string) []string {
	t.Helper()
	fig := regexp.MustCompile(`(?s)<figure class="plot" id="plot-` + regexp.QuoteMeta(id) + `".*?</figure>`).FindString(html)
	require.NotEmpty(t, fig, "figure %s", id)
	var out []string
	for _, m := range regexp.MustCompile(`</i>([^<]*)</span>`).FindAllStringSubmatch(fig, -1) {
		out = append(out, m[1])
	}
	return out
}

// TestEvalPassAtLabels: the trainer writes pass_at_k keys as "pass@4";
// older files wrote "4". Both read pass@4, sorted by k.
func TestEvalPassAtLabels(t *testing.T) {
	tests := []struct {
		name, passAtK string
	}{
		{"trainer keys", `{"pass@1":0.5,"pass@10":0.9,"pass@2":0.6}`},
		{"bare k", `{"1":0.5,"10":0.9,"2":0.6}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeJSONL(t, filepath.Join(dir, metricsFile), []map[string]any{{"step": 1, "reward": 0.1}})
			for _, step := range []string{"10", "20"} {
				sub := filepath.Join(dir, evalDir, "eval-"+step)
				require.NoError(t, os.MkdirAll(sub, 0o755))
				body := `{"checkpoint_step":` + step + `,"mean_reward":0.3,"pass_at_k":` + tt.passAtK + `}`
				require.NoError(t, os.WriteFile(filepath.Join(sub, evalResultFile), []byte(body), 0o644))
			}
			var page bytes.Buffer
			require.NoError(t, Generate(context.Background(), dir, &page, Options{}))
			html := page.String()
			assert.Equal(t, []string{"mean_reward", "pass@1", "pass@2", "pass@10"}, legendNames(t, html, "eval"))
			// Not assert.Contains: a failure would print the whole page.
			assert.Zero(t, strings.Count(html, "pass@pass@"), "pass@pass@ on the page")
			assert.Equal(t, 2, strings.Count(html, "<td>pass@1 = 0.5<br>pass@2 = 0.6<br>pass@10 = 0.9<br></td>"), "eval table rows")
		})
	}
}

// TestOutcomesLegendListsOnlyOutcomesThatHappened: the trainer logs every
// outcome class, 0 included; the legend names only those that occurred.
func TestOutcomesLegendListsOnlyOutcomesThatHappened(t *testing.T) {
	var page bytes.Buffer
	require.NoError(t, Generate(context.Background(), filepath.Join("testdata", "quickstart-run"), &page, Options{}))
	// The recorded run logs rollouts/unscorable as 0 at every step.
	assert.Equal(t, []string{"done", "truncated"}, legendNames(t, page.String(), "outcomes"))

	dir := t.TempDir()
	var rows []map[string]any
	for step := 1; step <= 3; step++ {
		row := map[string]any{"step": step, "step_time": 10, "time/rollout": 6, "time/train": 4, "time/sync": 0}
		for _, o := range []string{"done", "stopped", "iterations", "truncated", "budget", "env_unreachable", "env_error",
			"timeout", "generation_error", "canceled", "reward_error", "unscorable"} {
			row["rollouts/"+o] = 0
		}
		row["rollouts/done"] = 7
		if step == 2 {
			row["rollouts/timeout"] = 1
		}
		rows = append(rows, row)
	}
	writeJSONL(t, filepath.Join(dir, metricsFile), rows)
	page.Reset()
	require.NoError(t, Generate(context.Background(), dir, &page, Options{}))
	html := page.String()
	assert.Equal(t, []string{"done", "timeout"}, legendNames(t, html, "outcomes"))
	// Time phases that never took time are left out the same way, and the
	// zero outcomes do not reappear under "Other metrics".
	assert.Equal(t, []string{"rollout", "train"}, legendNames(t, html, "time"))
	assert.NotContains(t, html, `id="plot-other-rollouts"`)
}
