package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

// EnvServeOptions are the inputs of `ortrain env serve`.
type EnvServeOptions struct {
	IO     *IOStreams
	Logger zerolog.Logger

	Name        string
	Host        string
	Port        int
	IdleTimeout time.Duration
	Protocol    string
	// ToolLatency makes every tool call sleep this long first.
	ToolLatency time.Duration
}

// newEnvCmd groups the built-in environment commands.
func newEnvCmd(deps *Deps) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "env",
		Short: "Serve, list and check environments; write demonstrations from them",
		Long: `Built-in Open Reward Standard environments, served over HTTP by ortrain itself.
They need no network and no Python: use them to try ortrain, in tests, and in
the CPU quickstart. Anywhere an --env target is accepted, builtin:NAME serves
the built-in env NAME in-process on a free loopback port.

Subcommands: list (the built-ins), serve (one over ORS or OpenEnv), demos
(scripted episodes as an SFT dataset for 'ortrain sft'), check (any env
server, built-in or not, against its standard).`,
		Example: `  ortrain env list
  ortrain env serve echo --port 8080`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newEnvServeCmd(deps, nil), newEnvListCmd(deps))
	cmd.AddCommand(newEnvDemosCmd(deps, nil), newEnvCheckCmd(deps, nil))
	return cmd
}

func newEnvServeCmd(deps *Deps, runF func(context.Context, *EnvServeOptions) error) *cobra.Command {
	opts := &EnvServeOptions{}
	cmd := &cobra.Command{
		Use:   "serve NAME",
		Short: "Serve a built-in environment over ORS or OpenEnv until interrupted",
		Long: `Serve the built-in environment NAME and print its base URL on stdout.

ORS envs (` + strings.Join(builtinNames(envs.ProtocolORS), ", ") + `) are served over the Open Reward Standard HTTP API by
default: the full protocol (SSE tool calls, resumable calls, idle reaping), so
the Python openreward SDK and TRL can use it too (set OPENREWARD_API_URL and
OPENREWARD_SESSION_URL to the URL). With --protocol openenv they are served
over OpenEnv instead, as MCP envs (reset with split+index or task_spec; their
tools become MCP tools). OpenEnv envs (` + strings.Join(builtinNames(envs.ProtocolOpenEnv), ", ") + `) are served over
OpenEnv: /health, /schema, /metadata, /ws sessions, /mcp, stateless /reset,
/step and /state, as openenv-core serves them.

--tool-latency makes every tool call (an OpenEnv env's every step) wait that
long before it runs, as a slow sandbox would: the env-bound case, measurable on
a laptop (builtin:NAME?tool_latency=300ms does the same for a training run).

Sessions idle for --idle-timeout (no request, no ping) are torn down.
SIGINT or SIGTERM stops the server gracefully: requests in flight finish and
every live session is torn down.

Built-in environments (see 'ortrain env list'): ` + strings.Join(envs.Names(), ", ") + `.`,
		Example: `  # serve the TRL echo fixture on port 8080 and list its tasks and tools
  ortrain env serve echo --port 8080 &
  ortrain list-tasks --env http://127.0.0.1:8080 --tools

  # the letters env as an OpenEnv MCP env, and the guessing game
  ortrain env serve letters --protocol openenv --port 8001 &
  ortrain env serve guess --port 8000

  # every tool call takes at least 300 ms
  ortrain env serve letters --port 8002 --tool-latency 300ms

  # listen on every interface
  ortrain env serve letters --host 0.0.0.0 --port 9000`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.IO = deps.IO
			opts.Name = args[0]
			opts.Logger = deps.Logger.With().Str("command", "env-serve").Str("env", args[0]).Logger()
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return runEnvServe(cmd.Context(), opts)
		},
	}
	cmd.Flags().StringVar(&opts.Host, "host", "127.0.0.1", "address to listen on")
	cmd.Flags().IntVar(&opts.Port, "port", 8080, "TCP port (0 picks a free one)")
	cmd.Flags().DurationVar(&opts.IdleTimeout, "idle-timeout", 15*time.Minute, "tear down sessions idle for this long")
	cmd.Flags().StringVar(&opts.Protocol, "protocol", "", "ors or openenv (default: the env's own protocol)")
	cmd.Flags().DurationVar(&opts.ToolLatency, "tool-latency", 0, "sleep this long in every tool call (e.g. 300ms)")
	return cmd
}

// shutdownGrace bounds a graceful stop of env serve.
const shutdownGrace = 10 * time.Second

func runEnvServe(ctx context.Context, opts *EnvServeOptions) error {
	if _, err := envs.ProtocolOf(opts.Name); err != nil {
		return &UsageError{Err: err}
	}
	switch opts.Protocol {
	case "", string(envs.ProtocolORS), string(envs.ProtocolOpenEnv):
	default:
		return usageErrorf("--protocol %q is not a protocol (allowed: ors, openenv)", opts.Protocol)
	}
	if opts.Port < 0 || opts.Port > 65535 {
		return usageErrorf("--port %d is not a TCP port (0-65535)", opts.Port)
	}
	if opts.IdleTimeout <= 0 {
		return usageErrorf("--idle-timeout %s must be positive (e.g. 15m)", opts.IdleTimeout)
	}
	if opts.ToolLatency < 0 {
		return usageErrorf("--tool-latency %s must be 0 or positive (e.g. 300ms)", opts.ToolLatency)
	}
	addr := net.JoinHostPort(opts.Host, strconv.Itoa(opts.Port))
	// Serve on a context that outlives ctx, so shutdown below gets its own
	// bounded deadline instead of the already-cancelled one.
	srv, err := envs.ListenProtocol(context.WithoutCancel(ctx), opts.Name, envs.Protocol(opts.Protocol), addr, envs.ServeOptions{
		ORS:         orsserver.Options{Logger: opts.Logger, IdleTimeout: opts.IdleTimeout, Version: Version()},
		OpenEnv:     openenvserver.Options{Logger: opts.Logger, IdleTimeout: opts.IdleTimeout},
		ToolLatency: opts.ToolLatency,
	})
	if err != nil {
		var notServable *envs.ProtocolError
		if errors.As(err, &notServable) {
			return &UsageError{Err: err}
		}
		return fmt.Errorf("serve env %s: %w (is the port in use? try --port 0)", opts.Name, err)
	}
	fmt.Fprintln(opts.IO.Out, srv.URL)
	opts.Logger.Info().Str("url", srv.URL).Str("protocol", string(srv.Protocol)).Msg("serving; stop with Ctrl-C")
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	err = srv.Stop(sctx)
	if srv.ORS != nil {
		st := srv.ORS.Stats()
		opts.Logger.Info().Int64("sessions_created", st.Created).Int64("sessions_torn_down", st.Deleted).Int64("tool_calls", st.ToolCalls).Msg("stopped")
	} else {
		st := srv.OpenEnv.Stats()
		opts.Logger.Info().Int64("sessions_created", st.Created).Int64("sessions_closed", st.Closed).Int64("sessions_reaped", st.Reaped).Msg("stopped")
	}
	if err != nil {
		return fmt.Errorf("stop env %s: %w", opts.Name, err)
	}
	return nil
}

func newEnvListCmd(deps *Deps) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the built-in environments",
		Long: `List the built-in environments: the name to pass to 'ortrain env serve' (or
builtin:NAME), the protocol it speaks natively, the env name it serves under
(the ORS env name, or OpenEnv's metadata name), and what it is for.`,
		Example: `  ortrain env list`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			tp := newTablePrinter(deps.IO.Out, deps.IO.IsStdoutTTY())
			tp.AddRow("NAME", "PROTOCOL", "ENV NAME", "DESCRIPTION")
			for _, e := range envs.List() {
				tp.AddRow(e.Key, string(e.Protocol), e.EnvName, e.Description)
			}
			return tp.Render()
		},
	}
}

// builtinNames lists the built-in envs whose native protocol is p, so the
// help never falls behind the registry.
func builtinNames(p envs.Protocol) []string {
	var out []string
	for _, info := range envs.List() {
		if info.Protocol == p {
			out = append(out, info.Key)
		}
	}
	return out
}
