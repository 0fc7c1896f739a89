package report

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	_ "embed"
)

//go:embed report.html.tmpl
var pageTemplate string

// Options bound and shape the report. Zero values take the defaults.
type Options struct {
	// SampledSteps is how many steps show trajectories (spread over the
	// run, always the last). Default 12.
	SampledSteps int
	// GroupsPerStep is how many groups each sampled step shows, those
	// whose rewards differ most first. Default 2.
	GroupsPerStep int
	// MaxTextRunes cuts any one prompt, message or tool result. Default 2000.
	MaxTextRunes int
	// RefreshSeconds > 0 makes the page reload itself (for --watch).
	RefreshSeconds int
	// Now stamps the page; default time.Now.
	Now func() time.Time
}

func (o Options) withDefaults() Options {
	if o.SampledSteps <= 0 {
		o.SampledSteps = 12
	}
	if o.GroupsPerStep <= 0 {
		o.GroupsPerStep = 2
	}
	if o.MaxTextRunes <= 0 {
		o.MaxTextRunes = 2000
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// ErrNotRunDir means the directory holds none of a run's files.
var ErrNotRunDir = errors.New("not a run directory")

// renderedChart is a chart ready for the page.
type renderedChart struct {
	ID     string
	Title  string
	SVG    template.HTML
	Legend []legendEntry
}

type renderedSection struct {
	Title  string
	Note   string
	Charts []renderedChart
}

// pageData is what the template renders.
type pageData struct {
	RunDir       string
	Generated    string
	Refresh      int
	Manifest     *manifest
	Summary      string // one line: steps, time, reward, rollouts
	Steps        int
	FirstStep    float64
	LastStep     float64
	Sections     []renderedSection
	Evals        []evalRun
	EvalChart    *renderedChart
	Trajectories *trajectorySample
	Notes        []string
	// SFT: a supervised fine-tuning run, with no rewards or rollouts;
	// Data is what became of its rows (nil when the manifest lacks it).
	SFT  bool
	Data *sftStats
}

// Generate reads the run directory runDir and writes the HTML report to w.
func Generate(ctx context.Context, runDir string, w io.Writer, opts Options) error {
	opts = opts.withDefaults()
	if err := checkRunDir(runDir); err != nil {
		return err
	}
	m, err := readManifest(runDir)
	if err != nil {
		return err
	}
	metrics, err := readMetrics(ctx, runDir)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	trajs, err := readTrajectories(ctx, runDir, m, opts.SampledSteps, opts.GroupsPerStep)
	if err != nil {
		return err
	}
	evals, err := readEvals(runDir)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}

	data := pageData{
		RunDir: runDir, Generated: opts.Now().UTC().Format(time.RFC3339), Refresh: opts.RefreshSeconds,
		Manifest: m, Steps: len(metrics.steps), Trajectories: trajs, Evals: evals,
		SFT: isSFT(m, metrics),
	}
	sections := buildSections
	if data.SFT {
		_, data.Data = m.runKind()
		data.Summary, sections = sftSummary(metrics), buildSFTSections
	} else {
		data.Summary = runSummary(metrics, trajs)
	}
	if n := len(metrics.steps); n > 0 {
		data.FirstStep, data.LastStep = metrics.steps[0], metrics.steps[n-1]
	}
	if metrics.skipped > 0 {
		data.Notes = append(data.Notes, fmt.Sprintf("%d lines of %s could not be read and were skipped.", metrics.skipped, metricsFile))
	}
	if trajs.Skipped > 0 {
		data.Notes = append(data.Notes, fmt.Sprintf("%d lines of %s could not be read and were skipped.", trajs.Skipped, trajectoriesFile))
	}
	for _, s := range sections(metrics) {
		rs := renderedSection{Title: s.Title, Note: s.Note}
		for _, c := range s.Charts {
			svg, err := renderSVG(c)
			if err != nil {
				return err
			}
			// The SVG comes from gonum's writer, which escapes all text.
			rs.Charts = append(rs.Charts, renderedChart{ID: c.ID, Title: c.Title, SVG: template.HTML(svg), Legend: legendOf(c)})
		}
		data.Sections = append(data.Sections, rs)
	}
	if c := evalChart(evals); c != nil {
		svg, err := renderSVG(*c)
		if err != nil {
			return err
		}
		data.EvalChart = &renderedChart{ID: c.ID, Title: c.Title, SVG: template.HTML(svg), Legend: legendOf(*c)}
	}

	tmpl, err := template.New("report").Funcs(templateFuncs(opts.MaxTextRunes)).Parse(pageTemplate)
	if err != nil {
		return fmt.Errorf("parse report template: %w", err)
	}
	if err := tmpl.Execute(w, data); err != nil {
		return fmt.Errorf("render report: %w", err)
	}
	return nil
}

func checkRunDir(dir string) error {
	st, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: %s does not exist", ErrNotRunDir, dir)
	}
	if err != nil {
		return fmt.Errorf("open run directory: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("%w: %s is a file", ErrNotRunDir, dir)
	}
	for _, f := range []string{metricsFile, trajectoriesFile, manifestFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			return nil
		}
	}
	return fmt.Errorf("%w: %s has no %s, %s or %s", ErrNotRunDir, dir, metricsFile, trajectoriesFile, manifestFile)
}

// evalChart plots the evals that name their checkpoint step: mean reward
// and pass@k against the step.
func evalChart(evals []evalRun) *chart {
	c := &chart{ID: "eval", Title: "Eval results by checkpoint", YLabel: "reward / pass rate"}
	byName := map[string]*series{}
	var order []string
	add := func(name string, x, y float64) {
		s := byName[name]
		if s == nil {
			s = &series{Name: name}
			byName[name] = s
			order = append(order, name)
		}
		s.X = append(s.X, x)
		s.Y = append(s.Y, y)
	}
	for _, e := range evals {
		if e.CheckpointStep == nil {
			continue
		}
		x := float64(*e.CheckpointStep)
		add("mean_reward", x, e.MeanReward)
		for _, k := range sortedKeys(e.PassAtK) {
			add(passLabel(k), x, e.PassAtK[k])
		}
	}
	for _, name := range order {
		c.Series = append(c.Series, *byName[name])
	}
	if len(c.Series) == 0 {
		return nil
	}
	return c
}

func templateFuncs(maxRunes int) template.FuncMap {
	return template.FuncMap{
		"clip": func(s string) string { return clipText(s, maxRunes) },
		"num":  formatNumber,
		"reward": func(r *float64) string {
			if r == nil {
				return "–"
			}
			return formatNumber(*r)
		},
		"conversation": conversation,
		"keys":         sortedKeys,
		"passAt":       passLabel,
		"envMean":      func(e evalRun) map[string]float64 { return e.envMeans() },
		"add":          func(a, b int) int { return a + b },
		"dict": func(kv ...any) (map[string]any, error) {
			if len(kv)%2 != 0 {
				return nil, errors.New("dict needs key-value pairs")
			}
			m := make(map[string]any, len(kv)/2)
			for i := 0; i < len(kv); i += 2 {
				k, ok := kv[i].(string)
				if !ok {
					return nil, fmt.Errorf("dict key %v is not a string", kv[i])
				}
				m[k] = kv[i+1]
			}
			return m, nil
		},
	}
}

// clipText cuts s to at most n runes, saying how much was cut.
func clipText(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + fmt.Sprintf("… [%d more characters]", len(r)-n)
}

func formatNumber(v float64) string {
	return strconv.FormatFloat(v, 'g', 4, 64)
}

// passLabel names a pass_at_k key: train.EvalResult's keys are already
// "pass@4", a bare "4" gets the prefix.
func passLabel(k string) string {
	if strings.HasPrefix(k, "pass@") {
		return k
	}
	return "pass@" + k
}

func sortedKeys(m map[string]float64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	// pass@k keys sort by k as a number ("pass@2" < "pass@10"), others as
	// strings.
	sort.Slice(out, func(i, j int) bool {
		a, errA := strconv.Atoi(strings.TrimPrefix(out[i], "pass@"))
		b, errB := strconv.Atoi(strings.TrimPrefix(out[j], "pass@"))
		if errA == nil && errB == nil {
			return a < b
		}
		return out[i] < out[j]
	})
	return out
}
