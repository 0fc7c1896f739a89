// Package cli holds ortrain's cobra commands, flag wiring and human output.
// Each command lives in its own file as an options struct, a constructor
// (newXCmd) and a run function (runX) that knows nothing about cobra.
package cli

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
)

// Deps is the dependency bundle every command receives. Build it once in
// Main; tests build a literal with fakes. No package-level state.
type Deps struct {
	IO *IOStreams
	// Logger is set by the root command's pre-run from --log-level and
	// --log-format; constructors derive children with component fields.
	Logger zerolog.Logger
	// Getenv reads the process environment (a snapshot in tests).
	Getenv func(string) string
	// Environ returns the process environment as KEY=VALUE pairs.
	Environ func() []string
	Now     func() time.Time
	// Executable is the path of the running binary (for re-exec'd children).
	Executable func() (string, error)
}

// SystemDeps returns the real dependencies.
func SystemDeps() *Deps {
	return &Deps{
		IO:         SystemIO(),
		Logger:     zerolog.Nop(),
		Getenv:     os.Getenv,
		Environ:    os.Environ,
		Now:        time.Now,
		Executable: os.Executable,
	}
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
		// cobra's own flag errors are usage errors.
		var usage *UsageError
		if !errors.As(err, &usage) && isCobraUsageError(err) {
			err = &UsageError{Err: err}
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
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error { return &UsageError{Err: err} })
	root.CompletionOptions.DisableDefaultCmd = true

	root.AddCommand(
		newVersionCmd(deps),
		newRunCmd(deps, nil),
		newEvalCmd(deps, nil),
		newInitModelCmd(deps, nil),
		newServeEngineCmd(deps, nil),
		newServeVLLMCmd(deps, nil),
		newEnvCmd(deps),
		newListTasksCmd(deps, nil),
		newDoctorCmd(deps, nil),
		newProbeWorkerCmd(deps),
		newReportCmd(deps, nil),
	)
	return root
}

// isCobraUsageError recognises cobra's argument-validation errors, which
// are not routed through the flag error func.
func isCobraUsageError(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "accepts ", "requires at least", "requires at most", "unknown flag", "unknown shorthand flag", "invalid argument"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}
