package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/ortrain/ortrain/internal/envcheck"
	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/verdict"
)

// EnvCheckOptions are the inputs of `ortrain env check`.
type EnvCheckOptions struct {
	IO     *IOStreams
	Logger zerolog.Logger
	Getenv func(string) string

	// Target is a URL, or builtin:NAME to serve a built-in env on loopback
	// and check it.
	Target   string
	Protocol string
	Env      string
	Split    string
	TokenEnv string
	// JSON and JUnit name files for the machine-readable verdict ("-":
	// stdout instead of the text verdict).
	JSON, JUnit string
	Timeout     time.Duration
}

// ErrCheckFailed: the server failed at least one conformance case (exit 1).
var ErrCheckFailed = errors.New("env check failed")

func newEnvCheckCmd(deps *Deps, runF func(context.Context, *EnvCheckOptions) error) *cobra.Command {
	opts := &EnvCheckOptions{}
	cmd := &cobra.Command{
		Use:   "check URL",
		Short: "Check an env server against its standard (ORS or OpenEnv)",
		Long: `Run a conformance suite against a live env server and say, case by case,
what the standard expects and what the server did. The protocol is detected
(GET /schema answers OpenEnv, GET /list_environments ORS) unless --protocol
pins it.

ORS: health, the env list, tools (exactly name, description, input_schema),
splits, task counts, a task and a range (env_name included, as Python clients
require), the error statuses of a bad split, index and session, session
create (SSE framing checked strictly, as Python clients parse it), ping (the
keepalive), prompt, task tools, tool calls (an unknown tool is an ok:false
result, not an error), delete and delete_session.

OpenEnv: health, schema, metadata, reset/step/state over /ws, error frames,
MCP tools/list and tools/call, error codes and capacity.

Each case prints PASS, FAIL or SKIP (a case that needs one that failed); the
last line is the summary. The exit status is 0 when every case passed, 1 when
one failed. --json and --junit write the verdict for scripts and CI systems
(each case with its time); "-" writes it to stdout instead of the text.

URL may be builtin:NAME: the built-in env NAME is served on a free loopback
port (over --protocol, default its own) and checked, which is what ortrain's
own tests do.`,
		Example: `  # an ORS server you run
  ortrain env check http://127.0.0.1:8080

  # a built-in env over OpenEnv, the verdict as JUnit XML for CI
  ortrain env check builtin:lockbox --protocol openenv --junit env-check.xml

  # pin the env and split of a multi-env ORS server; JSON on stdout
  ortrain env check http://127.0.0.1:8080 --env letters --split validation --json -`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.IO = deps.IO
			opts.Getenv = deps.Getenv
			opts.Target = args[0]
			opts.Logger = deps.Logger.With().Str("command", "env-check").Logger()
			if err := opts.validate(); err != nil {
				return err
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return runEnvCheck(cmd.Context(), opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Protocol, "protocol", "", "the standard to check: ors or openenv (default: detected)")
	f.StringVar(&opts.Env, "env", "", "ORS: the environment to check (default: the URL's path, else the server's first)")
	f.StringVar(&opts.Split, "split", "", "ORS: the split to take tasks from (default: the first)")
	f.StringVar(&opts.TokenEnv, "token-env", "", "environment variable holding an API key, sent as X-API-Key and a bearer token")
	f.StringVar(&opts.JSON, "json", "", `write the verdict as JSON to this file ("-": stdout)`)
	f.StringVar(&opts.JUnit, "junit", "", `write the verdict as JUnit XML to this file ("-": stdout)`)
	f.DurationVar(&opts.Timeout, "timeout", 10*time.Second, "deadline of each request (a tool call gets 6x)")
	return cmd
}

func (o *EnvCheckOptions) validate() error {
	switch {
	case o.Protocol != "" && o.Protocol != envcheck.ORS && o.Protocol != envcheck.OpenEnv:
		return usageErrorf("--protocol %q: want ors or openenv (or leave it out to detect)", o.Protocol)
	case o.JSON == "-" && o.JUnit == "-":
		return usageErrorf(`--json - and --junit - both want stdout: write one of them to a file`)
	case o.Timeout <= 0:
		return usageErrorf("--timeout %s must be positive", o.Timeout)
	case o.TokenEnv != "" && o.Getenv(o.TokenEnv) == "":
		return usageErrorf("--token-env %s: that environment variable is empty", o.TokenEnv)
	}
	if name, ok := strings.CutPrefix(o.Target, "builtin:"); ok && name == "" {
		return usageErrorf("builtin: needs an env name, e.g. builtin:lockbox (see 'ortrain env list')")
	}
	return nil
}

func runEnvCheck(ctx context.Context, o *EnvCheckOptions) error {
	target := o.Target
	if name, ok := strings.CutPrefix(target, "builtin:"); ok {
		served, err := envs.ServeLocalProtocol(ctx, name, envs.Protocol(o.Protocol), envs.ServeOptions{})
		if err != nil {
			return &UsageError{Err: fmt.Errorf("serve %s: %w", target, err)}
		}
		defer func() {
			stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			_ = served.Stop(stopCtx)
		}()
		target = served.URL
		if o.Protocol == "" {
			o.Protocol = string(served.Protocol)
		}
		o.Logger.Info().Str("env", name).Str("url", target).Str("protocol", o.Protocol).Msg("serving the built-in env")
	}
	eo := envcheck.Options{Protocol: o.Protocol, Env: o.Env, Split: o.Split, RequestTimeout: o.Timeout, CallTimeout: 6 * o.Timeout}
	if o.TokenEnv != "" {
		key := o.Getenv(o.TokenEnv)
		eo.Header = http.Header{"X-Api-Key": {key}, "Authorization": {"Bearer " + key}}
	}
	v, err := envcheck.Check(ctx, target, eo)
	if err != nil {
		if errors.Is(err, envcheck.ErrBadTarget) {
			return &UsageError{Err: fmt.Errorf("%w (or builtin:NAME)", err)}
		}
		if v == nil || ctx.Err() == nil {
			return err
		}
	}
	v.Target = o.Target // builtin:NAME rather than its loopback port
	if err := writeVerdictFiles(o.IO, v, o.JSON, o.JUnit); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return &InterruptedError{What: "env check (the verdict covers the cases that ran)"}
	}
	if !v.Passed() {
		return fmt.Errorf("%w: %s", ErrCheckFailed, v.Summary())
	}
	return nil
}

// writeVerdictFiles writes the text verdict to stdout (unless a machine
// format goes there) and the JSON and JUnit verdicts asked for ("-":
// stdout).
func writeVerdictFiles(streams *IOStreams, v *verdict.Verdict, jsonPath, junitPath string) error {
	if jsonPath != "-" && junitPath != "-" {
		if err := v.WriteText(streams.Out); err != nil {
			return err
		}
	}
	for _, w := range []struct {
		path  string
		write func(io.Writer) error
	}{{jsonPath, v.WriteJSON}, {junitPath, v.WriteJUnit}} {
		switch w.path {
		case "":
		case "-":
			if err := w.write(streams.Out); err != nil {
				return err
			}
		default:
			if err := writeFileAtomic(w.path, w.write); err != nil {
				return fmt.Errorf("write the verdict: %w", err)
			}
		}
	}
	return nil
}

// writeFileAtomic writes path through a temporary file in its directory
// and a rename, so a CI artifact is never half written.
func writeFileAtomic(path string, write func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	if err := write(f); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
