package agentrollout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ortrain/ortrain/internal/agent"
	"github.com/ortrain/ortrain/internal/envmcp"
	"github.com/ortrain/ortrain/internal/envtarget"
	"github.com/ortrain/ortrain/internal/gateway"
	"github.com/ortrain/ortrain/internal/rollout"
)

// agentTask is ORTRAIN_TASK (and the task field of a URL agent's request):
// the prompt as chat messages, the session's tools in OpenAI's shape (also
// served over MCP), and where the task comes from.
type agentTask struct {
	Messages []taskMessage `json:"messages"`
	Tools    []taskTool    `json:"tools"`
	Env      string        `json:"env"`
	Split    string        `json:"split"`
	Index    int           `json:"index"`
	// Spec is the task as the env lists it (ORS task, OpenEnv reset
	// kwargs); absent when the env cannot list it.
	Spec json.RawMessage `json:"spec,omitempty"`
}

type taskMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type taskTool struct {
	Type     string       `json:"type"`
	Function taskFunction `json:"function"`
}

type taskFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
}

// Run plays one task: the env session opened, the agent run with its own
// gateway tenant and MCP endpoint, everything closed, the calls assembled.
func (r *Runner) Run(ctx context.Context, task rollout.Task) *rollout.Trajectory {
	tr := &rollout.Trajectory{Task: task, Agent: true}
	start := time.Now()
	defer func() { tr.Duration = time.Since(start) }()
	if task.Env < 0 || task.Env >= len(r.envs) {
		tr.Outcome, tr.Err = rollout.OutcomeEnvError, fmt.Errorf("task refers to env %d of %d", task.Env, len(r.envs))
		return tr
	}
	ctx, cancel := context.WithTimeout(ctx, r.opts.Agent.Timeout)
	defer cancel()

	// As in ortrain's own loop: opening is bounded by the call deadline,
	// not cut short by cancellation (a half-done create leaks a session).
	t0 := time.Now()
	octx, ocancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.CallTimeout)
	sess, err := r.envs[task.Env].OpenSession(octx, envtarget.TaskRef{Split: task.Split, Index: task.Index, Secrets: task.Secrets})
	ocancel()
	if err != nil {
		r.fail(ctx, tr, fmt.Errorf("open session for %s task %d: %w", task.Split, task.Index, err))
		return tr
	}
	defer r.closeSession(sess)
	prompt, tools, err := r.start(ctx, sess)
	tr.EnvSpans = append(tr.EnvSpans, rollout.Span{Start: t0, End: time.Now()})
	if err != nil {
		r.fail(ctx, tr, err)
		return tr
	}
	tr.Prompt = prompt
	for _, t := range tools {
		tr.ToolsOffered = append(tr.ToolsOffered, t.Name)
	}

	id := fmt.Sprintf("%s-%d", r.prefix, r.seq.Add(1))
	// A command agent's key is honoured only from its own process tree:
	// agents run as one uid, and one may read a sibling's key from its
	// environment (/proc/<pid>/environ). A URL agent has no tree here.
	owned := len(r.opts.Agent.Command) > 0
	// The tenant generates under ctx's values: with async rounds the
	// trainer names there the sampler copy (policy version) of the round.
	key, rec, err := r.gw.OpenFor(ctx, id, gateway.Tenant{Version: task.Version, Seed: task.Seed, RequireOwner: owned})
	if err != nil {
		tr.Outcome, tr.Err = rollout.OutcomeGenError, fmt.Errorf("open gateway tenant: %w", err)
		return tr
	}
	var ep *envmcp.Episode
	if owned {
		ep = r.mcp.AttachOwned(id, key, sess, tools)
	} else {
		ep = r.mcp.Attach(id, key, sess, tools)
	}
	at := r.agentTask(task, prompt, tools)
	at.Spec = r.taskSpec(ctx, task)
	taskJSON, err := json.Marshal(at)
	if err != nil {
		r.mcp.Detach(id)
		r.gw.Close(id)
		tr.Outcome, tr.Err = rollout.OutcomeEnvError, fmt.Errorf("encode the agent's task: %w", err)
		return tr
	}
	res := agent.Run(ctx, r.opts.Agent, agent.Facts{
		RolloutID: id, BaseURL: r.base + gateway.RolloutPath(id), APIKey: key,
		Model: r.opts.Gateway.Model, MCPURL: r.base + "/mcp/" + id, Task: taskJSON,
		OnStart: func(pid int) { r.bindOwner(id, ep, pid) },
	})
	// The records are final once both are closed: no call lands later.
	r.mcp.Detach(id)
	r.gw.Close(id)
	r.endSession(id)

	r.fill(tr, rec, ep, res)
	r.opts.Logger.Debug().Str("rollout", id).Str("outcome", string(tr.Outcome)).Int("model_calls", len(rec.Calls())).
		Int("tool_calls", tr.ToolCalls).Int("prefix_breaks", tr.PrefixBreaks).Float64("took_s", res.Duration.Round(time.Millisecond).Seconds()).Msg("agent rollout")
	return tr
}

// bindOwner binds the rollout's tenant and MCP episode to its agent's
// process tree. A failure leaves them unbound: the agent's calls are then
// refused (never another agent's calls admitted) and the rollout fails.
func (r *Runner) bindOwner(id string, ep *envmcp.Episode, pid int) {
	if err := r.gw.BindOwner(id, pid); err != nil {
		r.opts.Logger.Warn().Err(err).Str("rollout", id).Msg("bind the gateway tenant to its agent")
	}
	if err := ep.BindOwner(pid); err != nil {
		r.opts.Logger.Warn().Err(err).Str("rollout", id).Msg("bind the MCP endpoint to its agent")
	}
}

// start reads the session's prompt and tools under the call deadline.
func (r *Runner) start(ctx context.Context, sess rollout.Session) (string, []envtarget.ToolSpec, error) {
	cctx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
	defer cancel()
	prompt, err := sess.Prompt(cctx)
	if err != nil {
		return "", nil, fmt.Errorf("get prompt: %w", err)
	}
	tools, err := sess.Tools(cctx)
	if err != nil {
		return "", nil, fmt.Errorf("list tools: %w", err)
	}
	return prompt, tools, nil
}

func (r *Runner) agentTask(task rollout.Task, prompt string, tools []envtarget.ToolSpec) agentTask {
	at := agentTask{Split: task.Split, Index: task.Index, Tools: []taskTool{}}
	if task.Env < len(r.opts.EnvNames) {
		at.Env = r.opts.EnvNames[task.Env]
	}
	if r.opts.SystemPrompt != "" {
		at.Messages = append(at.Messages, taskMessage{Role: "system", Content: r.opts.SystemPrompt})
	}
	at.Messages = append(at.Messages, taskMessage{Role: "user", Content: prompt})
	for _, t := range tools {
		params := t.InputSchema
		if len(params) == 0 || string(params) == "null" {
			params = json.RawMessage(`{"type":"object","properties":{}}`)
		}
		at.Tools = append(at.Tools, taskTool{Type: "function", Function: taskFunction{Name: t.Name, Description: t.Description, Parameters: params}})
	}
	return at
}

// taskSpec is the task's spec as its env lists it, or nil when the env
// cannot list tasks (the agent then gets the prompt and tools only). A
// task's spec does not change, and each task is played num_generations
// times a round: it is asked of the env once.
func (r *Runner) taskSpec(ctx context.Context, task rollout.Task) json.RawMessage {
	key := specKey{task.Env, task.Split, task.Index}
	if spec, ok := r.specs.Load(key); ok {
		return spec.(json.RawMessage)
	}
	lister, ok := r.envs[task.Env].(interface {
		Describe(context.Context, envtarget.Query) (*envtarget.Listing, error)
	})
	if !ok {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
	defer cancel()
	l, err := lister.Describe(cctx, envtarget.Query{Split: task.Split, Indices: []int{task.Index}})
	if err != nil || len(l.Tasks) != 1 {
		r.opts.Logger.Debug().Err(err).Int("task", task.Index).Msg("no task spec for the agent")
		return nil
	}
	r.specs.Store(key, l.Tasks[0].Spec)
	return l.Tasks[0].Spec
}

// specKey names a task of an env's split.
type specKey struct {
	env   int
	split string
	index int
}

// fill turns what the gateway and the MCP server recorded into the
// trajectory: the calls' tokens (forks where the agent rewrote its
// history), the env's rewards, the agent's reward and the outcome.
func (r *Runner) fill(tr *rollout.Trajectory, rec *gateway.Recorder, ep *envmcp.Episode, res agent.Result) {
	toolCalls := ep.Calls()
	// Model calls made after a tool call ended the episode were answered
	// (a generic agent loop asks once more) but are not the episode's:
	// they are left out of the trained sequence and counted.
	calls, after := beforeFinish(rec.Calls(), toolCalls)
	tr.AgentCalls = callStats(rec.Calls(), toolCalls)
	tr.AgentCalls.AfterFinish = after
	tr.AgentCalls.DroppedTools = rec.DroppedResponseTools() + rec.DroppedMessageTools()
	// Tool calls refused after the end never reached the env: they are
	// counted above, not as the episode's tool calls.
	toolCalls = slices.DeleteFunc(slices.Clone(toolCalls), func(c envmcp.ToolCall) bool { return c.AfterFinish })
	if res.Outcome.AgentFault() {
		tr.AgentStderr = lastBytes(res.StderrTail, maxStderrKept)
	}
	tr.AgentReward = res.Reward
	tr.Rewards = ep.Rewards()
	tr.ToolCalls = len(toolCalls)
	for _, c := range toolCalls {
		if c.IsError || c.Err != "" {
			tr.ToolFailures++
		}
		tr.EnvTime += c.End.Sub(c.Start)
		tr.EnvSpans = append(tr.EnvSpans, rollout.Span{Start: c.Start, End: c.End})
	}
	for _, c := range calls {
		tr.GenTime += c.End.Sub(c.Start)
		tr.GenSpans = append(tr.GenSpans, rollout.Span{Start: c.Start, End: c.End})
	}
	tr.Turns = r.turns(calls, toolCalls)
	asm := gateway.Assemble(calls)
	tr.PrefixBreaks = asm.PrefixBreaks
	truncated := false
	for i := range asm.Segments {
		if cutSegment(&asm.Segments[i], r.opts.MaxCompletionTokens) && i == 0 {
			truncated = true
		}
	}
	for i, s := range asm.Segments {
		if i == 0 {
			tr.Tokens, tr.PromptLen, tr.LossMask, tr.Logprobs = s.Tokens, s.PromptLen, s.LossMask, s.Logprobs
			continue
		}
		tr.Forks = append(tr.Forks, rollout.Fork{Tokens: s.Tokens, PromptLen: s.PromptLen, LossMask: s.LossMask, Logprobs: s.Logprobs})
	}
	tr.Outcome, tr.Err = outcome(res, rec, toolCalls, len(calls), ep.Finished())
	if truncated && !tr.Outcome.Failed() {
		// As ortrain's own loop: the completion budget ran out; the
		// tokens past it are not trained (and the rest is masked with
		// mask_truncated_completions).
		tr.Outcome = rollout.OutcomeTruncated
	}
}

// cutSegment cuts s to its prompt plus at most limit tokens after it (0:
// no bound) and reports whether it cut anything.
func cutSegment(s *gateway.Segment, limit int) bool {
	if limit <= 0 || len(s.Tokens)-s.PromptLen <= limit {
		return false
	}
	s.Tokens = s.Tokens[:s.PromptLen+limit]
	s.LossMask, s.Logprobs = s.LossMask[:limit], s.Logprobs[:limit]
	return true
}

// outcome classifies the rollout: the agent's own ending first, then what
// the gateway refused or failed, then whether there is anything to train.
func outcome(res agent.Result, rec *gateway.Recorder, toolCalls []envmcp.ToolCall, calls int, finished bool) (rollout.Outcome, error) {
	switch res.Outcome {
	case agent.OutcomeTimeout:
		return rollout.OutcomeAgentTimeout, res.Err
	case agent.OutcomeCanceled:
		return rollout.OutcomeCanceled, res.Err
	case agent.OutcomeAgentError:
		return rollout.OutcomeAgentError, res.Err
	case agent.OutcomeBadOutput:
		return rollout.OutcomeAgentBadOutput, res.Err
	}
	if n := rec.Rejected(); n > 0 {
		first := rec.Rejections()[0]
		route := first.Route
		if route == "" {
			route = "a request"
		}
		return rollout.OutcomeAgentBadRequest, fmt.Errorf("the gateway refused %d of the agent's model calls (first: %s answered %d: %s)",
			n, route, first.Status, first.Message)
	}
	if n := rec.InvalidResults(); n > 0 {
		return rollout.OutcomeGenInvalid, fmt.Errorf("%d of the agent's model calls got a completion the generation server left without log-probs or token ids (first: %s)",
			n, firstFailure(rec.Rejections()))
	}
	if n := rec.Failed(); n > 0 {
		return rollout.OutcomeGenError, fmt.Errorf("%d of the agent's model calls failed in the engine", n)
	}
	for _, c := range toolCalls {
		if c.Err != "" && !c.IsError {
			return rollout.OutcomeEnvError, fmt.Errorf("tool %s: %s", c.Name, c.Err)
		}
	}
	switch {
	case calls == 0:
		return rollout.OutcomeAgentNoCalls, errors.New("the agent ended without calling the model")
	case finished:
		return rollout.OutcomeDone, nil
	}
	return rollout.OutcomeStopped, nil
}

// turns is the transcript for trajectories.jsonl and reward functions:
// each model call's completion (decoded) and each tool call, in time order.
func (r *Runner) turns(calls []gateway.Call, toolCalls []envmcp.ToolCall) []rollout.Turn {
	type timed struct {
		at   time.Time
		turn rollout.Turn
	}
	var all []timed
	tok := r.opts.Gateway.Tokenizer
	for _, c := range calls {
		all = append(all, timed{c.Start, rollout.Turn{Role: "assistant", Text: tok.Decode(c.CompletionIDs, false), FormatError: c.MalformedToolCalls > 0}})
	}
	for _, c := range toolCalls {
		t := rollout.Turn{Role: "tool", Tool: c.Name, Text: c.Result, Reward: c.Reward, Finished: c.Finished, Error: c.Err}
		all = append(all, timed{c.Start, t})
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].at.Before(all[j].at) })
	out := make([]rollout.Turn, len(all))
	for i, t := range all {
		out[i] = t.turn
	}
	return out
}

// fail records an env failure before the agent ran, classified as
// ortrain's own rollouts classify it.
func (r *Runner) fail(ctx context.Context, tr *rollout.Trajectory, err error) {
	tr.Err, tr.Outcome = err, rollout.Classify(ctx, err)
}

func (r *Runner) closeSession(sess rollout.Session) {
	if err := rollout.CloseSession(sess, r.opts.CloseTimeout); err != nil {
		r.opts.Logger.Warn().Err(err).Msg("close env session")
	}
}

// endSession drops the engine's state for the rollout (the builtin
// engine's KV cache), as ortrain's own loop does.
func (r *Runner) endSession(id string) {
	if err := rollout.EndEngineSession(r.gen, id, r.opts.CloseTimeout); err != nil {
		r.opts.Logger.Warn().Err(err).Str("session", id).Msg("end engine session")
	}
}

// maxStderrKept bounds the stderr tail a failed agent's trajectory keeps.
const maxStderrKept = 4 << 10

// beforeFinish returns the model calls dispatched before the tool call that
// ended the episode returned (all of them when none did), and how many
// came after.
func beforeFinish(calls []gateway.Call, toolCalls []envmcp.ToolCall) ([]gateway.Call, int) {
	var end time.Time
	for _, c := range toolCalls {
		if c.Finished {
			end = c.End
			break
		}
	}
	if end.IsZero() {
		return calls, 0
	}
	kept := calls[:0:0]
	for _, c := range calls {
		if c.Start.Before(end) {
			kept = append(kept, c)
		}
	}
	return kept, len(calls) - len(kept)
}

// callStats counts the calls the run served differently from what the
// agent asked, and the tool calls made after the episode ended.
func callStats(calls []gateway.Call, toolCalls []envmcp.ToolCall) rollout.AgentCallStats {
	var st rollout.AgentCallStats
	for _, c := range calls {
		if c.SamplingOverridden {
			st.SamplingOverridden++
		}
		if c.SeedOverridden {
			st.SeedOverridden++
		}
	}
	for _, c := range toolCalls {
		if c.AfterFinish {
			st.ToolCallsAfterFinish++
		}
	}
	return st
}

// lastBytes is the end of s, at most n bytes, cut at a line start when one
// is near.
func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	if i := strings.IndexByte(s, '\n'); i >= 0 && i < 256 {
		s = s[i+1:]
	}
	return s
}

// firstFailure is the message of the first failed (5xx) call.
func firstFailure(rs []gateway.Rejection) string {
	for _, r := range rs {
		if r.Status >= 500 {
			return r.Message
		}
	}
	return "not recorded"
}
