package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/schollz/progressbar/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/train"
)

// screen replays terminal output the way a terminal shows it: '\r' returns
// to the start of the line and later characters overwrite earlier ones;
// "\x1b[2K" erases the line. It returns the visible lines.
func screen(raw string) []string {
	var lines []string
	for _, line := range strings.Split(raw, "\n") {
		line = strings.ReplaceAll(line, "\x1b[2K", "\r"+strings.Repeat(" ", 200)+"\r")
		var buf []rune
		col := 0
		for _, r := range line {
			if r == '\r' {
				col = 0
				continue
			}
			if col < len(buf) {
				buf[col] = r
			} else {
				buf = append(buf, r)
			}
			col++
		}
		lines = append(lines, strings.TrimRight(string(buf), " "))
	}
	return lines
}

func TestLogLinesPrintAboveTheProgressBar(t *testing.T) {
	for _, format := range []string{"console", "json"} {
		t.Run(format, func(t *testing.T) {
			io, _, errOut := TestIO()
			io.SetTTY(true, true)
			log, err := newLogger(io, "info", format)
			require.NoError(t, err)
			prog := newProgress(io, log)
			prog.start(10, 0)
			for step := 1; step <= 3; step++ {
				prog.step(train.StepMetrics{Step: step, Round: grpo.RoundMetrics{Reward: 0.25 * float64(step)}})
				log.Info().Int("step", step).Msg("checkpoint saved")
			}
			prog.finish()

			var logLines int
			for _, l := range screen(errOut.String()) {
				if strings.Contains(l, "checkpoint saved") {
					logLines++
					assert.NotContains(t, l, "reward", "a log line shares its line with the bar: %q", l)
					assert.NotContains(t, l, "|", "a log line shares its line with the bar: %q", l)
				}
			}
			assert.Equal(t, 3, logLines)
			// The bar was drawn again after each log line, with the latest step.
			assert.Contains(t, errOut.String(), "step 3 reward 0.750")
			// After finish the bar is gone: the last visible line is empty.
			lines := screen(errOut.String())
			assert.Empty(t, lines[len(lines)-1])
		})
	}
}

// Issue 23: a run that completes shows its bar at 3/3, not erased at 2/3,
// and log lines after it print below it.
func TestProgressBarReachesTheEnd(t *testing.T) {
	io, _, errOut := TestIO()
	io.SetTTY(true, true)
	log, err := newLogger(io, "info", "console")
	require.NoError(t, err)
	prog := newProgress(io, log)
	prog.start(3, 0)
	for step := 1; step <= 3; step++ {
		prog.step(train.StepMetrics{Step: step, Round: grpo.RoundMetrics{Reward: 0.25 * float64(step)}})
	}
	log.Info().Msg("checkpoint saved")
	prog.finish()
	lines := screen(errOut.String())
	var barLine string
	for _, l := range lines {
		if strings.Contains(l, "step 3 reward") {
			barLine = l
		}
	}
	require.NotEmpty(t, barLine, "the finished bar stays on screen: %q", lines)
	assert.Contains(t, barLine, "(3/3")
	assert.Contains(t, lines[len(lines)-2], "checkpoint saved", "a later log line prints below the bar")
}

func TestStatusLineWithoutBarPassesThrough(t *testing.T) {
	io, _, errOut := TestIO()
	_, err := io.statusLine().Write([]byte("plain line\n"))
	require.NoError(t, err)
	io.statusLine().update(func(*progressbar.ProgressBar) { t.Fatal("update without a bar") })
	assert.Equal(t, "plain line\n", errOut.String())
}

func TestEvalProgressCountsRollouts(t *testing.T) {
	io, _, errOut := TestIO()
	io.SetTTY(false, true)
	p := &evalProgress{io: io}
	p.start(8)
	for range 5 {
		p.rollout(nil)
	}
	assert.Contains(t, screen(errOut.String())[0], "eval rollouts")
	assert.Contains(t, errOut.String(), "(5/8")
	p.finish()
	lines := screen(errOut.String())
	assert.Empty(t, lines[len(lines)-1])

	// Not a terminal: no bar at all.
	io, _, errOut = TestIO()
	p = &evalProgress{io: io}
	p.start(8)
	p.rollout(nil)
	p.finish()
	assert.Empty(t, errOut.String())
}

func TestRunSummary(t *testing.T) {
	dir := t.TempDir()
	metrics := `{"step":1,"reward":0.1}
{"step":2,"reward":0.7}
{"step":3,"reward":0.5}
`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "metrics.jsonl"), []byte(metrics), 0o644))
	ck := filepath.Join(dir, "checkpoints", "step-000003")
	var buf strings.Builder
	// A resumed session that ran only step 3: the summary still covers the run.
	printRunSummary(&buf, "", &train.Result{RunDir: dir, Steps: 3, Checkpoint: ck,
		First: train.StepMetrics{Step: 3, Round: grpo.RoundMetrics{Reward: 0.5}}, Last: train.StepMetrics{Step: 3, Round: grpo.RoundMetrics{Reward: 0.5}}})
	out := buf.String()
	assert.Contains(t, out, "run: 3 steps in "+dir)
	assert.Contains(t, out, "reward      0.100 (step 1) -> 0.500 (step 3)")
	assert.Contains(t, out, "best        0.700 at step 2")
	assert.Contains(t, out, "checkpoint  "+ck)
	assert.Contains(t, out, "report      ortrain report "+dir)

	// Issue 23: one step is "1 step", and the report command names the
	// binary as it was invoked (bin/ortrain after make demo).
	buf.Reset()
	printRunSummary(&buf, "bin/ortrain", &train.Result{RunDir: dir, Steps: 1})
	assert.Contains(t, buf.String(), "run: 1 step in "+dir)
	assert.Contains(t, buf.String(), "report      bin/ortrain report "+dir)

	buf.Reset()
	printRunSummary(&buf, "", &train.Result{RunDir: dir})
	assert.Empty(t, buf.String(), "no steps, no summary")
}
