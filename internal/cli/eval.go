package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ortrain/ortrain/internal/envtarget"
	"github.com/ortrain/ortrain/internal/train"
)

// EvalOptions holds the eval command's flags.
type EvalOptions struct {
	Run            RunOptions
	Env            string
	Split          string
	NumTasks       int
	NumGenerations int
	PassThreshold  float64
	Format         string
	// Dir is the eval's directory (default: see train.NewEvalDir).
	Dir string
}

// runOnlyFlags are run's config flags that mean nothing to an eval (it
// neither trains nor uses vLLM), kept off eval's flag set and --help.
var runOnlyFlags = []string{"max-steps", "learning-rate", "per-device-train-batch-size", "loss-type", "engine", "max-off-policy-steps"}

func newEvalCmd(deps *Deps, runF func(context.Context, *EvalOptions) error) *cobra.Command {
	opts := &EvalOptions{Run: RunOptions{IO: deps.IO, Getenv: deps.Getenv, Flags: map[string]*pflag.Flag{}}}
	cmd := &cobra.Command{
		Use:   "eval",
		Short: "Measure a policy on ORS environments: mean reward and pass@k per task",
		Long: `Run the same rollouts as training, without training: every task of the
configured envs (or --num-tasks of them) is attempted --num-generations times
with the model's current weights. Prints per-task mean reward and pass@k (the
unbiased estimator; a rollout passes when its reward >= --pass-threshold) as a
table, or as JSON/JSONL with --format.

Each eval writes to its own directory, never to a training run's files:
result.json (the results, the model path, its sha256 and checkpoint step) and
trajectories.jsonl. By default that is RUN_DIR/eval/<step>-<time>/ when --model
is a run's checkpoint (runs/x/checkpoints/step-N/model), where
'ortrain report RUN_DIR' shows it, else output_dir/eval/<model>-<time>/ (output_dir
is runs/latest when no config names one); --eval-dir
picks another.`,
		Example: `  # the quickstart's policy after training
  ortrain eval --model runs/quickstart/checkpoints/step-000100/model --num-generations 4

  # a hosted env's validation split
  ortrain eval --env Eigent/SETA --split validation --num-tasks 20 --model Qwen/Qwen3-4B --format jsonl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Run.Logger = deps.Logger
			if err := oneOfFlag("--format", opts.Format, "table", "json", "jsonl"); err != nil {
				return err
			}
			if opts.NumGenerations < 1 {
				return usageErrorf("--num-generations %d must be at least 1", opts.NumGenerations)
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return runEval(cmd.Context(), opts, cmd.Flags().Changed("split"))
		},
	}
	fs := cmd.Flags()
	fs.StringVarP(&opts.Run.ConfigFile, "config", "c", "", "YAML config file (default: the embedded quickstart)")
	fs.StringVar(&opts.Env, "env", "", "evaluate on this env only: a URL, Owner/Env, or builtin:NAME")
	addEnvTargetFlags(fs, &opts.Run.EnvProtocol, &opts.Run.EnvTokenEnv)
	fs.StringVar(&opts.Split, "split", "train", "split to evaluate (with --env, or to override every env's split)")
	fs.IntVar(&opts.NumTasks, "num-tasks", 0, "evaluate the first N tasks of each env (0: as configured)")
	fs.IntVarP(&opts.NumGenerations, "num-generations", "n", 4, "rollouts per task (pass@k for k up to n)")
	fs.Float64Var(&opts.PassThreshold, "pass-threshold", 1.0, "reward at or above which a rollout passes")
	fs.StringVar(&opts.Format, "format", "table", "output: table, json or jsonl")
	fs.StringVar(&opts.Dir, "eval-dir", "", "write result.json and trajectories.jsonl here (default: RUN_DIR/eval/<step>-<time> for a checkpoint, else output_dir/eval/<model>-<time>; output_dir is runs/latest without a config)")
	addConfigFlags(fs, opts.Run.Flags, append([]string{"num-generations"}, runOnlyFlags...)...)
	addSetFlag(fs, &opts.Run.Sets)
	return cmd
}

func oneOfFlag(name, v string, allowed ...string) error {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return usageErrorf("%s %q is not allowed (allowed: %s)", name, v, strings.Join(allowed, ", "))
}

func runEval(ctx context.Context, opts *EvalOptions, splitSet bool) error {
	cfg, err := loadRunConfig(&opts.Run, opts.Env)
	if err != nil {
		return err
	}
	for i := range cfg.Envs {
		if splitSet || opts.Env != "" {
			cfg.Envs[i].Split = opts.Split
		}
		if opts.NumTasks > 0 {
			cfg.Envs[i].NumTasks, cfg.Envs[i].Indices = opts.NumTasks, nil
		}
	}
	if err := cfg.Validate(); err != nil {
		return &UsageError{Err: err}
	}
	prog := &evalProgress{io: opts.Run.IO}
	res, err := train.Evaluate(ctx, cfg, train.EvalOptions{
		Logger: opts.Run.Logger, Getenv: opts.Run.Getenv, NumGenerations: opts.NumGenerations, PassThreshold: opts.PassThreshold,
		Dir: opts.Dir, OnStart: prog.start, OnRollout: prog.rollout,
	})
	prog.finish()
	var noTasks *envtarget.NoTaskListError
	if errors.As(err, &noTasks) && opts.Env != "" {
		return usageErrorf("%s speaks OpenEnv, which has no task list: pass --num-tasks N (episodes reset with seed 0..N-1), or use a --config whose env entry has tasks: FILE.jsonl", opts.Env)
	}
	if err != nil {
		return err
	}
	if err := writeEval(opts, res); err != nil {
		return err
	}
	fmt.Fprintf(opts.Run.IO.ErrOut, "%d tasks x %d rollouts in %.1fs: mean reward %.3f, pass@1 %.3f, pass@%d %.3f, %d failed rollouts\n",
		len(res.Tasks), opts.NumGenerations, res.Duration, res.MeanReward, res.PassAtK["pass@1"],
		opts.NumGenerations, res.PassAtK[fmt.Sprintf("pass@%d", opts.NumGenerations)], res.Failures)
	fmt.Fprintf(opts.Run.IO.ErrOut, "eval results in %s\n", res.Dir)
	return nil
}

func writeEval(opts *EvalOptions, res *train.EvalResult) error {
	out := opts.Run.IO.Out
	switch opts.Format {
	case "json":
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	case "jsonl":
		enc := json.NewEncoder(out)
		for _, t := range res.Tasks {
			if err := enc.Encode(t); err != nil {
				return err
			}
		}
		return nil
	}
	tp := newTablePrinter(out, opts.Run.IO.IsStdoutTTY())
	header := []string{"ENV", "SPLIT", "INDEX", "MEAN REWARD"}
	for _, k := range res.Ks {
		header = append(header, fmt.Sprintf("PASS@%d", k))
	}
	tp.AddRow(append(header, "FAILED")...)
	for _, t := range res.Tasks {
		row := []string{t.Env, t.Split, fmt.Sprint(t.Index), fmt.Sprintf("%.3f", t.Mean)}
		for _, k := range res.Ks {
			row = append(row, fmt.Sprintf("%.3f", t.PassAtK[fmt.Sprintf("pass@%d", k)]))
		}
		tp.AddRow(append(row, fmt.Sprint(t.Failures))...)
	}
	if err := tp.Render(); err != nil {
		return err
	}
	// Each reward function's mean over every rollout (pass@k above is on
	// their weighted sum).
	names := make([]string, 0, len(res.Rewards))
	for k := range res.Rewards {
		if strings.HasSuffix(k, "/mean") {
			names = append(names, k)
		}
	}
	if len(names) == 0 {
		return nil
	}
	sort.Strings(names)
	fmt.Fprintln(out)
	tp = newTablePrinter(out, opts.Run.IO.IsStdoutTTY())
	tp.AddRow("REWARD", "MEAN", "STD")
	for _, k := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(k, "rewards/"), "/mean")
		std := "-"
		if v, ok := res.Rewards["rewards/"+name+"/std"]; ok {
			std = fmt.Sprintf("%.3f", v)
		}
		tp.AddRow(name, fmt.Sprintf("%.3f", res.Rewards[k]), std)
	}
	return tp.Render()
}
