package cli

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/ortrain/ortrain/internal/report"
)

// ReportOptions are the inputs of `ortrain report`.
type ReportOptions struct {
	IO     *IOStreams
	Logger zerolog.Logger

	RunDir        string
	Out           string
	Watch         bool
	Interval      time.Duration
	SampledSteps  int
	GroupsPerStep int
}

func newReportCmd(deps *Deps, runF func(context.Context, *ReportOptions) error) *cobra.Command {
	opts := &ReportOptions{}
	cmd := &cobra.Command{
		Use:   "report RUN_DIR",
		Short: "Write an HTML report of a run: plots, eval results and sample trajectories",
		Long: `Write one self-contained HTML file (no network, no external scripts or styles)
that shows a run directory: reward mean ± std per step, per env and per reward
function; rollout outcomes; loss, KL, entropy, clip ratios, gradient norm;
completion length; time per step by phase; eval results (RUN_DIR/eval/*/result.json);
and a sample of trajectories rendered as conversations, the best and worst
rollout of a group side by side. Plots are SVG drawn by ortrain itself.

Long runs stay small: trajectories are sampled (--steps steps spread over the
run, --groups groups each) and long series are averaged into buckets.

With --watch the report is rewritten whenever the run's files change, and the
page reloads itself; Ctrl-C stops watching. The report's path is printed on stdout.`,
		Example: `  # report of the quickstart run
  ortrain report runs/quickstart

  # keep a report up to date while training runs in another terminal
  ortrain report runs/quickstart --watch --out /tmp/quickstart.html`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.IO = deps.IO
			opts.Logger = deps.Logger.With().Str("command", "report").Logger()
			opts.RunDir = args[0]
			if opts.Interval <= 0 {
				return usageErrorf("--interval must be positive, got %s", opts.Interval)
			}
			if opts.SampledSteps < 1 || opts.GroupsPerStep < 1 {
				return usageErrorf("--steps and --groups must be at least 1, got %d and %d", opts.SampledSteps, opts.GroupsPerStep)
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return runReport(cmd.Context(), opts)
		},
	}
	cmd.Flags().StringVar(&opts.Out, "out", "", "HTML file to write (default RUN_DIR/report.html)")
	cmd.Flags().BoolVar(&opts.Watch, "watch", false, "rewrite the report as the run's files change, until interrupted")
	cmd.Flags().DurationVar(&opts.Interval, "interval", 5*time.Second, "with --watch, how often to check the run's files")
	cmd.Flags().IntVar(&opts.SampledSteps, "steps", 12, "steps that show sample trajectories")
	cmd.Flags().IntVar(&opts.GroupsPerStep, "groups", 2, "groups shown per sampled step")
	return cmd
}

func runReport(ctx context.Context, opts *ReportOptions) error {
	out := opts.Out
	if out == "" {
		out = filepath.Join(opts.RunDir, "report.html")
	}
	ro := report.Options{SampledSteps: opts.SampledSteps, GroupsPerStep: opts.GroupsPerStep}
	if !opts.Watch {
		if err := report.WriteFile(ctx, opts.RunDir, out, ro); err != nil {
			if errors.Is(err, report.ErrNotRunDir) {
				return &UsageError{Err: err}
			}
			return fmt.Errorf("report %s: %w", opts.RunDir, err)
		}
		fmt.Fprintln(opts.IO.Out, out)
		return nil
	}
	ro.RefreshSeconds = max(1, int(opts.Interval.Seconds()))
	fmt.Fprintln(opts.IO.Out, out)
	opts.Logger.Info().Str("run_dir", opts.RunDir).Str("out", out).Float64("interval", opts.Interval.Seconds()).Msg("watching run; Ctrl-C stops")
	return report.Watch(ctx, opts.RunDir, out, opts.Interval, ro, func(err error) {
		if err != nil {
			opts.Logger.Warn().Err(err).Msg("report not updated")
			return
		}
		opts.Logger.Info().Str("out", out).Msg("report updated")
	})
}
