package report

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// modelEndings are the outcomes in which the episode ended on the model's
// side (rollout.Outcome.Failed is false): every other outcome is an
// infrastructure failure, and the rollout is left out of the loss. Listed
// this way round, a failure class the trainer adds later is counted as
// failed without a change here (the report does not import the rollout
// package and the worker behind it).
var modelEndings = map[string]bool{
	"done":       true,
	"stopped":    true,
	"iterations": true,
	"truncated":  true,
	"budget":     true,
	"":           true, // no outcome recorded: nothing says it failed
}

// notAnOutcome are rollouts/ metrics that count something other than an
// outcome: rollouts/unscorable (grpo) counts rollouts that also have an
// outcome, so adding it would count them twice.
var notAnOutcome = map[string]bool{"unscorable": true}

// runSummary is the line at the top of the page: steps and their time,
// how the reward moved, and how many rollouts ran and failed.
func runSummary(t *metricsTable, trajs *trajectorySample) string {
	parts := []string{stepsSummary(t)}
	if r := rewardSummary(t); r != "" {
		parts = append(parts, r)
	}
	if r := rolloutSummary(outcomeCounts(t, trajs)); r != "" {
		parts = append(parts, r)
	}
	return strings.Join(parts, " · ")
}

// stepsSummary is "N steps in T", or says that no step was logged.
func stepsSummary(t *metricsTable) string {
	n := len(t.steps)
	if n == 0 {
		return "no steps logged yet"
	}
	s := plural(n, "step")
	if secs, ok := sumFinite(t, "step_time"); ok {
		// The steps' own wall time: startup and evals are not in it.
		s += " in " + formatSeconds(secs)
	}
	return s
}

// rewardSummary is "reward first → last, best B at step S" over the steps
// whose reward is a number; "" when no step logged one.
func rewardSummary(t *metricsTable) string {
	xs, ys := t.series("reward")
	var steps, rewards []float64
	for i, y := range ys {
		if !math.IsNaN(y) && !math.IsInf(y, 0) {
			steps, rewards = append(steps, xs[i]), append(rewards, y)
		}
	}
	if len(rewards) == 0 {
		return ""
	}
	if len(rewards) == 1 {
		return fmt.Sprintf("reward %s at step %s", formatNumber(rewards[0]), formatNumber(steps[0]))
	}
	best := 0
	for i, r := range rewards {
		if r > rewards[best] {
			best = i
		}
	}
	return fmt.Sprintf("reward %s → %s, best %s at step %s", formatNumber(rewards[0]),
		formatNumber(rewards[len(rewards)-1]), formatNumber(rewards[best]), formatNumber(steps[best]))
}

// outcomeCounts is the number of rollouts per outcome over the run: from
// the rollouts/<outcome> metrics, which count every rollout, or else from
// trajectories.jsonl, which is only written with log_completions on.
func outcomeCounts(t *metricsTable, trajs *trajectorySample) map[string]int {
	counts := map[string]int{}
	for _, k := range t.keys() {
		name, ok := strings.CutPrefix(k, "rollouts/")
		if !ok || notAnOutcome[name] {
			continue
		}
		if sum, ok := sumFinite(t, k); ok {
			counts[name] += int(math.Round(sum))
		}
	}
	if len(counts) > 0 || trajs == nil {
		return counts
	}
	return trajs.Outcomes
}

// rolloutSummary is "N rollouts, F failed (outcome n, …)"; "" for none.
func rolloutSummary(counts map[string]int) string {
	total, failed := 0, 0
	var why []string
	for o, n := range counts {
		total += n
		if !modelEndings[o] && n > 0 {
			failed += n
			why = append(why, fmt.Sprintf("%s %d", o, n))
		}
	}
	if total == 0 {
		return ""
	}
	s := fmt.Sprintf("%s, %d failed", plural(total, "rollout"), failed)
	if len(why) > 0 {
		sort.Strings(why)
		s += " (" + strings.Join(why, ", ") + ")"
	}
	return s
}

// sumFinite adds key's finite values; ok is false when key has none.
func sumFinite(t *metricsTable, key string) (sum float64, ok bool) {
	_, ys := t.series(key)
	for _, y := range ys {
		if !math.IsNaN(y) && !math.IsInf(y, 0) {
			sum, ok = sum+y, true
		}
	}
	return sum, ok
}

// formatSeconds writes a duration the way people read it: 850ms, 12.3s,
// 1h2m3s.
func formatSeconds(secs float64) string {
	d := time.Duration(secs * float64(time.Second))
	switch {
	case d < time.Second:
		d = d.Round(time.Millisecond)
	case d < time.Minute:
		d = d.Round(100 * time.Millisecond)
	default:
		d = d.Round(time.Second)
	}
	return d.String()
}

// plural is "1 step", "2 steps".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
