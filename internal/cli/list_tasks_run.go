package cli

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	"github.com/ortrain/ortrain/internal/curriculum"
)

// passRateRow is one task's pass rate as `list-tasks --run` prints it.
type passRateRow struct {
	Env        string  `json:"env"`
	Split      string  `json:"split"`
	Index      int     `json:"index"`
	PassRate   float64 `json:"pass_rate"`
	MeanReward float64 `json:"mean_reward"`
	Rollouts   int     `json:"rollouts"`
	Recent     string  `json:"recent"`
	LastRound  int     `json:"last_round"`
	// Band is where the curriculum puts the task: too_easy, too_hard or
	// in_band (by the run's bounds, whether or not the curriculum was on).
	Band string `json:"band"`
}

// runListPassRates prints the per-task pass rates of a run directory
// (task_pass_rates.json, written with each checkpoint): hardest first.
func runListPassRates(opts *ListTasksOptions) error {
	snap, err := curriculum.ReadSnapshot(opts.Run)
	if err != nil {
		return &UsageError{Err: fmt.Errorf("--run: %w", err)}
	}
	rows := make([]passRateRow, 0, len(snap.Tasks))
	for _, t := range snap.Tasks {
		r := passRateRow{Index: t.Index, PassRate: t.PassRate(), MeanReward: t.MeanReward, Rollouts: t.Rollouts, Recent: t.Recent, LastRound: t.LastRound, Band: "in_band"}
		if t.Env < len(snap.Envs) {
			r.Env = snap.Envs[t.Env]
		}
		if t.Env < len(snap.Splits) {
			r.Split = snap.Splits[t.Env]
		}
		switch {
		case r.PassRate >= snap.Config.MaxPassRate:
			r.Band = "too_easy"
		case r.PassRate <= snap.Config.MinPassRate:
			r.Band = "too_hard"
		}
		if (opts.Split == "" || opts.Split == r.Split) && (len(opts.Indices) == 0 || slices.Contains(opts.Indices, r.Index)) {
			rows = append(rows, r)
		}
	}
	slices.SortStableFunc(rows, func(a, b passRateRow) int { return cmp.Compare(a.PassRate, b.PassRate) })
	if opts.NumTasks > 0 && len(rows) > opts.NumTasks {
		rows = rows[:opts.NumTasks]
	}
	switch opts.Format {
	case "json":
		return writeJSONDoc(opts.IO, struct {
			Run   string        `json:"run"`
			Step  int           `json:"step"`
			Tasks []passRateRow `json:"tasks"`
		}{opts.Run, snap.Step, rows})
	case "jsonl":
		for _, r := range rows {
			if err := writeJSONDoc(opts.IO, r); err != nil {
				return err
			}
		}
		return nil
	}
	fmt.Fprintf(opts.IO.Out, "pass rates at step %d (a rollout passes with reward >= %v; over each task's last %d rollouts)\n",
		snap.Step, snap.Config.PassThreshold, snap.Config.Window)
	tp := newTablePrinter(opts.IO.Out, opts.IO.IsStdoutTTY())
	tp.AddRow("ENV", "SPLIT", "INDEX", "PASS_RATE", "MEAN_REWARD", "ROLLOUTS", "RECENT", "BAND")
	for _, r := range rows {
		tp.AddRow(r.Env, r.Split, strconv.Itoa(r.Index), strconv.FormatFloat(r.PassRate, 'f', 3, 64),
			strconv.FormatFloat(r.MeanReward, 'f', 3, 64), strconv.Itoa(r.Rollouts), r.Recent, r.Band)
	}
	return tp.Render()
}

func writeJSONDoc(io *IOStreams, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(io.Out, "%s\n", b)
	return err
}
