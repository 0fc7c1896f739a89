package report

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
)

// kindSFT is manifest.extra.kind of an `ortrain sft` run.
const kindSFT = "sft"

// sftStats is manifest.extra.details of an SFT run (sft.DataStats): what
// became of the data's rows.
type sftStats struct {
	File      string `json:"file"`
	SHA256    string `json:"sha256"`
	Rows      int    `json:"rows"`
	EvalRows  int    `json:"eval_rows"`
	Skipped   int    `json:"skipped"`
	Truncated int    `json:"truncated"`
	Tokens    int    `json:"tokens"`
	Trained   int    `json:"trained"`
	MaxTokens int    `json:"max_tokens"`
}

// runKind reads manifest.extra: the run's kind ("" for a GRPO run, whose
// manifest has no extra) and, for an SFT run, its data stats (nil when
// the manifest has none or they do not decode).
func (m *manifest) runKind() (kind string, data *sftStats) {
	if m == nil || len(m.Extra) == 0 {
		return "", nil
	}
	var extra struct {
		Kind    string          `json:"kind"`
		Details json.RawMessage `json:"details"`
	}
	if json.Unmarshal(m.Extra, &extra) != nil {
		return "", nil
	}
	if extra.Kind == kindSFT && len(extra.Details) > 0 {
		var s sftStats
		if json.Unmarshal(extra.Details, &s) == nil {
			data = &s
		}
	}
	return extra.Kind, data
}

// isSFT reports whether the run is supervised fine-tuning: the manifest
// says so, or, without a kind in the manifest, the metrics are SFT's
// (token accuracy and no reward).
func isSFT(m *manifest, t *metricsTable) bool {
	if kind, _ := m.runKind(); kind != "" {
		return kind == kindSFT
	}
	return t.logged("mean_token_accuracy") && !t.logged("reward")
}

// buildSFTSections are an SFT run's charts: loss (held-out loss on the
// same axes, so overfitting shows as the lines parting) and token
// accuracy, the optimizer's charts, throughput, then everything else.
func buildSFTSections(t *metricsTable) []section {
	b := newChartBuilder(t)
	var secs []section

	var train []chart
	title := "Loss"
	if t.logged("eval_loss") {
		title = "Loss (training steps and held-out rows)"
	}
	train = appendChart(train, b.lines("loss", title, "cross-entropy per token", "loss", "eval_loss"))
	train = appendChart(train, b.lines("accuracy", "Token accuracy (trained tokens predicted right)", "fraction", "mean_token_accuracy"))
	secs = append(secs, section{Title: "Training", Charts: train})
	secs = append(secs, section{Title: "Optimization", Charts: optimizerCharts(b)})

	var tput []chart
	tput = appendChart(tput, b.lines("tokens-per-second", "Throughput", "tokens per second", "tokens_per_second"))
	tput = appendChart(tput, b.lines("step-time", "Time per step", "seconds", "step_time"))
	// Apart: the running total would flatten the per-step count onto 0.
	tput = appendChart(tput, b.lines("tokens", "Tokens seen so far", "tokens", "num_tokens"))
	tput = appendChart(tput, b.lines("trained-tokens", "Trained tokens per step (those that carry loss)", "tokens", "trained_tokens"))
	secs = append(secs, section{Title: "Throughput", Charts: tput})

	secs = append(secs, section{Title: "Other metrics", Charts: otherCharts(b)})
	return nonEmpty(secs)
}

// sftSummary is the top line of an SFT run: steps and their time, then
// how loss, token accuracy and the held-out loss moved.
func sftSummary(t *metricsTable) string {
	parts := []string{stepsSummary(t)}
	for _, m := range []struct{ key, name string }{
		{"loss", "loss"}, {"mean_token_accuracy", "token accuracy"}, {"eval_loss", "eval loss"},
	} {
		if s := firstLast(t, m.key, m.name); s != "" {
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, " · ")
}

// firstLast is "name first → last" over key's finite values, "name v at
// step s" for one value, "" for none.
func firstLast(t *metricsTable, key, name string) string {
	xs, ys := t.series(key)
	var steps, vals []float64
	for i, y := range ys {
		if !math.IsNaN(y) && !math.IsInf(y, 0) {
			steps, vals = append(steps, xs[i]), append(vals, y)
		}
	}
	switch len(vals) {
	case 0:
		return ""
	case 1:
		return fmt.Sprintf("%s %s at step %s", name, formatNumber(vals[0]), formatNumber(steps[0]))
	}
	return fmt.Sprintf("%s %s → %s", name, formatNumber(vals[0]), formatNumber(vals[len(vals)-1]))
}
