package report

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeJSONL writes one JSON line per value.
func writeJSONL(t *testing.T, path string, rows []map[string]any) {
	t.Helper()
	var b bytes.Buffer
	for _, r := range rows {
		line, err := json.Marshal(r)
		require.NoError(t, err)
		b.Write(line)
		b.WriteByte('\n')
	}
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, b.Bytes(), 0o644))
}

// trajectoryLine has the keys of train.TrajectoryRecord's JSON.
func trajectoryLine(step, env, task int, reward, adv float64, prompt, answer string, args any) map[string]any {
	r := reward
	return map[string]any{
		"step": step, "env": env, "split": "train", "task_index": task, "prompt": prompt,
		"turns": []map[string]any{
			{"role": "assistant", "text": answer, "tool_calls": []map[string]any{{"name": "submit", "arguments": args}}},
			{"role": "tool", "text": "score " + answer, "tool": "submit", "reward": r, "finished": true},
		},
		"rewards": []float64{reward}, "reward": reward, "advantage": adv, "outcome": "done",
		"tool_calls": 1, "tool_failures": 0, "format_errors": 0, "prompt_tokens": 20,
		"completion_tokens": 5, "sampled_tokens": 5, "seconds": 0.5,
	}
}

func chartByID(secs []section, id string) *chart {
	for _, s := range secs {
		for i := range s.Charts {
			if s.Charts[i].ID == id {
				return &s.Charts[i]
			}
		}
	}
	return nil
}

func names(c *chart) []string {
	if c == nil {
		return nil
	}
	var out []string
	for _, s := range c.Series {
		out = append(out, s.Name)
	}
	return out
}

func TestBuildSectionsKeySchemes(t *testing.T) {
	tests := []struct {
		name  string
		rows  []map[string]float64
		want  map[string][]string // chart id -> series names; nil = absent
		stdOf map[string]bool     // chart id -> first series has a std band
	}{
		{
			name: "today: rewards/<env>/mean is per env",
			rows: []map[string]float64{
				{"step": 1, "reward": 0.1, "reward_std": 0.05, "rewards/letters/mean": 0.1, "rewards/letters/std": 0.05, "rewards/echo/mean": 0.3},
				{"step": 2, "reward": 0.2, "reward_std": 0.04, "rewards/letters/mean": 0.2, "rewards/letters/std": 0.04, "rewards/echo/mean": 0.4},
			},
			want:  map[string][]string{"reward": {"reward"}, "reward-env": {"echo", "letters"}, "reward-fn": nil},
			stdOf: map[string]bool{"reward": true},
		},
		{
			name: "later: env/<key>/reward_mean per env, rewards/<fn>/mean per function",
			rows: []map[string]float64{
				{"step": 1, "env/letters/reward_mean": 0.1, "env/letters/reward_std": 0.01, "rewards/format/mean": 1, "rewards/format/std": 0, "rewards/correct/mean": 0.2},
			},
			want:  map[string][]string{"reward": nil, "reward-env": {"letters"}, "reward-fn": {"correct", "format"}},
			stdOf: map[string]bool{"reward-env": true},
		},
		{
			name: "time phases: top-level stacked with other, inner phases as lines",
			rows: []map[string]float64{
				{"step": 1, "step_time": 10, "time/rollout": 6, "time/train": 3, "time/sync": 0.5, "time/generation": 40, "time/env": 2, "time/env_busy": 9},
			},
			want: map[string][]string{"time": {"rollout", "sync", "train", "other"}, "time-inside": {"time/env", "time/env_busy", "time/generation"}},
		},
		{
			name: "curriculum and dynamic sampling: the tasks' difficulty over time and what filling rounds cost",
			rows: []map[string]float64{
				{"step": 1, "curriculum/mean_pass_rate": 0.2, "curriculum/too_easy_fraction": 0.1, "curriculum/too_hard_fraction": 0.6, "curriculum/tasks_seen": 8,
					"curriculum/skipped_draws": 2, "dynamic_sampling/groups_generated": 12, "dynamic_sampling/groups_dropped": 8,
					"dynamic_sampling/filled_groups": 0, "dynamic_sampling/extra_rounds": 2, "tokens/generated": 1500, "dynamic_sampling/dropped_tokens": 1000},
				{"step": 2, "curriculum/mean_pass_rate": 0.4, "curriculum/too_easy_fraction": 0.2, "curriculum/too_hard_fraction": 0.3, "curriculum/tasks_seen": 12,
					"curriculum/skipped_draws": 5, "dynamic_sampling/groups_generated": 8, "dynamic_sampling/groups_dropped": 4,
					"dynamic_sampling/filled_groups": 1, "dynamic_sampling/extra_rounds": 1, "tokens/generated": 1000, "dynamic_sampling/dropped_tokens": 500},
			},
			want: map[string][]string{
				"task-difficulty":  {"curriculum/mean_pass_rate", "curriculum/too_easy_fraction", "curriculum/too_hard_fraction"},
				"curriculum-draws": {"curriculum/tasks_seen", "curriculum/skipped_draws"},
				"dynamic-groups":   {"dynamic_sampling/groups_generated", "dynamic_sampling/groups_dropped", "dynamic_sampling/filled_groups", "dynamic_sampling/extra_rounds"},
				"generated-tokens": {"tokens/generated", "dynamic_sampling/dropped_tokens"},
			},
		},
		{
			name: "outcomes, losses and keys nobody claimed",
			rows: []map[string]float64{
				{"step": 3, "rollouts/done": 3, "rollouts/env_error": 1, "loss": 0.1, "kl": 0.01, "entropy": 2, "clip_ratio/low_mean": 0, "grad_norm": 1, "sampling/importance_ratio": 1.1, "num_tokens": 100},
			},
			want: map[string][]string{"outcomes": {"done", "env_error"}, "loss": {"loss"}, "kl": {"kl"}, "entropy": {"entropy"},
				"clip": {"clip_ratio/low_mean"}, "grad-norm": {"grad_norm"}, "other-sampling": {"sampling/importance_ratio"}, "other-num_tokens": {"num_tokens"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			table := &metricsTable{}
			for _, r := range tt.rows {
				table.steps = append(table.steps, r["step"])
				table.rows = append(table.rows, r)
			}
			secs := buildSections(table)
			for id, want := range tt.want {
				assert.Equal(t, want, names(chartByID(secs, id)), id)
			}
			for id, hasStd := range tt.stdOf {
				c := chartByID(secs, id)
				require.NotNil(t, c, id)
				assert.Equal(t, hasStd, c.Series[0].Std != nil, id)
			}
			// Every logged key but step is drawn somewhere.
			drawn := map[string]bool{}
			b := newChartBuilder(table)
			for _, s := range secs {
				for _, c := range s.Charts {
					drawn[c.ID] = true
				}
			}
			assert.NotEmpty(t, drawn)
			for _, k := range b.keys {
				if k == "step_time" {
					// Drawn as the height of the stacked time bars.
					assert.Contains(t, names(chartByID(secs, "time")), "other")
					continue
				}
				assert.True(t, k == "step" || keyDrawn(secs, table, k), "key %s is not drawn", k)
			}
		})
	}
}

// keyDrawn reports whether some series of secs carries key's values.
func keyDrawn(secs []section, table *metricsTable, key string) bool {
	_, ys := table.series(key)
	for _, s := range secs {
		for _, c := range s.Charts {
			for _, se := range c.Series {
				if equalFloats(se.Y, ys) || (se.Std != nil && equalFloats(se.Std, ys)) {
					return true
				}
			}
		}
	}
	return false
}

func equalFloats(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestOtherTimeAddsUpToStep(t *testing.T) {
	step := series{X: []float64{1, 2}, Y: []float64{10, 4}}
	phases := []series{{X: []float64{1, 2}, Y: []float64{6, 3}}, {X: []float64{1}, Y: []float64{3}}}
	assert.Equal(t, []float64{1, 1}, otherTime(step, phases).Y)
	// Phases longer than the step (clock skew) never give negative time.
	assert.Equal(t, []float64{0}, otherTime(series{X: []float64{1}, Y: []float64{1}}, phases[:1]).Y)
}

func TestEachLine(t *testing.T) {
	tests := []struct {
		name        string
		in          string
		max         int
		wantLines   []string
		wantSkipped int
	}{
		{"complete lines", "a\nbb\n", 10, []string{"a", "bb"}, 0},
		{"half-written last line is left for later", "a\n{\"step\":2,", 10, []string{"a"}, 0},
		{"blank lines", "\n\na\n\n", 10, []string{"a"}, 0},
		{"over-long line skipped and counted", "a\n" + strings.Repeat("x", 30) + "\nb\n", 10, []string{"a", "b"}, 1},
		{"line of exactly max", strings.Repeat("y", 10) + "\n", 10, []string{strings.Repeat("y", 10)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			skipped, err := eachLine(context.Background(), strings.NewReader(tt.in), tt.max, func(b []byte) { got = append(got, string(b)) })
			require.NoError(t, err)
			assert.Equal(t, tt.wantLines, got)
			assert.Equal(t, tt.wantSkipped, skipped)
		})
	}
	// Lines longer than the reader's 1 MiB buffer are joined.
	big := strings.Repeat("z", 3<<20)
	var got []string
	skipped, err := eachLine(context.Background(), strings.NewReader(big+"\nq\n"), 4<<20, func(b []byte) { got = append(got, string(b)) })
	require.NoError(t, err)
	assert.Zero(t, skipped)
	require.Len(t, got, 2)
	assert.Equal(t, big, got[0])
}

func TestSpread(t *testing.T) {
	tests := []struct {
		in   []int
		n    int
		want []int
	}{
		{[]int{1, 2, 3}, 5, []int{1, 2, 3}},
		{[]int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 4, []int{1, 4, 7, 10}},
		{[]int{5, 9}, 1, []int{9}},
		{nil, 3, nil},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, spread(tt.in, tt.n), "%v n=%d", tt.in, tt.n)
	}
}

func TestReadMetricsKeepsLastRowOfAStepAndSkipsBadLines(t *testing.T) {
	dir := t.TempDir()
	data := `{"step":2,"loss":1}
not json
{"step":1,"loss":3,"note":"text values are ignored"}
{"step":2,"loss":0.5}
{"step":3,"lo`
	require.NoError(t, os.WriteFile(filepath.Join(dir, metricsFile), []byte(data), 0o644))
	m, err := readMetrics(context.Background(), dir)
	require.NoError(t, err)
	assert.Equal(t, []float64{1, 2}, m.steps)
	xs, ys := m.series("loss")
	assert.Equal(t, []float64{1, 2}, xs)
	assert.Equal(t, []float64{3, 0.5}, ys)
	assert.Equal(t, 1, m.skipped)
	_, hasNote := m.rows[0]["note"]
	assert.False(t, hasNote)
}

func TestTrajectorySampleBestWorstAndBounds(t *testing.T) {
	dir := t.TempDir()
	var rows []map[string]any
	for step := 1; step <= 30; step++ {
		// task 1: rewards 0..0.3 (spread 0.3); task 2: 0.5..0.9 (spread 0.4);
		// task 3: all equal; task 4: one rollout.
		for i := range 4 {
			rows = append(rows, trajectoryLine(step, 0, 1, float64(i)*0.1, 0, "p1", "a", nil))
			rows = append(rows, trajectoryLine(step, 1, 2, 0.5+float64(i)*0.1333, 0, "p2", "b", nil))
			rows = append(rows, trajectoryLine(step, 0, 3, 0.2, 0, "p3", "c", nil))
		}
		rows = append(rows, trajectoryLine(step, 0, 4, 1, 0, "p4", "d", nil))
	}
	writeJSONL(t, filepath.Join(dir, trajectoriesFile), rows)
	m := &manifest{}
	m.Envs = append(m.Envs, struct {
		Target string `json:"target"`
		Name   string `json:"name"`
		Split  string `json:"split"`
	}{Name: "letters"})
	s, err := readTrajectories(context.Background(), dir, m, 5, 2)
	require.NoError(t, err)
	assert.Equal(t, len(rows), s.TotalRuns)
	var steps []int
	for _, ss := range s.Steps {
		steps = append(steps, ss.Step)
		assert.Equal(t, 13, ss.Rollouts)
		assert.Equal(t, 4, ss.AllGroups)
		require.Len(t, ss.Groups, 2)
		g0, g1 := ss.Groups[0], ss.Groups[1]
		assert.Equal(t, 2, g0.TaskIndex, "widest spread first")
		assert.Equal(t, "env 1", g0.Env, "env missing from the manifest is named by index")
		assert.Equal(t, 1, g1.TaskIndex)
		assert.Equal(t, "letters", g1.Env)
		assert.InDelta(t, 0.3, g1.Best.Reward, 1e-9)
		assert.InDelta(t, 0.0, g1.Worst.Reward, 1e-9)
		assert.InDelta(t, 0.15, g1.MeanReward(), 1e-9)
		assert.Equal(t, 4, g1.Size)
	}
	assert.Equal(t, []int{1, 8, 16, 23, 30}, steps)
}

// TestGenerateEscapesModelTextAndStaysBounded: a long run with hostile
// text in prompts, answers, tool arguments and env names gives a page
// that escapes all of it and stays small.
func TestGenerateEscapesModelTextAndStaysBounded(t *testing.T) {
	dir := t.TempDir()
	hostile := `</pre><script>alert("x")</script><img src=x onerror=alert(1)>`
	manifestJSON := `{"model":"m","envs":[{"target":"t","name":"` + strings.ReplaceAll(hostile, `"`, `\"`) + `","split":"train"}]}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, manifestFile), []byte(manifestJSON), 0o644))

	const steps = 5000
	var metrics []map[string]any
	for s := 1; s <= steps; s++ {
		metrics = append(metrics, map[string]any{
			"step": s, "reward": math.Sin(float64(s) / 100), "reward_std": 0.1, "loss": 1 / float64(s),
			"rewards/" + hostile + "/mean": 0.5, "rollouts/done": 30, "rollouts/truncated": 2,
			"time/rollout": 2, "time/train": 1, "step_time": 3.5, "entropy": 2, "grad_norm": 1,
		})
	}
	writeJSONL(t, filepath.Join(dir, metricsFile), metrics)
	var trajs []map[string]any
	long := strings.Repeat("long answer ", 2000)
	for s := 1; s <= 400; s++ {
		answer := "short " + hostile
		if s == 400 {
			answer = long + hostile // the open step shows long texts cut
		}
		for i := range 8 {
			trajs = append(trajs, trajectoryLine(s, 0, s%7, float64(i), float64(i)-3.5, hostile, answer,
				map[string]any{"answer": hostile}))
		}
	}
	writeJSONL(t, filepath.Join(dir, trajectoriesFile), trajs)

	var page bytes.Buffer
	require.NoError(t, Generate(context.Background(), dir, &page, Options{Now: func() time.Time { return time.Unix(0, 0) }}))
	html := page.String()
	assert.False(t, strings.Contains(html, "<script"), "unescaped <script")
	assert.False(t, strings.Contains(html, "<img"), "unescaped <img")
	assert.Contains(t, html, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;")
	assert.Contains(t, html, "more characters]")
	assert.Equal(t, 12, strings.Count(html, `<details class="step"`))
	assert.Equal(t, 1, strings.Count(html, `<details class="step" id="step-400" open>`))
	assert.Less(t, page.Len(), 2<<20, "page bytes for %d steps and %d rollouts", steps, len(trajs))
	t.Logf("page: %d bytes for %d steps, %d rollouts", page.Len(), steps, len(trajs))
	// Tool-call arguments are shown as the model wrote them (not as the
	// trainer's \u003c escapes), on one line, escaped for HTML.
	assert.Contains(t, html, `{&#34;answer&#34;: &#34;&lt;/pre&gt;&lt;script&gt;alert(\&#34;x\&#34;)`, "arguments")
}

func TestGenerateReadsEvals(t *testing.T) {
	dir := t.TempDir()
	writeJSONL(t, filepath.Join(dir, metricsFile), []map[string]any{{"step": 1, "reward": 0.1}})
	writeEval := func(name, body string) {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, evalDir, name), 0o755))
		if body != "" {
			require.NoError(t, os.WriteFile(filepath.Join(dir, evalDir, name, evalResultFile), []byte(body), 0o644))
		}
	}
	writeEval("000020-20261123T100000", `{"checkpoint_step":20,"model":"runs/q/checkpoints/step-000020/model","model_hash":"abc","mean_reward":0.75,
		"pass_at_k":{"1":0.5,"4":0.9},"rollouts":16,"failed_rollouts":1,"seconds":3.5,
		"tasks":[{"env":"letters","mean_reward":0.5},{"env":"letters","mean_reward":1}]}`)
	writeEval("000010-20261123T090000", `{"checkpoint_step":10,"mean_reward":0.25,"pass_at_k":{"1":0.2},"tasks":[]}`)
	writeEval("still-running", "")

	evals, err := readEvals(dir)
	require.NoError(t, err)
	require.Len(t, evals, 2)
	assert.Equal(t, 10, *evals[0].CheckpointStep)
	assert.Equal(t, map[string]float64{"letters": 0.75}, evals[1].envMeans())

	var page bytes.Buffer
	require.NoError(t, Generate(context.Background(), dir, &page, Options{}))
	html := page.String()
	assert.Contains(t, html, `id="plot-eval"`)
	assert.Contains(t, html, "pass@4 = 0.9")
	assert.Contains(t, html, "letters: 0.75")
	assert.Equal(t, 2, strings.Count(html, "<tr><td>0000"))

	writeEval("broken", `{"mean_reward":`)
	err = Generate(context.Background(), dir, &page, Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "decode eval broken")
}

func TestGenerateRejectsNonRunDir(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, metricsFile)
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	for _, path := range []string{t.TempDir(), filepath.Join(dir, "missing"), file} {
		err := Generate(context.Background(), path, &bytes.Buffer{}, Options{})
		require.ErrorIs(t, err, ErrNotRunDir, path)
	}
}

func TestWatchRewritesOnChangeAndStops(t *testing.T) {
	dir := t.TempDir()
	writeJSONL(t, filepath.Join(dir, metricsFile), []map[string]any{{"step": 1, "reward": 0.1}})
	out := filepath.Join(t.TempDir(), "r.html")
	ctx, cancel := context.WithCancel(context.Background())
	writes := make(chan error, 100)
	done := make(chan error, 1)
	go func() {
		done <- Watch(ctx, dir, out, 10*time.Millisecond, Options{RefreshSeconds: 1}, func(err error) { writes <- err })
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	require.NoError(t, <-writes)
	// Nothing changed: no rewrite for several intervals.
	select {
	case err := <-writes:
		t.Fatalf("rewrite without a change: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	writeJSONL(t, filepath.Join(dir, metricsFile), []map[string]any{{"step": 1, "reward": 0.1}, {"step": 2, "reward": 0.3}})
	select {
	case err := <-writes:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("no rewrite after metrics changed")
	}
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Contains(t, string(b), "2 (1 … 2)")
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
		done <- nil
	case <-time.After(10 * time.Second):
		t.Fatal("Watch did not return after cancel")
	}
	assert.Error(t, Watch(context.Background(), dir, out, 0, Options{}, nil))
}

func FuzzReadMetrics(f *testing.F) {
	f.Add([]byte(`{"step":1,"loss":0.5}` + "\n" + `{"step":2,"loss":NaN}` + "\n"))
	f.Add([]byte("\n\n{\"step\":-1e308}\n{"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, metricsFile), data, 0o644))
		m, err := readMetrics(context.Background(), dir)
		require.NoError(t, err)
		require.Len(t, m.rows, len(m.steps))
		for i := 1; i < len(m.steps); i++ {
			require.Less(t, m.steps[i-1], m.steps[i])
		}
		// Whatever was read renders.
		for _, s := range buildSections(m) {
			for _, c := range s.Charts {
				_, err := renderSVG(c)
				require.NoError(t, err)
			}
		}
	})
}

// TestGenerateOnRecordedQuickstartRun renders the real run directory in
// testdata (see its README) so the report's reading of the trainer's files
// is checked without the worker library.
func TestGenerateOnRecordedQuickstartRun(t *testing.T) {
	var page bytes.Buffer
	require.NoError(t, Generate(context.Background(), filepath.Join("testdata", "quickstart-run"), &page, Options{}))
	html := page.String()
	for _, id := range []string{"reward", "reward-env", "outcomes", "tools", "loss", "entropy", "clip", "grad-norm", "lr", "length", "time", "time-inside"} {
		assert.Contains(t, html, `id="plot-`+id+`"`)
	}
	assert.Equal(t, 4, strings.Count(html, `<details class="step"`))
	assert.Contains(t, html, `<details class="step" id="step-4" open>`)
	assert.Contains(t, html, "letters · train task")
	assert.Contains(t, html, "Call the `submit` tool with an answer made only of the letter &#39;a&#39;.")
	assert.Contains(t, html, "letters (builtin:letters, train)")
	assert.Contains(t, html, "<tr><th>rollouts logged</th><td>128</td></tr>")
	// 4 steps × 2 groups, each with its best and worst rollout.
	assert.Equal(t, 8, strings.Count(html, `class="traj best"`))
	assert.Equal(t, 8, strings.Count(html, `class="traj worst"`))
}

func TestTickLabels(t *testing.T) {
	tests := []struct {
		min, max float64
	}{
		{1, 3000},
		{5.7521, 5.7523},
		{0, 1},
		{0.0009, 0.0011},
		{1e-7, 5e-7},
		{0, 4e9},
	}
	for _, tt := range tests {
		var labels []string
		for _, tk := range (distinctTicks{}).Ticks(tt.min, tt.max) {
			if tk.Label == "" {
				continue
			}
			labels = append(labels, tk.Label)
			v, err := strconv.ParseFloat(tk.Label, 64)
			require.NoError(t, err, tk.Label)
			assert.InDelta(t, tk.Value, v, 1e-6*(tt.max-tt.min), "label %q of %g", tk.Label, tk.Value)
			if tt.max < 1e6 && tt.max >= 1e-4 {
				assert.NotContains(t, tk.Label, "e", "plain decimals in [%g, %g]", tt.min, tt.max)
			}
		}
		require.GreaterOrEqual(t, len(labels), 2, "[%g, %g]", tt.min, tt.max)
		seen := map[string]bool{}
		for _, l := range labels {
			assert.False(t, seen[l], "duplicate label %q in [%g, %g]: %v", l, tt.min, tt.max, labels)
			seen[l] = true
		}
		t.Logf("[%g, %g]: %v", tt.min, tt.max, labels)
	}
}

func TestGenerateStopsOnCanceledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := Generate(ctx, filepath.Join("testdata", "quickstart-run"), &bytes.Buffer{}, Options{})
	require.ErrorIs(t, err, context.Canceled)
}
