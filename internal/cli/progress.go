package cli

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/rs/zerolog"
	"github.com/schollz/progressbar/v3"

	"github.com/ortrain/ortrain/internal/rollout"
	"github.com/ortrain/ortrain/internal/train"
)

// quickstartTime is how long the embedded quickstart (100 steps) trains,
// as measured (8.0 s and 7.6 s on 2 idle CPU cores); README.md and
// configs/quickstart.yaml say the same, and TestQuickstartTimeAgrees holds
// them together.
const quickstartTime = "about 10 seconds on 2 idle CPU cores"

// progress shows a bar with step, reward and ETA on a terminal, and one
// line per logged step otherwise.
type progress struct {
	io       *IOStreams
	log      zerolog.Logger
	bar      bool
	rollouts atomic.Int64
	first    int
}

func newProgress(io *IOStreams, log zerolog.Logger) *progress { return &progress{io: io, log: log} }

func (p *progress) start(total, first int) {
	p.first = first
	if !p.io.IsStderrTTY() {
		return
	}
	p.bar = true
	p.io.statusLine().showBar(total, "training", progressbar.OptionShowElapsedTimeOnFinish())
	p.io.statusLine().update(func(b *progressbar.ProgressBar) { _ = b.Set(first) })
}

func (p *progress) rollout(*rollout.Trajectory) { p.rollouts.Add(1) }

func (p *progress) step(m train.StepMetrics) {
	if p.bar {
		p.io.statusLine().update(func(b *progressbar.ProgressBar) {
			b.Describe(fmt.Sprintf("step %d reward %.3f loss %+.4f", m.Step, m.Round.Reward, m.Loss))
			_ = b.Set(m.Step)
		})
		return
	}
	// Times in seconds, as in metrics.jsonl.
	ev := p.log.Info().Int("step", m.Step).Float64("reward", m.Round.Reward).Float64("reward_std", m.Round.RewardStd).
		Float64("loss", m.Loss).Float64("grad_norm", m.GradNorm).Float64("mean_length", m.Round.MeanLength).
		Float64("step_time", math.Round(m.StepTime.Seconds()*1000)/1000)
	if len(m.Outcomes) > 0 {
		ev = ev.Str("outcomes", formatCounts(m.Outcomes))
	}
	if g, ok := m.Extra["dynamic_sampling/groups_generated"]; ok {
		// What filling the round cost, beside what it trained on.
		ev = ev.Int("groups_generated", int(g)).Int("groups_dropped", int(m.Extra["dynamic_sampling/groups_dropped"]))
	}
	ev.Msg("step")
}

func (p *progress) finish() {
	if p.bar {
		p.io.statusLine().hideBar()
	}
}

// evalProgress counts finished rollouts against the total on a terminal.
type evalProgress struct {
	io *IOStreams
}

func (p *evalProgress) start(total int) {
	if p.io.IsStderrTTY() {
		p.io.statusLine().showBar(total, "eval rollouts")
	}
}

func (p *evalProgress) rollout(*rollout.Trajectory) {
	p.io.statusLine().update(func(b *progressbar.ProgressBar) { _ = b.Add(1) })
}

func (p *evalProgress) finish() { p.io.statusLine().hideBar() }

func formatCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, ",")
}

// printRunSummary ends a run with what a person wants to know next: how far
// it got, how the reward moved, its best step, where the checkpoint is and
// how to see the report. The reward history comes from metrics.jsonl, so a
// resumed run summarises every step, not just this session's.
func printRunSummary(w io.Writer, argv0 string, res *train.Result) {
	if res == nil || res.Steps == 0 {
		return
	}
	hist := rewardHistory(filepath.Join(res.RunDir, "metrics.jsonl"))
	if len(hist) == 0 {
		hist = []stepReward{{res.First.Step, res.First.Round.Reward}, {res.Last.Step, res.Last.Round.Reward}}
	}
	first, last, best := hist[0], hist[len(hist)-1], hist[0]
	for _, h := range hist {
		if h.reward > best.reward {
			best = h
		}
	}
	if argv0 == "" {
		argv0 = "ortrain"
	}
	fmt.Fprintf(w, "\nrun: %s in %s\n", plural(res.Steps, "step"), res.RunDir)
	fmt.Fprintf(w, "  reward      %.3f (step %d) -> %.3f (step %d)\n", first.reward, first.step, last.reward, last.step)
	fmt.Fprintf(w, "  best        %.3f at step %d\n", best.reward, best.step)
	if res.Checkpoint != "" {
		fmt.Fprintf(w, "  checkpoint  %s\n", res.Checkpoint)
	}
	fmt.Fprintf(w, "  report      %s report %s\n", argv0, res.RunDir)
}

type stepReward struct {
	step   int
	reward float64
}

// rewardHistory reads step and reward from metrics.jsonl; nil when the
// file cannot be read (the summary then uses what the run returned).
func rewardHistory(path string) []stepReward {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []stepReward
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var m struct {
			Step   *int     `json:"step"`
			Reward *float64 `json:"reward"`
		}
		if json.Unmarshal(sc.Bytes(), &m) != nil || m.Step == nil || m.Reward == nil {
			continue
		}
		out = append(out, stepReward{*m.Step, *m.Reward})
	}
	return out
}

// plural is "1 step", "2 steps".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
