package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/ortrain/ortrain/internal/model"
)

// InitModelOptions are the inputs of `ortrain init-model`.
type InitModelOptions struct {
	IO     *IOStreams
	Logger zerolog.Logger

	Preset string
	Out    string
	Seed   int64
	Force  bool
}

func newInitModelCmd(deps *Deps, runF func(context.Context, *InitModelOptions) error) *cobra.Command {
	opts := &InitModelOptions{}
	cmd := &cobra.Command{
		Use:   "init-model --preset NAME --out DIR",
		Short: "Create a randomly initialised model directory from a preset",
		Long: `Create a Hugging Face-format model directory with random weights, ready to train
without any download: config.json, generation_config.json, model.safetensors
(float32), and a byte-level tokenizer (tokenizer.json, tokenizer_config.json with
a ChatML tool-calling chat template).

Presets (all Qwen3-style decoders over the byte-level tokenizer):
` + presetHelp() + `
The same --seed always produces byte-identical files. The directory is written
under a temporary name and renamed into place, so it is complete or absent.
An existing non-empty --out is refused unless --force is given; even then only
an empty directory or an existing model directory (one holding config.json) is
replaced. The path of the new model is printed on stdout.`,
		Example: `  # a tiny model for the CPU quickstart and tests
  ortrain init-model --preset tiny --out models/tiny

  # a ~100M-parameter model for CPU benchmarks, replacing an earlier one
  ortrain init-model --preset small100m --out models/small100m --seed 7 --force`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.IO = deps.IO
			opts.Logger = deps.Logger.With().Str("command", "init-model").Logger()
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return runInitModel(cmd.Context(), opts)
		},
	}
	cmd.Flags().StringVar(&opts.Preset, "preset", "tiny", "model shape: "+strings.Join(model.PresetNames(), ", "))
	cmd.Flags().StringVar(&opts.Out, "out", "", "directory to create (required)")
	cmd.Flags().Int64Var(&opts.Seed, "seed", 0, "random seed for the weights")
	cmd.Flags().BoolVar(&opts.Force, "force", false, "replace --out if it already holds a model")
	return cmd
}

func presetHelp() string {
	var b strings.Builder
	for _, p := range model.Presets() {
		fmt.Fprintf(&b, "  %-10s %s\n", p.Name, p.Description)
	}
	return b.String()
}

func runInitModel(ctx context.Context, opts *InitModelOptions) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	preset, ok := model.PresetByName(opts.Preset)
	if !ok {
		return usageErrorf("--preset %q is not a preset; choose one of: %s", opts.Preset, strings.Join(model.PresetNames(), ", "))
	}
	if opts.Out == "" {
		return usageErrorf("--out is required: the directory to create the model in")
	}
	out, err := filepath.Abs(opts.Out)
	if err != nil {
		return fmt.Errorf("resolve --out %q: %w", opts.Out, err)
	}
	if entries, err := os.ReadDir(out); err == nil && len(entries) > 0 && !opts.Force {
		return usageErrorf("--out %s already exists and is not empty; pass --force to replace it (only a model directory holding config.json is replaced)", out)
	}
	opts.Logger.Info().Str("preset", preset.Name).Int64("params", preset.Config.NumParams()).
		Int64("seed", opts.Seed).Str("out", out).Msg("initialising model")
	initFn := model.Init
	if opts.Force {
		initFn = model.InitOverwrite
	}
	if err := initFn(out, preset, opts.Seed); err != nil {
		var notEmpty *model.DirNotEmptyError
		if errors.As(err, &notEmpty) {
			return usageErrorf("--out %s is not empty and holds no config.json, so it is not a model directory; --force only replaces model directories; choose another --out", out)
		}
		return fmt.Errorf("init model in %s: %w", out, err)
	}
	fmt.Fprintln(opts.IO.Out, out)
	return nil
}
