// Package rollout runs episodes: one ORS session per rollout, many at once,
// each a turn loop of generate → parse tool calls → call tools → append
// results, with a deadline on every call and every episode, failures
// classified and counted, and sessions always closed.
package rollout

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/envtarget"
)

// Session is one episode's connection to its environment.
type Session = envtarget.Session

// Opener opens a session for one task of one environment (envtarget.Env
// is one).
type Opener interface {
	OpenSession(ctx context.Context, task envtarget.TaskRef) (Session, error)
}

// ToolCall is one call the model wrote (as parsed by internal/chat).
type ToolCall = chat.ToolCall

// ChatSpec is how conversations are rendered and read: the model's
// tokenizer and chat template, extra template variables, the tool-call
// format and the policy for templates that re-render history differently.
type ChatSpec struct {
	Tokenizer *chat.Tokenizer
	Template  *chat.Template
	Kwargs    map[string]any
	// Format overrides the tool-call format detected from the template.
	Format *chat.ToolCallFormat
	Policy chat.HistoryPolicy
	// HideTools leaves the tool list out of the rendered prompt (tools stay
	// callable); useful with a final-answer tool and tiny models.
	HideTools bool
}

func (c ChatSpec) newConversation(system, user string, tools []envtarget.ToolSpec) (*chat.Conversation, error) {
	ct := chatTools(tools)
	rendered := ct
	if c.HideTools {
		rendered = nil
	}
	// The offered tools' schemas type the model's arguments even when the
	// prompt does not show them.
	return chat.NewConversation(c.Tokenizer, c.Template, user, chat.ConversationOptions{
		System: system, Tools: rendered, ParseTools: ct, Kwargs: c.Kwargs, Policy: c.Policy, Format: c.Format,
	})
}

func chatTools(tools []envtarget.ToolSpec) []chat.Tool {
	ct := make([]chat.Tool, len(tools))
	for i, t := range tools {
		params := t.InputSchema
		if string(params) == "null" {
			params = nil
		}
		ct[i] = chat.Tool{Name: t.Name, Description: t.Description, Parameters: params}
	}
	return ct
}

// toolsDigest is the sha256 of the tool definitions the template rendered
// into the prompt ("" when none were), so a reader can tell which tool set,
// task-scoped tools included, reached the model.
func toolsDigest(tools []chat.Tool) string {
	if len(tools) == 0 {
		return ""
	}
	b, err := json.Marshal(tools)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// stopIDs end a turn: every end-of-turn id of the tokenizer.
func (c ChatSpec) stopIDs() []int32 { return c.Tokenizer.Special().EndOfTurn }

// Outcome classifies how an episode ended.
type Outcome string

const (
	OutcomeDone        Outcome = "done"       // a tool returned finished
	OutcomeStopped     Outcome = "stopped"    // the model ended without a tool call
	OutcomeIterations  Outcome = "iterations" // max_tool_calling_iterations reached
	OutcomeTruncated   Outcome = "truncated"  // the completion budget ran out mid-turn
	OutcomeBudget      Outcome = "budget"     // a tool turn would not fit the budget; rolled back
	OutcomeUnreachable Outcome = "env_unreachable"
	OutcomeEnvError    Outcome = "env_error"
	OutcomeTimeout     Outcome = "timeout"
	OutcomeGenError    Outcome = "generation_error"
	// OutcomeGenInvalid: the generation server answered with a completion
	// that cannot be trained on (a null or missing log-prob or token id;
	// engine.InvalidResultError), never read as a number.
	OutcomeGenInvalid Outcome = "generation_invalid"
	OutcomeCanceled   Outcome = "canceled"
	// OutcomeRewardError: a reward function failed for the rollout (an
	// http scorer down, an expression that failed); never scored as 0.
	OutcomeRewardError Outcome = "reward_error"
	// OutcomeRenderError: ortrain's own chat pipeline could not render the
	// next turn (for example the model stopped on a token that is not the
	// template's end-of-turn, so its turn cannot be closed token-exactly).
	// A local failure, never counted as the env's.
	OutcomeRenderError Outcome = "render_error"

	// Outcomes of rollouts played by a user's agent (the agent: section):
	// each is the agent's own failure, masked from the loss and counted.
	OutcomeAgentError      Outcome = "agent_error"       // crashed, non-zero exit, could not start, service error
	OutcomeAgentTimeout    Outcome = "agent_timeout"     // still running at rollout.episode_timeout
	OutcomeAgentBadOutput  Outcome = "agent_bad_output"  // its last stdout line (or answer) was not {"reward": number}
	OutcomeAgentBadRequest Outcome = "agent_bad_request" // a model call the gateway refused (malformed, wrong key)
	OutcomeAgentNoCalls    Outcome = "agent_no_calls"    // it ended without calling the model: nothing to train
)

// Outcomes lists every outcome, so counters can report the ones that did
// not happen as 0.
func Outcomes() []Outcome {
	return []Outcome{
		OutcomeDone, OutcomeStopped, OutcomeIterations, OutcomeTruncated, OutcomeBudget,
		OutcomeUnreachable, OutcomeEnvError, OutcomeTimeout, OutcomeGenError, OutcomeGenInvalid, OutcomeCanceled, OutcomeRewardError, OutcomeRenderError,
		OutcomeAgentError, OutcomeAgentTimeout, OutcomeAgentBadOutput, OutcomeAgentBadRequest, OutcomeAgentNoCalls,
	}
}

// Failed reports whether the outcome is an infrastructure failure: such
// rollouts are excluded from the loss and counted.
func (o Outcome) Failed() bool {
	switch o {
	case OutcomeUnreachable, OutcomeEnvError, OutcomeTimeout, OutcomeGenError, OutcomeGenInvalid, OutcomeCanceled, OutcomeRewardError, OutcomeRenderError,
		OutcomeAgentError, OutcomeAgentTimeout, OutcomeAgentBadOutput, OutcomeAgentBadRequest, OutcomeAgentNoCalls:
		return true
	}
	return false
}

// Turn is one step of the transcript, for trajectories.jsonl.
type Turn struct {
	Role      string     `json:"role"` // assistant or tool
	Text      string     `json:"text"`
	ToolCalls []TurnCall `json:"tool_calls,omitempty"`
	Tool      string     `json:"tool,omitempty"`
	Reward    *float64   `json:"reward,omitempty"`
	Finished  bool       `json:"finished,omitempty"`
	Error     string     `json:"error,omitempty"`
	// FormatError: an assistant turn wrote a tool call that did not parse.
	FormatError bool `json:"format_error,omitempty"`
}

// TurnCall is a tool call as written to trajectories.jsonl.
type TurnCall struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

func turnCalls(calls []ToolCall) []TurnCall {
	out := make([]TurnCall, len(calls))
	for i, c := range calls {
		args := c.Arguments
		if len(args) == 0 || !json.Valid(args) {
			args = json.RawMessage("null")
		}
		out[i] = TurnCall{Name: c.Name, Arguments: args}
	}
	return out
}

// Trajectory is the result of one rollout.
type Trajectory struct {
	Task   Task
	Prompt string
	Turns  []Turn
	// Tokens is prompt + completion; PromptLen splits them.
	Tokens    []int32
	PromptLen int
	// LossMask and Logprobs have one entry per completion token; Logprobs
	// are the sampler's (0 on tool and glue tokens).
	LossMask []uint8
	Logprobs []float32
	// Rewards holds each tool call's reward (nil = none).
	Rewards      []*float64
	ToolCalls    int
	ToolFailures int
	FormatErrors int
	// Divergences counts tool turns where the template re-rendered history
	// differently from the held tokens (kept as sampled; see chat.Divergence).
	Divergences int
	Outcome     Outcome
	Err         error
	// ToolsOffered names the tools the session offered; ToolsRendered says
	// whether the prompt showed them, ToolsSHA256 which definitions it showed.
	ToolsOffered  []string
	ToolsRendered bool
	ToolsSHA256   string
	// PromptText is the rendered prompt (with Options.LogPrompts).
	PromptText string
	// Metadata is the last metadata the env returned with a tool output.
	Metadata json.RawMessage
	// Forks are the further token sequences of an agent rollout whose agent
	// rewrote its history (Tokens is the first): each trains as its own row
	// with the rollout's advantage. PrefixBreaks counts the rewrites.
	Forks        []Fork
	PrefixBreaks int
	// Agent: a user's agent played the rollout (the agent: section);
	// AgentReward is the reward it reported (nil: none).
	Agent       bool
	AgentReward *float64
	// AgentCalls counts what the agent's calls asked for that the trainer
	// replaced or did not train; AgentStderr is the tail of a failed
	// agent's stderr (its key redacted), kept in trajectories.jsonl.
	AgentCalls  AgentCallStats
	AgentStderr string
	// Retries counts the attempts rerun because the session died with its
	// server (the trajectory is the last attempt's).
	Retries  int
	Duration time.Duration
	// Phase times, summed over the episode (busy time).
	GenTime, EnvTime time.Duration
	// GenSpans and EnvSpans are the episode's generate and env calls as
	// intervals, so a step's wall time per phase can be measured across
	// concurrent rollouts (the union of all of them), not just summed.
	GenSpans, EnvSpans []Span
}

// AgentCallStats counts, for one agent rollout, the calls the trainer
// served differently from what the agent asked, or did not train.
type AgentCallStats struct {
	// SamplingOverridden and SeedOverridden count model calls whose
	// sampling settings or seed the run replaced with its own.
	SamplingOverridden, SeedOverridden int
	// AfterFinish counts model calls made after a tool call had ended the
	// episode: answered, never trained. ToolCallsAfterFinish counts the
	// tool calls refused for the same reason.
	AfterFinish, ToolCallsAfterFinish int
	// DroppedTools counts tools the agent offered that the model cannot
	// call (hosted tools such as web_search), left out of its prompt.
	DroppedTools int
}

// Add sums o into s.
func (s *AgentCallStats) Add(o AgentCallStats) {
	s.SamplingOverridden += o.SamplingOverridden
	s.SeedOverridden += o.SeedOverridden
	s.AfterFinish += o.AfterFinish
	s.ToolCallsAfterFinish += o.ToolCallsAfterFinish
	s.DroppedTools += o.DroppedTools
}

// Fork is one more token sequence of a rollout: prompt + completion split
// at PromptLen, LossMask and Logprobs one per completion token, as in
// Trajectory.
type Fork struct {
	Tokens    []int32
	PromptLen int
	LossMask  []uint8
	Logprobs  []float32
}

// Span is one interval of wall-clock time.
type Span struct {
	Start, End time.Time
}

// addGen records a generate call that began at start and ends now.
func (t *Trajectory) addGen(start time.Time) {
	end := time.Now()
	t.GenTime += end.Sub(start)
	t.GenSpans = append(t.GenSpans, Span{Start: start, End: end})
}

// addEnv records an env call that began at start and ends now.
func (t *Trajectory) addEnv(start time.Time) {
	end := time.Now()
	t.EnvTime += end.Sub(start)
	t.EnvSpans = append(t.EnvSpans, Span{Start: start, End: end})
}

// Task is what a rollout runs: an env (by index into the runner's openers)
// and a task index in that env's split.
type Task struct {
	Env   int
	Split string
	Index int
	// Secrets are passed to the env constructor.
	Secrets map[string]string
	// Seed makes the episode's sampling reproducible; 0 derives one from
	// the runner's seed and the task's position.
	Seed int64
	// Version is the policy version the rollout samples with (the round's),
	// stamped on each model call an agent makes.
	Version int
}

// Classify maps an error from the env or the engine to an outcome: the
// deadline, a cancellation, an unreachable env, else an env error.
func Classify(ctx context.Context, err error) Outcome {
	var unreachable *envtarget.UnreachableError
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded):
		return OutcomeTimeout
	case errors.Is(err, context.Canceled) || errors.Is(ctx.Err(), context.Canceled):
		return OutcomeCanceled
	case errors.As(err, &unreachable):
		return OutcomeUnreachable
	}
	return OutcomeEnvError
}

func errText(err error) string { return fmt.Sprintf("Error: %v", err) }
