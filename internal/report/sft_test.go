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

// sftManifest is the manifest.json `ortrain sft` writes.
const sftManifest = `{"ortrain_version":"dev","model":"models/tiny","model_hash":"abc","seed":1,"started_at":"2026-11-24T10:00:00Z",
"extra":{"kind":"sft","details":{"file":"demos.jsonl","sha256":"d3m0","rows":240,"eval_rows":16,"skipped":2,"truncated":3,
"tokens":48000,"trained":9000,"max_tokens":310}}}`

// sftRows are metrics.jsonl rows of an SFT run: 4 steps, eval_loss at
// steps 2 and 4 when withEval.
func sftRows(withEval bool) []map[string]any {
	var rows []map[string]any
	for s := 1; s <= 4; s++ {
		r := map[string]any{
			"step": s, "loss": 2.5 - 0.5*float64(s), "mean_token_accuracy": 0.2 * float64(s), "learning_rate": 1e-4,
			"grad_norm": 1.5, "epoch": 0.25 * float64(s), "num_tokens": 1000 * s, "trained_tokens": 300,
			"step_time": 0.5, "tokens_per_second": 2000,
		}
		if withEval && s%2 == 0 {
			r["eval_loss"] = 2.6 - 0.5*float64(s)
		}
		rows = append(rows, r)
	}
	return rows
}

// TestGenerateSFTRun: an `ortrain sft` run directory (no envs, no
// trajectories) gives a page about loss and token accuracy, with the
// data's facts, and nothing about rewards or rollouts.
func TestGenerateSFTRun(t *testing.T) {
	tests := []struct {
		name        string
		manifest    string // "" for none
		withEval    bool
		wantSummary string
		wantLoss    []string // legend of the loss chart
		wantData    bool
	}{
		{
			name: "with held-out rows", manifest: sftManifest, withEval: true,
			wantSummary: "4 steps in 2s · loss 2 → 0.5 · token accuracy 0.2 → 0.8 · eval loss 1.6 → 0.6",
			wantLoss:    []string{"loss", "eval_loss"}, wantData: true,
		},
		{
			name: "without held-out rows", manifest: sftManifest,
			wantSummary: "4 steps in 2s · loss 2 → 0.5 · token accuracy 0.2 → 0.8",
			wantLoss:    []string{"loss"}, wantData: true,
		},
		{
			name:        "no manifest: told by the metrics",
			wantSummary: "4 steps in 2s · loss 2 → 0.5 · token accuracy 0.2 → 0.8",
			wantLoss:    []string{"loss"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.manifest != "" {
				require.NoError(t, os.WriteFile(filepath.Join(dir, manifestFile), []byte(tt.manifest), 0o644))
			}
			writeJSONL(t, filepath.Join(dir, metricsFile), sftRows(tt.withEval))
			var page bytes.Buffer
			require.NoError(t, Generate(context.Background(), dir, &page, Options{}))
			html := page.String()

			assert.Equal(t, tt.wantSummary, regexp.MustCompile(`<div class="runline" id="run-summary">([^<]*)</div>`).FindStringSubmatch(html)[1])
			assert.Equal(t, tt.wantLoss, legendNames(t, html, "loss"))
			assert.Equal(t, []string{"mean_token_accuracy"}, legendNames(t, html, "accuracy"))
			for id, key := range map[string]string{"grad-norm": "grad_norm", "lr": "learning_rate", "tokens-per-second": "tokens_per_second",
				"step-time": "step_time", "tokens": "num_tokens", "trained-tokens": "trained_tokens"} {
				assert.Equal(t, []string{key}, legendNames(t, html, id))
			}

			if tt.wantData {
				assert.Contains(t, html, "<tr class=\"data\"><th>data</th><td>demos.jsonl<br><small>sha256 d3m0</small></td></tr>")
				assert.Contains(t, html, "<td>240 trained on, 16 held out, 2 skipped, 3 truncated</td>")
				assert.Contains(t, html, "<td>48000 in the training rows, 9000 of them trained, longest row 310</td>")
			}
			assert.Contains(t, html, "supervised fine-tuning")
			// Nothing about rewards, rollouts or trajectories, and no
			// complaint about the trajectories file an SFT run never writes.
			assert.NotContains(t, strings.ToLower(html), "reward")
			for _, absent := range []string{"rollout", "Trajectories", `class="note err"`, "<th>envs</th>"} {
				assert.NotContains(t, html, absent)
			}
		})
	}
}

// TestBuildSFTSections: every key an SFT run logs is drawn, each once.
func TestBuildSFTSections(t *testing.T) {
	table := &metricsTable{}
	for _, r := range sftRows(true) {
		row := map[string]float64{}
		for k, v := range r {
			switch v := v.(type) {
			case int:
				row[k] = float64(v)
			case float64:
				row[k] = v
			}
		}
		table.steps = append(table.steps, row["step"])
		table.rows = append(table.rows, row)
	}
	secs := buildSFTSections(table)
	var titles []string
	for _, s := range secs {
		titles = append(titles, s.Title)
	}
	assert.Equal(t, []string{"Training", "Optimization", "Throughput", "Other metrics"}, titles)
	assert.Equal(t, []string{"epoch"}, names(chartByID(secs, "other-epoch")))
	series := 0
	for _, s := range secs {
		for _, c := range s.Charts {
			series += len(c.Series)
		}
	}
	assert.Equal(t, len(table.keys())-1, series, "one series per key but step")
}

func TestIsSFT(t *testing.T) {
	sftMetrics := &metricsTable{steps: []float64{1}, rows: []map[string]float64{{"step": 1, "loss": 1, "mean_token_accuracy": 0.5}}}
	grpoMetrics := &metricsTable{steps: []float64{1}, rows: []map[string]float64{{"step": 1, "loss": 1, "reward": 0.5}}}
	tests := []struct {
		name  string
		extra string
		t     *metricsTable
		want  bool
	}{
		{"manifest says sft", `{"kind":"sft","details":{"rows":3}}`, &metricsTable{}, true},
		{"manifest says another kind", `{"kind":"distill"}`, sftMetrics, false},
		{"no kind, sft metrics", ``, sftMetrics, true},
		{"no kind, grpo metrics", ``, grpoMetrics, false},
		{"extra of an unknown shape", `[1,2]`, grpoMetrics, false},
		{"details of an unknown shape", `{"kind":"sft","details":"x"}`, grpoMetrics, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &manifest{Extra: []byte(tt.extra)}
			assert.Equal(t, tt.want, isSFT(m, tt.t))
		})
	}
	_, data := (&manifest{Extra: []byte(`{"kind":"sft","details":{"rows":3,"eval_rows":1}}`)}).runKind()
	require.NotNil(t, data)
	assert.Equal(t, sftStats{Rows: 3, EvalRows: 1}, *data)
	assert.False(t, isSFT(nil, grpoMetrics))
}
