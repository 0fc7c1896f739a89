package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/launch"
	"github.com/ortrain/ortrain/internal/train"
)

// runRanks starts opts.NProcPerNode ranks of this run on this machine as
// supervised children, each this binary with the same flags and the
// launcher variables of its rank: one rank failing stops the others, an
// interrupt reaches every rank (rank 0 saves the checkpoint).
func runRanks(ctx context.Context, opts *RunOptions, cfg *config.Config) error {
	exe, err := opts.Executable()
	if err != nil {
		return fmt.Errorf("--nproc-per-node: find this binary to start the ranks: %w", err)
	}
	env := opts.Environ()
	if cfg.Worker.Threads == 0 && opts.Getenv(config.EnvVarFor("worker.threads")) == "" {
		// The ranks share the cores instead of each taking them all.
		threads := max(1, runtime.NumCPU()/opts.NProcPerNode)
		env = append(env, config.EnvVarFor("worker.threads")+"="+strconv.Itoa(threads))
	}
	logDir := filepath.Join(cfg.OutputDir, "ranks")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return fmt.Errorf("--nproc-per-node: create the rank log directory: %w", err)
	}
	opts.Logger.Info().Int("ranks", opts.NProcPerNode).Str("logs", logDir).Msg("starting the ranks of a data-parallel run")
	err = launch.RunLocal(ctx, launch.LocalOptions{
		NProc: opts.NProcPerNode, Argv: append([]string{exe}, opts.args()...), Env: env, LogDir: logDir, FreshLogs: opts.Overwrite,
		Echo: opts.IO.ErrOut, FailGrace: 10 * time.Second, InterruptGrace: cfg.Worker.SaveTimeout + time.Minute,
	})
	var rankErr *launch.RankError
	switch {
	case errors.Is(err, launch.ErrInterrupted):
		return fmt.Errorf("%w: every rank stopped (rank 0 saved the last completed step; continue with --resume)", train.ErrInterrupted)
	case errors.As(err, &rankErr):
		return fmt.Errorf("%w (its log: %s)", err, filepath.Join(logDir, fmt.Sprintf("rank-%d.log", rankErr.Rank)))
	case err != nil:
		return err
	}
	ckpt, _, err := train.LatestCheckpoint(cfg.OutputDir)
	if err != nil {
		return fmt.Errorf("the ranks finished but: %w", err)
	}
	if opts.printWeights {
		ckpt = train.CheckpointWeights(ckpt)
	}
	fmt.Fprintf(opts.IO.Out, "%s\n", ckpt)
	return nil
}

// rankArgs is the run command line for a rank: every flag set on this
// one (persistent flags included) but --nproc-per-node.
func rankArgs(cmd *cobra.Command) []string {
	args := []string{cmd.Name()}
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if f.Name == "nproc-per-node" {
			return
		}
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			for _, v := range sv.GetSlice() {
				args = append(args, "--"+f.Name+"="+v)
			}
			return
		}
		args = append(args, "--"+f.Name+"="+f.Value.String())
	})
	return slices.Clip(args)
}
