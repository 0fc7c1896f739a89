// Package envtarget resolves an environment target — a URL, a catalog name
// Owner/Env, or builtin:NAME — into a connected Env, whatever protocol it
// speaks. Env and Session are the protocol-neutral view the trainer, eval,
// list-tasks and rollouts use; ORS is one implementation (ors.go), and a
// second protocol plugs in as another.
package envtarget

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// Protocol names an environment standard.
type Protocol string

// ORS is the Open Reward Standard (sessions over HTTP/SSE, task lists on the server).
const ORS Protocol = "ors"

// BuiltinPrefix marks a built-in env served in-process on loopback.
const BuiltinPrefix = "builtin:"

// Kind says how a target string is read.
type Kind int

const (
	// KindURL is an http(s) URL: one origin for every call.
	KindURL Kind = iota
	// KindCatalog is Owner/Env on the hosted platform.
	KindCatalog
	// KindBuiltin is builtin:NAME, served in-process on loopback.
	KindBuiltin
)

// KindOf classifies a target string; only the syntax is looked at.
func KindOf(target string) Kind {
	switch {
	case strings.HasPrefix(target, BuiltinPrefix):
		return KindBuiltin
	case strings.Contains(target, "://"):
		return KindURL
	}
	return KindCatalog
}

// TaskRef names one task of an env: a split and an index in it.
type TaskRef struct {
	Split string
	Index int
	// Secrets reach the env constructor; never logged.
	Secrets map[string]string
}

// ToolSpec describes one tool offered to the model. A nil InputSchema means
// the tool takes no arguments.
type ToolSpec struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// ToolOutput is what one tool call returned.
type ToolOutput struct {
	Text     string
	Reward   *float64 // nil: the call gave no reward
	Finished bool     // the episode is over
	Metadata json.RawMessage
}

// Session is one episode's connection to an env. Implementations are safe
// for use by one rollout; every call is bounded by its context.
type Session interface {
	// Prompt is the task's prompt text.
	Prompt(ctx context.Context) (string, error)
	// Tools are the tools this session offers (task-scoped ones included).
	Tools(ctx context.Context) ([]ToolSpec, error)
	// CallTool runs one tool. A *ToolError means the tool refused or failed
	// and the model should see why; any other error is an infrastructure
	// failure of the session.
	CallTool(ctx context.Context, name string, input json.RawMessage) (*ToolOutput, error)
	Close(ctx context.Context) error
}

// Env is a connected environment.
type Env interface {
	Protocol() Protocol
	// Name is the env's readable name: the built-in name, the catalog name,
	// or the URL.
	Name() string
	// NumTasks counts the tasks of split.
	NumTasks(ctx context.Context, split string) (int, error)
	OpenSession(ctx context.Context, task TaskRef) (Session, error)
	// Describe lists tasks and tools for `ortrain list-tasks`.
	Describe(ctx context.Context, q Query) (*Listing, error)
	// Close releases the env: idle connections, and an in-process server
	// for builtin targets.
	Close(ctx context.Context) error
}

// Query selects what Describe lists.
type Query struct {
	Split string
	// Indices, when set, lists exactly these tasks; else NumTasks > 0
	// lists the first NumTasks; else all.
	Indices  []int
	NumTasks int
	// Tools also lists the tools, opening one session for task-scoped ones.
	Tools bool
}

// Task is one listed task with its spec as the env gave it.
type Task struct {
	Index int
	Spec  json.RawMessage
}

// ToolScope says where a listed tool comes from.
type ToolScope string

const (
	ScopeShared ToolScope = "shared" // offered for every task
	ScopeTask   ToolScope = "task"   // offered only by a session's task
)

// ListedTool is a tool with its scope.
type ListedTool struct {
	ToolSpec
	Scope ToolScope `json:"scope"`
}

// Listing is what Describe returns.
type Listing struct {
	Protocol Protocol
	Tasks    []Task
	Tools    []ListedTool // nil unless Query.Tools
	// OpenEnv only: /metadata, and the action and observation schemas of
	// /schema (an MCP env's action is a tool call).
	Metadata          json.RawMessage `json:"metadata,omitempty"`
	ActionSchema      json.RawMessage `json:"action_schema,omitempty"`
	ObservationSchema json.RawMessage `json:"observation_schema,omitempty"`
	MCP               bool            `json:"mcp,omitempty"`
}

// Options configure Resolve.
type Options struct {
	// Getenv reads OPENREWARD_* variables and the token variable (nil:
	// none set).
	Getenv func(string) string
	Logger zerolog.Logger
	// Protocol pins a URL target's protocol: "ors" or "openenv". "" or
	// "auto" detects it (both probes, bounded by ProbeTimeout). A builtin
	// speaks its own protocol unless pinned; catalog names are ORS.
	Protocol string
	// ProbeTimeout bounds each protocol probe of a URL (default 5 s).
	ProbeTimeout time.Duration
	// TokenEnv names the environment variable holding a bearer token for
	// an OpenEnv URL target (a private HF Space, a secured server); "" means
	// HF_TOKEN for *.hf.space hosts and none otherwise. The token is sent on
	// every OpenEnv request and WebSocket upgrade, and never logged.
	TokenEnv string
	// OpenEnv shapes an OpenEnv target's tasks and turns.
	OpenEnv OpenEnvOptions
	// ToolLatency slows every tool call of a builtin:NAME target (also
	// builtin:NAME?tool_latency=300ms); other targets refuse it.
	ToolLatency time.Duration
}

// CapacityWaiter is an Env that counts the capacity refusals its sessions
// waited out and retried: OpenEnv's CAPACITY_REACHED, ORS's busy answers
// (429, 503). Both Envs Resolve returns implement it.
type CapacityWaiter interface {
	// CapacityWaits is the running total since Resolve.
	CapacityWaits() int64
}

// Resolve connects to target. A builtin:NAME target is served on loopback
// until the Env is closed (the server outlives ctx, which bounds only the
// resolution). A URL target is probed for its protocol unless one is
// pinned; a URL that speaks neither (or not the pinned one) is a
// *ProtocolError, one that cannot be reached an *UnreachableError.
func Resolve(ctx context.Context, target string, opts Options) (Env, error) {
	if opts.Getenv == nil {
		opts.Getenv = func(string) string { return "" }
	}
	if target == "" {
		return nil, &TargetError{Target: target, Reason: "empty target"}
	}
	switch opts.Protocol {
	case "", string(ORS), string(OpenEnv), "auto":
	default:
		return nil, &TargetError{Target: target, Reason: fmt.Sprintf("protocol %q is not ors, openenv or auto", opts.Protocol)}
	}
	if opts.TokenEnv != "" && !envVarName(opts.TokenEnv) {
		// Not echoed: it may be the token itself.
		return nil, &TargetError{Target: target, Reason: "the token variable must be the name of an environment variable such as HF_TOKEN, not the token"}
	}
	if opts.ToolLatency != 0 && KindOf(target) != KindBuiltin {
		return nil, &TargetError{Target: target, Reason: "tool_latency slows built-in envs only (builtin:NAME targets); drop it for this one"}
	}
	switch KindOf(target) {
	case KindBuiltin:
		return resolveBuiltin(ctx, target, opts)
	case KindCatalog:
		if opts.Protocol == string(OpenEnv) {
			return nil, &TargetError{Target: target, Reason: "catalog names are ORS environments; an OpenEnv target is a URL (a Docker container or an HF Space)"}
		}
		return resolveORS(ctx, target, target, target, opts)
	}
	return resolveURL(ctx, target, opts)
}

// resolveURL probes a URL: the pinned protocol (then the other, to say
// what the server does speak), or both at once to detect it. OpenEnv wins
// when both answer: OpenEnv servers may serve ORS's task routes too.
func resolveURL(ctx context.Context, target string, opts Options) (Env, error) {
	u, err := url.Parse(target)
	if err != nil || u.Host == "" {
		return nil, &TargetError{Target: target, Reason: "not an http(s) URL with a host", Err: err}
	}
	switch u.Scheme {
	case "http", "https":
	case "ws", "wss": // OpenEnv clients take the socket's URL too
		u.Scheme = strings.Replace(u.Scheme, "ws", "http", 1)
	default:
		return nil, &TargetError{Target: target, Reason: "not an http(s) URL with a host"}
	}
	base := u.String()
	p := newProber(base, opts)
	defer p.close()
	connect := func(pr Probe) (Env, error) {
		if pr.Protocol == OpenEnv {
			return openOpenEnv(ctx, target, base, target, opts, pr.schema)
		}
		return resolveORS(ctx, target, base, target, opts)
	}
	if pinned := Protocol(opts.Protocol); pinned == ORS || pinned == OpenEnv {
		first := p.run(ctx, pinned)
		if first.OK {
			return connect(first)
		}
		if first.Status == 0 || first.auth() {
			return nil, p.failure(ctx, pinned, first)
		}
		other := p.run(ctx, otherProtocol(pinned))
		if ctx.Err() != nil {
			return nil, p.failure(ctx, pinned, first, other)
		}
		pe := p.protocolError(pinned, first, other)
		if other.OK {
			pe.Speaks = other.Protocol
		}
		return nil, pe
	}
	oe, or := p.both(ctx)
	for _, pr := range []Probe{oe, or} {
		if pr.OK {
			opts.Logger.Info().Str("env", target).Str("protocol", string(pr.Protocol)).Msg("protocol detected")
			return connect(pr)
		}
	}
	return nil, p.failure(ctx, "", oe, or)
}

// envVarName: letters, digits and '_', not starting with a digit, and not
// shaped like a Hugging Face token (hf_ and some 34 letters and digits).
func envVarName(s string) bool {
	if s == "" || (strings.HasPrefix(s, "hf_") && len(s) > 20) || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for _, r := range s {
		if r != '_' && !('a' <= r && r <= 'z') && !('A' <= r && r <= 'Z') && !('0' <= r && r <= '9') {
			return false
		}
	}
	return true
}

// TargetError is a target string that cannot name an env (a usage error).
type TargetError struct {
	Target string
	Reason string
	Err    error
}

func (e *TargetError) Error() string {
	msg := fmt.Sprintf("env target %q: %s", e.Target, e.Reason)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg + " (want a URL like http://127.0.0.1:8080, a catalog name Owner/Env, or builtin:NAME)"
}

func (e *TargetError) Unwrap() error { return e.Err }

// ToolError is a tool that refused its input or failed while running: the
// model sees Message as the tool turn, and the episode goes on.
type ToolError struct {
	Tool string
	Err  error
	// Raised: the tool itself failed while running (an ORS error event, an
	// OpenEnv EXECUTION_ERROR or MCP tool error) rather than refusing its
	// input; the model still sees it, but a smoke run counts it broken.
	Raised bool
}

func (e *ToolError) Error() string { return e.Err.Error() }
func (e *ToolError) Unwrap() error { return e.Err }

// UnreachableError is an env that could not be reached at all.
type UnreachableError struct {
	Target string
	Err    error
}

func (e *UnreachableError) Error() string { return e.Err.Error() }
func (e *UnreachableError) Unwrap() error { return e.Err }

// SessionLostError is a session that died with its server (restarted,
// reaped, or the connection cut mid-episode): a new session for the same
// task may succeed.
type SessionLostError struct {
	Target string
	Err    error
}

func (e *SessionLostError) Error() string { return e.Err.Error() }
func (e *SessionLostError) Unwrap() error { return e.Err }

// SplitError is a split the env does not have.
type SplitError struct {
	Target, Split string
	Valid         []string
}

func (e *SplitError) Error() string {
	return fmt.Sprintf("split %q is not a split of %s (valid splits: %s)", e.Split, e.Target, strings.Join(e.Valid, ", "))
}

// IndexError is a task index outside its split.
type IndexError struct {
	Split    string
	Index, N int
}

func (e *IndexError) Error() string {
	if e.N == 0 {
		return fmt.Sprintf("task index %d is out of range: split %q has no tasks", e.Index, e.Split)
	}
	return fmt.Sprintf("task index %d is out of range: split %q has %d tasks (0..%d)", e.Index, e.Split, e.N, e.N-1)
}

// SelectIndices returns the task indices a run draws from: the given
// indices (checked against the split size n), the first numTasks, or all.
func SelectIndices(split string, n int, indices []int, numTasks int) ([]int, error) {
	if len(indices) > 0 {
		for _, idx := range indices {
			if idx < 0 || idx >= n {
				return nil, &IndexError{Split: split, Index: idx, N: n}
			}
		}
		return append([]int(nil), indices...), nil
	}
	if numTasks > 0 {
		n = min(n, numTasks)
	}
	if n == 0 {
		return nil, fmt.Errorf("split %q has no tasks", split)
	}
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out, nil
}
