package report

import (
	"sort"
	"strings"
)

// chartKind says how a chart draws its series.
type chartKind int

const (
	chartLines   chartKind = iota // one line per series, optional ± std band
	chartStacked                  // stacked bars per step
)

// chart is one plot of the report, built from metric keys.
type chart struct {
	ID     string
	Title  string
	YLabel string
	Kind   chartKind
	Series []series
}

// series is one named line (or bar layer) of a chart.
type series struct {
	Name string
	X, Y []float64
	Std  []float64 // same length as Y where present: draws mean ± std
}

// section groups charts under a heading.
type section struct {
	Title  string
	Note   string
	Charts []chart
}

// chartBuilder builds charts from a metrics table and remembers which keys
// were used, so every key nobody claimed still gets a chart at the end.
type chartBuilder struct {
	t    *metricsTable
	keys []string
	used map[string]bool
}

func newChartBuilder(t *metricsTable) *chartBuilder {
	return &chartBuilder{t: t, keys: t.keys(), used: map[string]bool{"step": true}}
}

// line returns the series of key (and key's std series if stdKey is set)
// and marks both used; ok is false when key was never logged.
func (b *chartBuilder) line(name, key, stdKey string) (series, bool) {
	xs, ys := b.t.series(key)
	if len(xs) == 0 {
		return series{}, false
	}
	b.used[key] = true
	s := series{Name: name, X: xs, Y: ys}
	if stdKey != "" && b.t.logged(stdKey) {
		b.used[stdKey] = true
		s.Std = make([]float64, len(xs))
		for i, x := range xs {
			s.Std[i] = b.t.at(x, stdKey)
		}
	}
	return s, true
}

// lines is a chart with one line per key that was logged; nil if none was.
func (b *chartBuilder) lines(id, title, ylabel string, keys ...string) *chart {
	c := &chart{ID: id, Title: title, YLabel: ylabel}
	for _, k := range keys {
		if s, ok := b.line(k, k, ""); ok {
			c.Series = append(c.Series, s)
		}
	}
	if len(c.Series) == 0 {
		return nil
	}
	return c
}

// withPrefix returns the unused keys starting with prefix, sorted.
func (b *chartBuilder) withPrefix(prefix string) []string {
	var out []string
	for _, k := range b.keys {
		if strings.HasPrefix(k, prefix) && !b.used[k] {
			out = append(out, k)
		}
	}
	return out
}

// meanStd finds pairs <prefix><name><meanSuffix> / <prefix><name><stdSuffix>
// and returns one mean ± std series per name.
func (b *chartBuilder) meanStd(prefix, meanSuffix, stdSuffix string) []series {
	var out []series
	for _, k := range b.withPrefix(prefix) {
		if !strings.HasSuffix(k, meanSuffix) {
			continue
		}
		name := strings.TrimSuffix(strings.TrimPrefix(k, prefix), meanSuffix)
		if name == "" || strings.Contains(name, "/") {
			continue
		}
		if s, ok := b.line(name, k, prefix+name+stdSuffix); ok {
			out = append(out, s)
		}
	}
	return out
}

func appendChart(cs []chart, c *chart) []chart {
	if c == nil {
		return cs
	}
	return append(cs, *c)
}

// timePhasesInsideRollout are time/* keys measured inside the rollout phase
// (or summed across concurrent rollouts): they overlap time/rollout, so they
// are drawn as lines, not stacked onto it.
func insideRollout(name string) bool {
	return name == "generation" || name == "env" || strings.HasSuffix(name, "_busy")
}

// buildSections turns the metrics into the report's charts. Key schemes:
//   - reward and reward_std: the run's reward, mean ± std;
//   - per env: env/<key>/reward_mean with env/<key>/reward_std; where no
//     env/ keys exist, rewards/<name>/mean with /std are per env (today's
//     scheme), otherwise they are per reward function;
//   - rollouts/<outcome>: outcome counts, stacked;
//   - time/<phase>: stacked per step, except phases inside the rollout;
//   - every other key: grouped by its first path element.
func buildSections(t *metricsTable) []section {
	b := newChartBuilder(t)
	var secs []section

	var rewards []chart
	if s, ok := b.line("reward", "reward", "reward_std"); ok {
		rewards = append(rewards, chart{ID: "reward", Title: "Reward (mean ± std over the step's rollouts)", YLabel: "reward", Series: []series{s}})
	}
	perEnv := b.meanStd("env/", "/reward_mean", "/reward_std")
	rewardsPrefix := b.meanStd("rewards/", "/mean", "/std")
	perFn := []series(nil)
	if len(perEnv) == 0 {
		perEnv = rewardsPrefix
	} else {
		perFn = rewardsPrefix
	}
	if len(perEnv) > 0 {
		rewards = append(rewards, chart{ID: "reward-env", Title: "Reward per env (mean ± std)", YLabel: "reward", Series: perEnv})
	}
	if len(perFn) > 0 {
		rewards = append(rewards, chart{ID: "reward-fn", Title: "Reward per reward function (mean ± std)", YLabel: "reward", Series: perFn})
	}
	rewards = appendChart(rewards, b.lines("reward-zero-std", "Groups with zero reward std", "fraction", "frac_reward_zero_std"))
	secs = append(secs, section{Title: "Rewards", Charts: rewards})
	if tasks := taskCharts(b); len(tasks) > 0 {
		secs = append(secs, section{Title: "Tasks", Charts: tasks,
			Note: "The curriculum's view of the tasks tried so far (each task's pass rate over its recent rollouts: too easy at or above max_pass_rate, too hard at or below min_pass_rate), and what DAPO dynamic sampling generated to fill each round."})
	}

	var outcomes []chart
	if keys := b.withPrefix("rollouts/"); len(keys) > 0 {
		c := chart{ID: "outcomes", Title: "Rollout outcomes per step", YLabel: "rollouts", Kind: chartStacked}
		for _, k := range keys {
			s, _ := b.line(strings.TrimPrefix(k, "rollouts/"), k, "")
			c.Series = appendLayer(c.Series, s)
		}
		if len(c.Series) > 0 {
			outcomes = append(outcomes, c)
		}
	}
	outcomes = appendChart(outcomes, b.lines("tools", "Tool calls", "per rollout / count", b.withPrefix("tools/")...))
	secs = append(secs, section{Title: "Rollouts", Charts: outcomes})

	var opt []chart
	opt = appendChart(opt, b.lines("loss", "Loss", "loss", "loss"))
	opt = appendChart(opt, b.lines("kl", "KL to the reference", "kl", "kl"))
	opt = appendChart(opt, b.lines("entropy", "Entropy", "nats per token", "entropy"))
	opt = appendChart(opt, b.lines("clip", "Clip ratios", "fraction", append(b.withPrefix("clip_ratio/"), "cispo_clip_ratio")...))
	opt = append(opt, optimizerCharts(b)...)
	secs = append(secs, section{Title: "Optimization", Charts: opt})

	var comp []chart
	comp = appendChart(comp, b.lines("length", "Completion length", "tokens",
		"completions/mean_length", "completions/min_length", "completions/max_length",
		"completions/mean_terminated_length"))
	comp = appendChart(comp, b.lines("length-other", "Completions: other", "",
		b.withPrefix("completions/")...))
	secs = append(secs, section{Title: "Completions", Charts: comp})

	var timing []chart
	var stacked, inside []string
	for _, k := range b.withPrefix("time/") {
		if insideRollout(strings.TrimPrefix(k, "time/")) {
			inside = append(inside, k)
		} else {
			stacked = append(stacked, k)
		}
	}
	if len(stacked) > 0 {
		c := chart{ID: "time", Title: "Time per step by phase", YLabel: "seconds", Kind: chartStacked}
		for _, k := range stacked {
			s, _ := b.line(strings.TrimPrefix(k, "time/"), k, "")
			c.Series = appendLayer(c.Series, s)
		}
		if st, ok := b.line("step_time", "step_time", ""); ok {
			c.Series = appendLayer(c.Series, otherTime(st, c.Series))
		}
		if len(c.Series) > 0 {
			timing = append(timing, c)
		}
	}
	timing = appendChart(timing, b.lines("time-inside", "Inside the rollout phase", "seconds", inside...))
	secs = append(secs, section{Title: "Time", Note: "Stacked phases add up to step_time; \"other\" is the rest of the step. Generation and env time are measured inside the rollout phase and drawn separately.", Charts: timing})

	secs = append(secs, section{Title: "Other metrics", Charts: otherCharts(b)})
	return nonEmpty(secs)
}

// optimizerCharts are the charts every trainer's optimizer step logs.
func optimizerCharts(b *chartBuilder) []chart {
	var opt []chart
	opt = appendChart(opt, b.lines("grad-norm", "Gradient norm (before clipping)", "norm", "grad_norm"))
	opt = appendChart(opt, b.lines("lr", "Learning rate", "lr", "learning_rate"))
	return opt
}

// otherCharts draws every key not claimed yet, grouped by its first path
// element, so a metric the report does not know is still shown.
func otherCharts(b *chartBuilder) []chart {
	groups := map[string][]string{}
	for _, k := range b.keys {
		if b.used[k] {
			continue
		}
		head, _, _ := strings.Cut(k, "/")
		groups[head] = append(groups[head], k)
	}
	heads := make([]string, 0, len(groups))
	for h := range groups {
		heads = append(heads, h)
	}
	sort.Strings(heads)
	var other []chart
	for _, h := range heads {
		other = appendChart(other, b.lines("other-"+h, h, "", groups[h]...))
	}
	return other
}

// nonEmpty drops the sections without charts.
func nonEmpty(secs []section) []section {
	out := secs[:0]
	for _, s := range secs {
		if len(s.Charts) > 0 {
			out = append(out, s)
		}
	}
	return out
}

// appendLayer adds s to a stacked chart's layers unless it is zero at
// every step: the trainer logs every outcome class, 0 included, and a
// layer that draws nothing (bars draw positive values only) would only
// crowd the legend.
func appendLayer(layers []series, s series) []series {
	for _, y := range s.Y {
		if y > 0 {
			return append(layers, s)
		}
	}
	return layers
}

// otherTime is step_time minus the stacked phases at each step (never
// negative), so the stack adds up to the step.
func otherTime(step series, phases []series) series {
	o := series{Name: "other", X: step.X, Y: make([]float64, len(step.X))}
	for i, x := range step.X {
		rest := step.Y[i]
		for _, p := range phases {
			rest -= valueAt(p, x)
		}
		o.Y[i] = max(rest, 0)
	}
	return o
}

// valueAt is s's value at step x, 0 where s was not logged.
func valueAt(s series, x float64) float64 {
	i := sort.SearchFloat64s(s.X, x)
	if i < len(s.X) && s.X[i] == x {
		return s.Y[i]
	}
	return 0
}

// taskCharts are the curriculum's and dynamic sampling's charts: the
// tasks' difficulty over time, the draws the curriculum skipped, the
// groups generated, dropped and filled, and the tokens they cost.
func taskCharts(b *chartBuilder) []chart {
	var out []chart
	out = appendChart(out, b.lines("task-difficulty", "Task difficulty (tasks tried so far)", "fraction",
		"curriculum/mean_pass_rate", "curriculum/too_easy_fraction", "curriculum/too_hard_fraction"))
	out = appendChart(out, b.lines("curriculum-draws", "Curriculum draws", "tasks", "curriculum/tasks_seen", "curriculum/skipped_draws"))
	out = appendChart(out, b.lines("dynamic-groups", "Dynamic sampling: groups per round", "groups",
		"dynamic_sampling/groups_generated", "dynamic_sampling/groups_dropped", "dynamic_sampling/filled_groups", "dynamic_sampling/extra_rounds"))
	out = appendChart(out, b.lines("generated-tokens", "Generated completion tokens", "tokens", "tokens/generated", "dynamic_sampling/dropped_tokens"))
	return out
}
