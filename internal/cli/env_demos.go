package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/rs/zerolog"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/ortrain/ortrain/internal/demos"
	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/envtarget"
)

// EnvDemosOptions are the inputs of `ortrain env demos`.
type EnvDemosOptions struct {
	IO     *IOStreams
	Logger zerolog.Logger
	Getenv func(string) string

	// Target is NAME as given: a built-in env's name, builtin:NAME, or any
	// env target (a URL, Owner/Env).
	Target string
	// Script names the scripted policy (default: the built-in's name).
	Script      string
	N           int
	Out         string
	Split       string
	Skill       float64
	Seed        uint64
	Concurrency int
	// Protocol and TokenEnv are --env's, as in run and list-tasks.
	Protocol string
	TokenEnv string
}

func newEnvDemosCmd(deps *Deps, runF func(context.Context, *EnvDemosOptions) error) *cobra.Command {
	opts := &EnvDemosOptions{}
	cmd := &cobra.Command{
		Use:   "demos NAME --out FILE",
		Short: "Write scripted demonstrations of an environment for supervised fine-tuning",
		Long: `Play an environment with a scripted policy, through its real protocol, and
write one episode per line to FILE as JSONL in TRL's conversational SFT format:
{"messages": [user prompt, assistant tool calls, tool answers, ...], "tools":
[the session's own tool schemas], "reward": R, "task_id": ID}. There is no
system message: the trainer adds its configured one. Feed the file to
'ortrain sft --config CONFIG --data FILE' (the config names the model, e.g.
configs/lockbox.yaml) to teach a model the env's tool calls before GRPO.

NAME is a built-in env with a scripted policy (` + strings.Join(demos.Scripts(), ", ") + `), builtin:NAME, or
any env target (a URL, Owner/Env) with --script naming the policy to play.
Episodes run on the tasks of --split in order, cycling when --n exceeds them.

--skill says how good the policy is: lockbox opens the envelope and copies
the code with probability --skill, else unlocks with a random code. The same
flags write the same file, byte for byte (--seed picks another draw). The file
is replaced atomically; a summary line goes to stderr.`,
		Example: `  # 512 perfect lockbox episodes to teach the two-turn tool call
  ortrain env demos lockbox --n 512 --out lockbox-sft.jsonl
  ortrain sft --config configs/lockbox.yaml --data lockbox-sft.jsonl --output-dir runs/lockbox-sft

  # mixed quality, over OpenEnv, from the validation tasks
  ortrain env demos lockbox --n 200 --skill 0.5 --split validation --protocol openenv --out mixed.jsonl

  # a lockbox served elsewhere
  ortrain env demos http://127.0.0.1:8080 --script lockbox --out demos.jsonl`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.IO = deps.IO
			opts.Getenv = deps.Getenv
			opts.Target = args[0]
			opts.Logger = deps.Logger.With().Str("command", "env-demos").Logger()
			if err := opts.validate(); err != nil {
				return err
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return runEnvDemos(cmd.Context(), opts)
		},
	}
	cmd.Flags().IntVar(&opts.N, "n", 256, "episodes to write")
	cmd.Flags().StringVar(&opts.Out, "out", "", "JSONL file to write (required; replaced atomically)")
	cmd.Flags().StringVar(&opts.Split, "split", demos.DefaultSplit, "task split to play")
	cmd.Flags().Float64Var(&opts.Skill, "skill", 1, "how good the scripted policy is, in [0, 1]")
	cmd.Flags().Uint64Var(&opts.Seed, "seed", 0, "seed of the policy's random choices")
	cmd.Flags().IntVar(&opts.Concurrency, "concurrency", demos.DefaultConcurrency, "episodes played at once")
	cmd.Flags().StringVar(&opts.Script, "script", "", "scripted policy to play (default: NAME's; one of "+strings.Join(demos.Scripts(), ", ")+")")
	addEnvTargetFlags(cmd.Flags(), &opts.Protocol, &opts.TokenEnv)
	return cmd
}

func (o *EnvDemosOptions) validate() error {
	switch {
	case o.Out == "":
		return usageErrorf("--out is required: the JSONL file to write, e.g. --out demos.jsonl")
	case o.N < 1:
		return usageErrorf("--n %d must be at least 1", o.N)
	case math.IsNaN(o.Skill) || o.Skill < 0 || o.Skill > 1:
		return usageErrorf("--skill %g must be in [0, 1] (1: always right, 0: never)", o.Skill)
	case o.Concurrency < 1:
		return usageErrorf("--concurrency %d must be at least 1", o.Concurrency)
	case o.Split == "":
		return usageErrorf("--split must not be empty")
	}
	target, script := demosTarget(o.Target)
	if script != "" && !strings.HasPrefix(o.Target, envtarget.BuiltinPrefix) {
		if _, err := envs.ProtocolOf(script); err != nil {
			return usageErrorf("%q is not a built-in env (those with a scripted policy: %s); for another env give its target (builtin:NAME, a URL, Owner/Env) and --script",
				o.Target, strings.Join(demos.Scripts(), ", "))
		}
	}
	if o.Script == "" {
		if script == "" {
			return usageErrorf("--script is required for %s: name the scripted policy to play (one of %s)", o.Target, strings.Join(demos.Scripts(), ", "))
		}
		o.Script = script
	}
	if _, err := demos.ScriptFor(o.Script); err != nil {
		return &UsageError{Err: err}
	}
	o.Target = target
	return nil
}

// demosTarget reads NAME: a bare name is the built-in env of that name.
// It returns the env target and the built-in's name ("" for other targets).
func demosTarget(name string) (target, builtin string) {
	if b, ok := strings.CutPrefix(name, envtarget.BuiltinPrefix); ok {
		b, _, _ = strings.Cut(b, "?")
		return name, b
	}
	if envtarget.KindOf(name) == envtarget.KindCatalog && !strings.Contains(name, "/") {
		return envtarget.BuiltinPrefix + name, name
	}
	return name, ""
}

func runEnvDemos(ctx context.Context, opts *EnvDemosOptions) error {
	// The output's path is checked first, before any episode is played.
	if fi, err := os.Stat(opts.Out); err == nil && fi.IsDir() {
		return usageErrorf("--out %s is a directory; give a file path such as %s", opts.Out, filepath.Join(opts.Out, "demos.jsonl"))
	}
	tmp, err := os.CreateTemp(filepath.Dir(opts.Out), "."+filepath.Base(opts.Out)+".tmp-*")
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return usageErrorf("--out %s: cannot write in %s (%v); pick a path in a writable directory", opts.Out, filepath.Dir(opts.Out), err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	env, err := envtarget.Resolve(ctx, opts.Target, envtarget.Options{Getenv: opts.Getenv, Logger: opts.Logger, Protocol: opts.Protocol, TokenEnv: opts.TokenEnv})
	if err != nil {
		return demosError(err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
		defer cancel()
		_ = env.Close(cctx)
	}()
	bw := bufio.NewWriter(tmp)
	dopts := demos.Options{Script: opts.Script, N: opts.N, Split: opts.Split, Skill: opts.Skill, Seed: opts.Seed, Concurrency: opts.Concurrency}
	if opts.IO.IsStderrTTY() {
		opts.IO.statusLine().showBar(opts.N, "episodes")
		defer opts.IO.statusLine().hideBar()
		dopts.Progress = func(int, int) {
			opts.IO.statusLine().update(func(b *progressbar.ProgressBar) { _ = b.Add(1) })
		}
	}
	sum, err := demos.Write(ctx, env, dopts, bw)
	if err != nil {
		return demosError(err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write %s: %w", opts.Out, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("write %s: %w", opts.Out, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("write %s: %w", opts.Out, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", opts.Out, err)
	}
	if err := os.Rename(tmp.Name(), opts.Out); err != nil {
		return fmt.Errorf("write %s: %w", opts.Out, err)
	}
	committed = true
	fmt.Fprintf(opts.IO.ErrOut, "wrote %d episodes to %s: mean reward %.3f, %.2f tool calls per episode\n",
		sum.Episodes, opts.Out, sum.MeanReward, sum.MeanToolCalls)
	return nil
}

// demosError names the flag behind a demos option error; target errors
// become usage errors as in list-tasks.
func demosError(err error) error {
	var te *envtarget.TargetError
	if errors.As(err, &te) {
		return &UsageError{Err: err} // it names the target; NAME is no --env flag
	}
	var oe *demos.OptionError
	if errors.As(err, &oe) {
		flag := map[string]string{"N": "--n", "Skill": "--skill", "Split": "--split", "Concurrency": "--concurrency"}[oe.Option]
		if flag == "" {
			flag = oe.Option
		}
		return usageErrorf("%s: %s", flag, oe.Reason)
	}
	var ns *demos.NoScriptError
	if errors.As(err, &ns) {
		return &UsageError{Err: fmt.Errorf("--script: %w", err)}
	}
	return targetError(err)
}
