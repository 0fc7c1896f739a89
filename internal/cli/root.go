// Package cli holds ortrain's cobra commands, flag wiring and human output.
// Each command lives in its own file as an options struct, a constructor
// (newXCmd) and a run function (runX) that knows nothing about cobra.
package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
)

// Deps is the dependency bundle every command receives. Build it once in
// Main; tests build a literal with fakes. No package-level state.
type Deps struct {
	IO *IOStreams
	// Logger is set by the root command's pre-run from --log-level and
	// --log-format; constructors derive children with a "command" field
	// (packages below add "component": one key each, so no JSON log line
	// repeats a key).
	Logger zerolog.Logger
	// Getenv reads the process environment (a snapshot in tests).
	Getenv func(string) string
	// Environ returns the process environment as KEY=VALUE pairs.
	Environ func() []string
	// Executable is the path of the running binary (for re-exec'd children).
	Executable func() (string, error)
	// Argv0 is the binary as the user invoked it (bin/ortrain, ortrain), so
	// the commands ortrain suggests can be pasted as they are.
	Argv0 string
}

// SystemDeps returns the real dependencies.
func SystemDeps() *Deps {
	return &Deps{
		IO:         SystemIO(),
		Logger:     zerolog.Nop(),
		Getenv:     os.Getenv,
		Environ:    os.Environ,
		Executable: os.Executable,
		Argv0:      invokedAs(os.Args[0]),
	}
}

// invokedAs is how the user typed the binary: a path as given (bin/ortrain),
// or the bare name when it was found on PATH.
func invokedAs(arg0 string) string {
	if arg0 == "" {
		return "ortrain"
	}
	if strings.ContainsRune(arg0, filepath.Separator) {
		return arg0
	}
	return filepath.Base(arg0)
}

// Main runs ortrain with args and returns the process exit code. SIGINT and
// SIGTERM cancel the context; commands stop cleanly and save what they can.
func Main(ctx context.Context, args []string) int {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	return Execute(ctx, SystemDeps(), args)
}

// Execute runs the command tree against deps; tests call it directly.
func Execute(ctx context.Context, deps *Deps, args []string) int {
	root := NewRootCmd(deps)
	root.SetArgs(args)
	root.SetIn(deps.IO.In)
	root.SetOut(deps.IO.Out)
	root.SetErr(deps.IO.ErrOut)
	cmd, err := root.ExecuteContextC(ctx)
	if err != nil {
		if cmd == nil {
			cmd = root
		}
		printError(deps.IO.ErrOut, cmd.CommandPath(), err)
	}
	return exitCodeFor(err)
}

// globalFlags are the persistent flags every command accepts.
type globalFlags struct {
	logLevel  string
	logFormat string
}

// NewRootCmd builds the whole command tree.
func NewRootCmd(deps *Deps) *cobra.Command {
	g := &globalFlags{}
	root := &cobra.Command{
		Use:   "ortrain",
		Short: "Train LLM policies with GRPO against Open Reward Standard environments",
		Long: `ortrain trains language-model policies with GRPO against environments that speak
the Open Reward Standard (ORS). One binary: it opens one ORS session per rollout,
lets the policy call the environment's tools turn by turn, turns the rewards into
GRPO group advantages, and takes gradient steps in a libtorch worker. Generation
runs in that worker (default) or on vLLM servers ortrain launches and supervises.

Output: results go to stdout; logs, warnings and progress go to stderr.`,
		Example: `  # train the quickstart: a tiny model learns a built-in env on CPU
  ortrain run

  # what is installed, and what to do about what is not
  ortrain doctor

  # serve the built-in echo environment and look at its tasks and tools
  ortrain env serve echo --port 8080 &
  ortrain list-tasks --env http://127.0.0.1:8080 --tools

  # tasks of a hosted environment (needs OPENREWARD_API_KEY)
  ortrain list-tasks --env Eigent/SETA --num-tasks 5`,
		SilenceErrors: true,
		SilenceUsage:  true,
		// --version prints what `ortrain version` does.
		Version: Version(),
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			logger, err := newLogger(deps.IO, g.logLevel, g.logFormat)
			if err != nil {
				return err
			}
			deps.Logger = logger
			return nil
		},
	}
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", "info", "log level: trace, debug, info, warn, error")
	root.PersistentFlags().StringVar(&g.logFormat, "log-format", "auto", "log format: console, json, or auto (console on a terminal, json otherwise)")
	root.SetFlagErrorFunc(flagError)
	root.CompletionOptions.DisableDefaultCmd = true

	defer typeArgErrors(root)
	root.AddCommand(
		newVersionCmd(deps),
		newRunCmd(deps, nil),
		newSFTCmd(deps),
		newEvalCmd(deps, nil),
		newInitModelCmd(deps, nil),
		newServeEngineCmd(deps, nil),
		newServeVLLMCmd(deps, nil),
		newEnvCmd(deps),
		newRewardCmd(deps),
		newListTasksCmd(deps, nil),
		newDoctorCmd(deps, nil),
		newProbeWorkerCmd(deps),
		newReportCmd(deps, nil),
	)
	root.SetVersionTemplate(versionLine())
	return root
}

// typeArgErrors makes every argument error of the tree a *UsageError: each
// command's validator is wrapped, and a command with subcommands but no
// validator refuses unknown subcommands itself (cobra would return an
// untyped error) and prints its help when run bare.
func typeArgErrors(cmd *cobra.Command) {
	validate := cmd.Args
	if cmd.HasSubCommands() {
		if validate == nil {
			validate = unknownSubcommand
		}
		if !cmd.Runnable() {
			// cobra skips argument validation of commands that cannot run.
			cmd.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
		}
	}
	if validate != nil {
		cmd.Args = func(c *cobra.Command, args []string) error {
			if err := validate(c, args); err != nil {
				return &UsageError{Err: err}
			}
			return nil
		}
	}
	for _, sub := range cmd.Commands() {
		typeArgErrors(sub)
	}
}

// unknownSubcommand refuses any positional argument of a parent command,
// with cobra's suggestions.
func unknownSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's default, set lazily by cobra itself
	}
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "\n\nDid you mean this?\n\t" + strings.Join(s, "\n\t")
	}
	return errors.New(msg)
}
