package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/smoke"
)

// ErrSmokeFailed: a smoke run check failed (exit 1).
var ErrSmokeFailed = errors.New("smoke run failed")

func addSmokeFlags(fs *pflag.FlagSet, opts *RunOptions) {
	fs.BoolVar(&opts.Smoke, "smoke", false, "run the config for real on CPU in seconds (longer only when its envs are slow), for CI: its envs, chat settings, rewards and loss with a tiny random model of its model's family (the model's own tokenizer and chat template; weights not needed), the builtin engine, a few steps, a checkpoint and a resume; prints a verdict, exit 1 on a failed check")
	fs.StringVar(&opts.SmokeDir, "smoke-dir", "", "with --smoke: keep the smoke model and run here (default: a temporary directory, removed)")
	fs.StringVar(&opts.SmokeJSON, "smoke-json", "", `with --smoke: write the verdict as JSON to this file ("-": stdout)`)
	fs.StringVar(&opts.SmokeJUnit, "smoke-junit", "", `with --smoke: write the verdict as JUnit XML to this file ("-": stdout)`)
}

// smokeRun is `run --smoke`: smoke.Run over the resolved config, its
// verdict on stdout (or in the files asked for).
func smokeRun(ctx context.Context, cfg *config.Config, opts *RunOptions) error {
	switch {
	case opts.Resume || opts.Overwrite || opts.NProcPerNode > 1:
		return usageErrorf("--smoke makes its own run directory and one rank: leave out --resume, --overwrite and --nproc-per-node")
	case opts.SmokeJSON == "-" && opts.SmokeJUnit == "-":
		return usageErrorf("--smoke-json - and --smoke-junit - both want stdout: write one of them to a file")
	}
	ro := runOptions(opts)
	v, err := smoke.Run(ctx, cfg, smoke.Options{RunOptions: ro, Dir: opts.SmokeDir})
	if v == nil {
		return err
	}
	if werr := writeVerdictFiles(opts.IO, v, opts.SmokeJSON, opts.SmokeJUnit); werr != nil {
		return werr
	}
	if ctx.Err() != nil {
		return &InterruptedError{What: "smoke run (the verdict covers the checks that ran)"}
	}
	if err != nil {
		return err
	}
	if !v.Passed() {
		return fmt.Errorf("%w: %s", ErrSmokeFailed, v.Summary())
	}
	return nil
}
