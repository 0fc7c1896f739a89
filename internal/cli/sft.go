package cli

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/sft"
)

// sftFlags are the sft flags that set config keys.
var sftFlags = []struct{ key, name, usage, kind string }{
	{"sft.data", "data", "JSONL conversations to train on (TRL's messages/tools or prompt/completion rows)", "string"},
	{"sft.eval_data", "eval-data", "held-out JSONL rows for eval_loss (default: sft.eval_split of --data)", "string"},
	{"model", "model", "model directory or Hugging Face repo id (from the local HF cache)", "string"},
	{"output_dir", "output-dir", "run directory (config, manifest, metrics, checkpoints)", "string"},
	{"seed", "seed", "random seed (row order, held-out rows)", "int"},
	{"sft.max_steps", "max-steps", "optimizer steps to train (0: num_train_epochs decides)", "int"},
	{"sft.num_train_epochs", "num-train-epochs", "passes over the data", "float"},
	{"sft.learning_rate", "learning-rate", "peak learning rate", "float"},
	{"sft.per_device_train_batch_size", "per-device-train-batch-size", "rows per micro-batch", "int"},
	{"sft.max_length", "max-length", "tokens per row (longer rows: sft.truncation_mode)", "int"},
	{"worker.device", "device", "trainer device: auto (CUDA when the worker has it and sees a GPU, else CPU), cpu, cuda or cuda:N", "string"},
}

func newSFTCmd(deps *Deps) *cobra.Command {
	opts := &RunOptions{IO: deps.IO, Getenv: deps.Getenv, Executable: deps.Executable, Environ: deps.Environ, Argv0: deps.Argv0, Flags: map[string]*pflag.Flag{}}
	cmd := &cobra.Command{
		Use:   "sft",
		Short: "Supervised fine-tuning on chat data (a warm start before GRPO)",
		Long: `Fine-tune a model on conversations: the supervised warm start practitioners run
before RL, so the policy already writes tool calls when GRPO starts.

Data is JSONL in TRL's dataset forms, one row per line:
  {"messages": [...], "tools": [...]}    conversational: user, assistant (with
                                         tool_calls), tool messages
  {"prompt": [...], "completion": [...]} prompt-completion (messages or text)
'ortrain env demos NAME --out FILE' writes such a file by playing an env.

Rows are tokenized by the chat pipeline rollouts use — the model's chat
template, the row's tools in the prompt (unless chat.render_tools is off), the
configured chat.system_prompt when a row has no system message — so what SFT
trains is token for token what 'ortrain run' later samples. The loss is the
mean cross-entropy over the assistant's tokens (sft.assistant_only_loss: its
text, the tool-call syntax and the end-of-turn token; never system, user or
tool tokens), with no {% generation %} markers needed in the template.

A row that cannot be used (bad JSON, a tool message answering no call, a tool
call the template cannot render) stops the run with its file, line and field,
unless sft.skip_bad_rows counts and skips it. Rows longer than sft.max_length
are cut and counted (sft.truncation_mode: keep_start) or refused (refuse).

The run directory is run's: config.yaml, manifest.json (the data's sha256 and
row counts), metrics.jsonl (loss, mean_token_accuracy, eval_loss,
tokens_per_second, learning_rate, grad_norm), checkpoints/step-N. The last
checkpoint's model/ directory is what 'ortrain run --model' takes (a LoRA run
saves adapter/). SIGINT saves the last completed step; --resume continues
exactly, and refuses settings or a data file (its sha256) that changed unless
--resume-with-changes. Settings live in the config's sft: section (TRL's SFTConfig names);
model, chat, worker and logging are shared with 'ortrain run'.`,
		Example: `  # demonstrations from the built-in lockbox env, then SFT on them
  ortrain env demos lockbox --n 256 --out demos.jsonl
  ortrain sft --config configs/lockbox.yaml --data demos.jsonl --output-dir runs/lockbox-sft

  # SFT, then GRPO from the fine-tuned weights (sft prints their directory)
  model=$(ortrain sft --config configs/lockbox.yaml --data demos.jsonl --output-dir runs/lockbox-sft --overwrite)
  ortrain run --config configs/lockbox.yaml --model "$model"`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Logger = deps.Logger
			return runSFT(cmd.Context(), opts)
		},
	}
	fs := cmd.Flags()
	fs.StringVarP(&opts.ConfigFile, "config", "c", "", "YAML config file (its sft: section; model, chat, worker shared with run)")
	fs.BoolVar(&opts.Resume, "resume", false, "continue from the latest complete checkpoint in output_dir")
	fs.BoolVar(&opts.ResumeWithChanges, "resume-with-changes", false, "with --resume: accept changed settings")
	fs.BoolVar(&opts.Overwrite, "overwrite", false, "start afresh in an output_dir holding an earlier run (deletes its logs and checkpoints)")
	fs.BoolVar(&opts.PrintConfig, "print-config", false, "print the resolved config as YAML and exit")
	fs.IntVar(&opts.NProcPerNode, "nproc-per-node", 1, "data-parallel ranks to start on this machine")
	for _, f := range sftFlags {
		fs.Var(&textFlag{kind: f.kind}, f.name, f.usage)
		fl := fs.Lookup(f.name)
		fl.DefValue = config.DefaultText(f.key)
		opts.Flags[f.key] = fl
	}
	addSetFlag(fs, &opts.Sets)
	opts.args = func() []string { return rankArgs(cmd) }
	opts.printWeights = true
	return cmd
}

func runSFT(ctx context.Context, opts *RunOptions) error {
	cfg, err := config.Resolve(configSource(opts))
	if err != nil {
		return &UsageError{Err: err}
	}
	if opts.PrintConfig {
		return printConfig(opts.IO, cfg)
	}
	if err := cfg.ValidateSFT(); err != nil {
		return &UsageError{Err: err}
	}
	if opts.Resume && opts.Overwrite {
		return usageErrorf("--resume and --overwrite contradict each other: pass one")
	}
	world, launched, err := placeRanks(ctx, opts, cfg)
	if err != nil || launched {
		return err
	}
	ro := sft.RunOptions{RunOptions: runOptions(opts)}
	ro.World = world
	bar := false
	ro.OnStart = func(total, first int) {
		if opts.IO.IsStderrTTY() {
			bar = true
			opts.IO.statusLine().showBar(total, "sft", progressbar.OptionShowElapsedTimeOnFinish())
			opts.IO.statusLine().update(func(b *progressbar.ProgressBar) { _ = b.Set(first) })
		}
	}
	ro.OnMetrics = func(step int, m map[string]float64) {
		if bar {
			opts.IO.statusLine().update(func(b *progressbar.ProgressBar) {
				b.Describe(fmt.Sprintf("step %d loss %.4f acc %.3f", step, m["loss"], m["mean_token_accuracy"]))
				_ = b.Set(step)
			})
			return
		}
		ev := opts.Logger.Info().Int("step", step).Float64("loss", m["loss"]).Float64("mean_token_accuracy", m["mean_token_accuracy"]).
			Float64("grad_norm", m["grad_norm"]).Float64("tokens_per_second", math.Round(m["tokens_per_second"]))
		if v, ok := m["eval_loss"]; ok {
			ev = ev.Float64("eval_loss", v)
		}
		ev.Msg("step")
	}
	res, err := sft.Run(ctx, cfg, ro)
	if bar {
		opts.IO.statusLine().hideBar()
	}
	printSFTSummary(opts.IO.ErrOut, opts.Argv0, opts.ConfigFile, res)
	if err != nil {
		return err
	}
	if world.Rank == 0 && world.Source != "nproc-per-node" && res.Model != "" { // the launcher prints it under --nproc-per-node
		fmt.Fprintf(opts.IO.Out, "%s\n", res.Model)
	}
	return nil
}

// printSFTSummary ends an SFT run with how the loss moved, what the data
// gave, and where the weights are.
func printSFTSummary(w io.Writer, argv0, configFile string, res *sft.Result) {
	if res == nil || res.Steps == 0 || res.Last == nil {
		return
	}
	fmt.Fprintf(w, "\nsft: %d/%d steps, loss %.4f", res.Steps, res.MaxSteps, res.Last["loss"])
	if res.First != nil {
		fmt.Fprintf(w, " (first logged %.4f)", res.First["loss"])
	}
	fmt.Fprintf(w, ", token accuracy %.3f", res.Last["mean_token_accuracy"])
	if v, ok := res.Last["eval_loss"]; ok {
		fmt.Fprintf(w, ", eval loss %.4f", v)
	}
	d := res.Data
	fmt.Fprintf(w, "\ndata: %d rows (%d held out), %d skipped, %d truncated at max_length\n", d.Rows, d.EvalRows, d.Skipped, d.Truncated)
	if res.Model != "" {
		fmt.Fprintf(w, "weights: %s\n", res.Model)
		// The same job continues with GRPO: the same config (its envs, chat
		// and worker sections), from these weights.
		cont := argv0 + " run"
		if configFile != "" {
			cont += " --config " + shellQuote(configFile)
		}
		fmt.Fprintf(w, "next:    %s --model %s   (GRPO from here)\n", cont, shellQuote(res.Model))
	}
	fmt.Fprintf(w, "report:  %s report %s\n", argv0, res.RunDir)
}

// shellQuote quotes s for a POSIX shell when it holds anything but safe
// characters, so a printed command pastes as it reads.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:@+,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
