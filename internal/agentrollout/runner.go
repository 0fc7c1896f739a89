// Package agentrollout plays rollouts with a user's own agent (the config's
// agent: section) in place of ortrain's turn loop: for each rollout it opens
// the env session, serves the policy to the agent as an OpenAI-compatible
// API (package gateway) and the session's tools as an MCP server (package
// envmcp) on one loopback listener, runs the agent (package agent), and
// turns what the engine recorded into a rollout.Trajectory the trainer
// trains on token for token.
package agentrollout

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/agent"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/envmcp"
	"github.com/ortrain/ortrain/internal/gateway"
	"github.com/ortrain/ortrain/internal/rollout"
)

// Options configure a Runner.
type Options struct {
	// Agent is what runs per rollout; its Timeout is the episode's.
	Agent agent.Spec
	// Gateway configures the API the agent calls. Sampler and Logger are
	// set by New (each rollout's calls are stamped with its task's
	// Version); Defaults.ForceSampling should be on in
	// training (the trainer explores with its own settings).
	Gateway gateway.Options
	// Listen is the address of the gateway and the MCP server
	// (127.0.0.1:0 by default).
	Listen string
	// EnvNames name the envs (by task.Env) in the task handed to the agent.
	EnvNames []string
	// SystemPrompt, when set, is the first message of the task's prompt.
	SystemPrompt   string
	MaxConcurrency int
	// MaxCompletionTokens bounds what is trained after a sequence's
	// prompt (grpo.max_completion_length), as ortrain's own loop bounds an
	// episode: a longer sequence is cut there and the rollout is truncated
	// (0: no bound).
	MaxCompletionTokens int
	// ToolAnnotations, when set, are the MCP annotations of every env tool
	// (agent.tool_annotations).
	ToolAnnotations map[string]any
	// CallTimeout bounds each env call ortrain makes itself (open, prompt,
	// tools) and each tool call the agent makes through MCP; CloseTimeout
	// bounds the cleanup after the agent ended.
	CallTimeout, CloseTimeout time.Duration
	// Conn bounds the listener's connections (zero: gateway's defaults).
	Conn   gateway.ConnLimits
	Logger zerolog.Logger
}

// Runner plays rollouts with the agent. It implements the trainer's
// rollout interface (RunAll) and must be closed.
type Runner struct {
	envs   []rollout.Opener
	gen    engine.Generator
	opts   Options
	gw     *gateway.Gateway
	mcp    *envmcp.Server
	srv    *http.Server
	base   string
	prefix string
	seq    atomic.Int64
	specs  sync.Map // specKey -> json.RawMessage: task specs already listed
	served chan error
}

// New starts the gateway and the MCP server on opts.Listen.
func New(envs []rollout.Opener, gen engine.Generator, opts Options) (*Runner, error) {
	if err := opts.Agent.Validate(); err != nil {
		return nil, err
	}
	if opts.MaxConcurrency < 1 {
		opts.MaxConcurrency = 1
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = 2 * time.Minute
	}
	if opts.CloseTimeout <= 0 {
		opts.CloseTimeout = 30 * time.Second
	}
	if opts.Listen == "" {
		opts.Listen = "127.0.0.1:0"
	}
	// A trainer killed earlier (kill -9, an OOM kill) left its agents'
	// children and directories behind: end them before starting more.
	if n, err := agent.ReapStale(opts.Agent.TempRoot); err != nil {
		opts.Logger.Warn().Err(err).Msg("look for agents left by a killed run")
	} else if n > 0 {
		opts.Logger.Warn().Int("agents", n).Msg("ended what agents of a killed ortrain left behind (processes and temporary directories)")
	}
	r := &Runner{envs: envs, gen: gen, opts: opts, served: make(chan error, 1)}
	gwOpts := opts.Gateway
	gwOpts.Sampler = gen
	gwOpts.Logger = opts.Logger.With().Str("component", "gateway").Logger()
	gw, err := gateway.New(gwOpts)
	if err != nil {
		return nil, fmt.Errorf("agent gateway: %w", err)
	}
	r.gw = gw
	mcpOpts := envmcp.Options{Logger: opts.Logger.With().Str("component", "mcp").Logger(), CallTimeout: opts.CallTimeout}
	if opts.ToolAnnotations != nil {
		mcpOpts.ToolAnnotations = envmcp.AnnotateAll(opts.ToolAnnotations)
	}
	r.mcp = envmcp.New(mcpOpts)
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("agent rollout ids: %w", err)
	}
	r.prefix = "r" + hex.EncodeToString(b[:])

	mux := http.NewServeMux()
	mux.Handle("/rollouts/", gw.Handler())
	mux.Handle("/mcp/", r.mcp.Handler())
	ln, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		return nil, fmt.Errorf("agent gateway: listen on %s (agent.listen): %w", opts.Listen, err)
	}
	r.base = "http://" + ln.Addr().String()
	r.srv = opts.Conn.Server(mux)
	go func() { r.served <- r.srv.Serve(ln) }()
	return r, nil
}

// BaseURL is where the gateway and the MCP server listen.
func (r *Runner) BaseURL() string { return r.base }

// Close stops the listener, waiting up to CloseTimeout for calls in flight.
func (r *Runner) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), r.opts.CloseTimeout)
	defer cancel()
	err := r.srv.Shutdown(ctx)
	if serr := <-r.served; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}

// RunAll plays tasks, at most MaxConcurrency at once, and returns their
// trajectories in task order; onDone (may be nil) sees each as it ends.
func (r *Runner) RunAll(ctx context.Context, tasks []rollout.Task, onDone func(*rollout.Trajectory)) []*rollout.Trajectory {
	var logged atomic.Int32
	return rollout.RunEach(ctx, tasks, r.opts.MaxConcurrency, func(_ int, t rollout.Task) *rollout.Trajectory {
		tr := r.Run(ctx, t)
		if tr.Outcome.Failed() && tr.Outcome != rollout.OutcomeCanceled && logged.Add(1) <= failuresLogged {
			r.logFailure(tr)
		}
		return tr
	}, onDone)
}

// failuresLogged is how many failed rollouts of a round are logged with
// their error and the agent's stderr; the rest are counted in metrics and
// kept in trajectories.jsonl.
const failuresLogged = 2

// logFailure says why a rollout failed: the error and the last lines of the
// agent's stderr (its key already redacted).
func (r *Runner) logFailure(tr *rollout.Trajectory) {
	ev := r.opts.Logger.Warn().Str("outcome", string(tr.Outcome)).Str("split", tr.Task.Split).Int("task", tr.Task.Index)
	if tr.Err != nil {
		ev = ev.Str("error", tr.Err.Error())
	}
	if tr.AgentStderr != "" {
		ev = ev.Str("stderr_tail", lastBytes(tr.AgentStderr, 1024))
	}
	ev.Msg("agent rollout failed (the first failures of each round are logged; all are in trajectories.jsonl)")
}
