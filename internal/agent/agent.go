// Package agent runs a user's own agent once per rollout, either as a local
// process (agent.command) or as an HTTP agent service (agent.url), hands it
// the facts of the rollout (model endpoint, key, task, MCP URL), enforces the
// rollout's deadline and says how the run ended. Recording the agent's model
// calls is not done here: the caller points BaseURL at its own gateway.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// DefaultKillGrace is how long a timed-out or canceled agent's process group
// may take to exit after SIGTERM before it is SIGKILLed, when Spec.KillGrace
// is zero.
const DefaultKillGrace = 5 * time.Second

// DefaultTailBytes is how much of each output stream Result keeps, when
// Spec.TailBytes is zero.
const DefaultTailBytes = 64 << 10

// Spec says which agent to run and under which limits. Exactly one of
// Command and URL is set.
type Spec struct {
	// Command is the agent's argv. A relative program path (./agent) is
	// resolved against ortrain's working directory, because the agent itself
	// runs in a fresh temporary directory; relative paths among the
	// arguments are the agent's business and resolve in that directory.
	Command []string
	// Env sets variables for a command agent (KEY=VALUE), and InheritEnv
	// names variables of ortrain's own environment it may see beyond the
	// allow-list (env.go): an agent gets none of the trainer's credentials
	// unless the config names them.
	Env        []string
	InheritEnv []string
	// URL is an HTTP agent service that is POSTed the facts once per rollout.
	URL string
	// Timeout bounds one run of the agent; it must be positive.
	Timeout time.Duration
	// KillGrace is the time between SIGTERM and SIGKILL to the agent's
	// process group (0: DefaultKillGrace).
	KillGrace time.Duration
	// TempRoot holds the agent's per-run working directories ("": the
	// system's temporary directory).
	TempRoot string
	// TailBytes is how many trailing bytes of stdout and of stderr (or of a
	// URL agent's response body) Result keeps (0: DefaultTailBytes).
	TailBytes int
	// HTTPClient sends URL agents' requests (nil: a client on
	// http.DefaultTransport). Its own Timeout, if any, applies as well.
	HTTPClient *http.Client
}

// Validate names the first field that is wrong, as the config spells it.
func (s Spec) Validate() error {
	switch {
	case len(s.Command) > 0 && s.URL != "":
		return errors.New("agent.command and agent.url: set exactly one, not both")
	case len(s.Command) == 0 && s.URL == "":
		return errors.New("agent.command or agent.url: one is required")
	}
	if len(s.Command) > 0 && strings.TrimSpace(s.Command[0]) == "" {
		return errors.New("agent.command: the program (first element) is empty")
	}
	if s.URL != "" {
		u, err := url.Parse(s.URL)
		if err != nil {
			// The parse error repeats the URL, which may carry credentials.
			var uerr *url.Error
			if errors.As(err, &uerr) {
				err = uerr.Err
			}
			return fmt.Errorf("agent.url: not a valid URL: %w", err)
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("agent.url: %q is not an absolute http(s) URL", u.Redacted())
		}
	}
	for _, kv := range s.Env {
		if name, _, ok := strings.Cut(kv, "="); !ok || name == "" {
			return fmt.Errorf("agent.env: %q is not NAME=VALUE", kv)
		}
	}
	if s.Timeout <= 0 {
		return fmt.Errorf("agent.timeout: must be positive, got %s", s.Timeout)
	}
	if s.KillGrace < 0 {
		return fmt.Errorf("agent.kill_grace: must not be negative, got %s", s.KillGrace)
	}
	if s.TailBytes < 0 {
		return fmt.Errorf("agent.tail_bytes: must not be negative, got %d", s.TailBytes)
	}
	return nil
}

func (s Spec) killGrace() time.Duration {
	if s.KillGrace == 0 {
		return DefaultKillGrace
	}
	return s.KillGrace
}

func (s Spec) tailBytes() int {
	if s.TailBytes == 0 {
		return DefaultTailBytes
	}
	return s.TailBytes
}

// Facts are what one rollout's agent is told.
type Facts struct {
	RolloutID string
	// BaseURL is the OpenAI-compatible endpoint the agent must call.
	BaseURL string
	// APIKey authenticates the agent to BaseURL; it never appears in
	// anything this package constructs.
	APIKey string
	Model  string
	// MCPURL is the environment's tool server ("": none).
	MCPURL string
	// Task is the rollout's task as JSON (nil: null).
	Task json.RawMessage
	// OnStart, when set, is called with a command agent's pid as soon as
	// it has started, before Run waits for it: the caller binds the
	// rollout's endpoints to the agent's process tree (the agent may
	// already be calling them). Not called for URL agents or an agent
	// that failed to start.
	OnStart func(pid int)
}

// AnthropicBaseURL is BaseURL without its /v1: Anthropic's clients append
// /v1/messages to ANTHROPIC_BASE_URL themselves.
func (f Facts) AnthropicBaseURL() string { return strings.TrimSuffix(f.BaseURL, "/v1") }

func (f Facts) taskJSON() (json.RawMessage, error) {
	if len(f.Task) == 0 {
		return json.RawMessage("null"), nil
	}
	if !json.Valid(f.Task) {
		return nil, errors.New("facts: the task is not valid JSON")
	}
	return f.Task, nil
}

// Outcome is how one run of an agent ended.
type Outcome string

const (
	// OutcomeOK: the agent finished; it may have reported a reward.
	OutcomeOK Outcome = "ok"
	// OutcomeAgentError: non-zero exit, death by signal, could not start,
	// or a URL agent that failed or answered non-2xx.
	OutcomeAgentError Outcome = "agent_error"
	// OutcomeTimeout: Spec.Timeout or the caller's deadline passed first.
	OutcomeTimeout Outcome = "agent_timeout"
	// OutcomeBadOutput: the agent's reward report is malformed.
	OutcomeBadOutput Outcome = "agent_bad_output"
	// OutcomeCanceled: the caller canceled the run; not the agent's fault.
	OutcomeCanceled Outcome = "canceled"
)

// Failed reports whether the run produced no usable result.
func (o Outcome) Failed() bool { return o != OutcomeOK }

// AgentFault reports whether the failure is the agent's own (everything but
// ok and canceled), so that canceled rollouts are not counted against it.
func (o Outcome) AgentFault() bool { return o.Failed() && o != OutcomeCanceled }

// Result is how one run went.
type Result struct {
	Outcome Outcome
	// Reward is what the agent reported, nil when it reported none.
	Reward *float64
	// ExitCode is the command agent's exit status: -1 when it was killed by
	// a signal or never started; 0 for URL agents.
	ExitCode int
	// StderrTail and StdoutTail are the last Spec.TailBytes of the agent's
	// output with Facts.APIKey redacted; for a URL agent StdoutTail is its
	// response body.
	StderrTail, StdoutTail string
	Duration               time.Duration
	// Err says what went wrong; nil for ok.
	Err error
}

// Run runs the agent of spec once with facts and classifies how it ended.
// It returns within about Timeout+KillGrace (sooner when ctx ends first) and
// leaves no process of the agent's group and no temporary directory behind.
func Run(ctx context.Context, spec Spec, facts Facts) Result {
	started := time.Now()
	res := run(ctx, spec, facts)
	res.Duration = time.Since(started)
	res.StdoutTail = redact(res.StdoutTail, facts.APIKey)
	res.StderrTail = redact(res.StderrTail, facts.APIKey)
	return res
}

func run(ctx context.Context, spec Spec, facts Facts) Result {
	if err := spec.Validate(); err != nil {
		return Result{Outcome: OutcomeAgentError, ExitCode: -1, Err: err}
	}
	if err := ctx.Err(); err != nil {
		return Result{Outcome: endedBy(ctx), ExitCode: -1, Err: fmt.Errorf("agent not started: %w", err)}
	}
	if spec.URL != "" {
		return runService(ctx, spec, facts)
	}
	return runCommand(ctx, spec, facts)
}

// endedBy classifies a run stopped because runCtx (derived from the caller's
// ctx) ended: the caller's cancel is not the agent's fault, any deadline is.
func endedBy(callerCtx context.Context) Outcome {
	if errors.Is(callerCtx.Err(), context.Canceled) {
		return OutcomeCanceled
	}
	return OutcomeTimeout
}

const redacted = "[REDACTED]"

// minKeyFragment is the shortest piece of the key, cut off at the start of a
// truncated tail, that is still masked.
const minKeyFragment = 4

// redact masks every occurrence of key in s, and a trailing piece of the key
// at the very start of s (where a tail may have cut the key in two).
func redact(s, key string) string {
	if key == "" || s == "" {
		return s
	}
	s = strings.ReplaceAll(s, key, redacted)
	for n := min(len(key)-1, len(s)); n >= minKeyFragment; n-- {
		if strings.HasPrefix(s, key[len(key)-n:]) {
			return redacted + s[n:]
		}
	}
	return s
}
