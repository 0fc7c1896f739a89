// episode.go: one rollout's turn loop (the model's turns, tool calls, the
// final answer) over a session the Runner opened.

package rollout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/envtarget"
)

// EnvChat is how the conversations of one env's rollouts look: the chat
// settings an env entry can set for itself.
type EnvChat struct {
	SystemPrompt    string
	FinalAnswerTool string
	HideTools       bool
	Kwargs          map[string]any
}

// envChat is the episode's env's own chat settings (nil: the runner's).
func (e *episode) envChat() *EnvChat {
	if i := e.tr.Task.Env; i < len(e.r.opts.EnvChat) {
		return e.r.opts.EnvChat[i]
	}
	return nil
}

func (e *episode) finalAnswerTool() string {
	if ec := e.envChat(); ec != nil {
		return ec.FinalAnswerTool
	}
	return e.r.opts.FinalAnswerTool
}

// episode is the state of one running turn loop.
type episode struct {
	r     *Runner
	tr    *Trajectory
	sess  Session
	conv  *chat.Conversation
	tools []envtarget.ToolSpec
	// keep is how many tokens of the conversation belong to the trajectory
	// (a tool turn that overflowed the budget is cut off); -1 = all.
	keep int
	seed int64
	done bool
	// sessionKey names this attempt's turns to the engine (engine.Request.SessionKey).
	sessionKey string
}

func (e *episode) run(ctx context.Context) error {
	r, tr := e.r, e.tr
	prompt, tools, err := e.start(ctx)
	if err != nil {
		return err
	}
	tr.Prompt, e.tools, e.keep = prompt, tools, -1
	system := r.opts.SystemPrompt
	chatSpec := r.chat
	if ec := e.envChat(); ec != nil {
		system, chatSpec.HideTools, chatSpec.Kwargs = ec.SystemPrompt, ec.HideTools, ec.Kwargs
	}
	for _, t := range tools {
		tr.ToolsOffered = append(tr.ToolsOffered, t.Name)
	}
	tr.ToolsRendered = !chatSpec.HideTools && len(tools) > 0
	if tr.ToolsRendered {
		tr.ToolsSHA256 = toolsDigest(chatTools(tools))
	}
	conv, err := chatSpec.newConversation(system, prompt, tools)
	if err != nil {
		tr.Outcome = OutcomeRenderError
		return fmt.Errorf("render prompt: %w", err)
	}
	e.conv = conv
	promptLen := len(conv.PromptIDs())
	if r.opts.LogPrompts {
		tr.PromptText = r.chat.Tokenizer.Decode(conv.PromptIDs(), false)
	}
	defer e.snapshot(promptLen)
	for iter := 0; ; iter++ {
		ids := conv.IDs()
		budget := r.opts.MaxCompletionTokens - (len(ids) - promptLen)
		if budget <= 0 {
			tr.Outcome = OutcomeTruncated
			return nil
		}
		res, err := e.generate(ctx, ids, budget, iter)
		if err != nil {
			tr.Outcome = OutcomeGenError
			var invalid *engine.InvalidResultError
			if errors.As(err, &invalid) {
				tr.Outcome = OutcomeGenInvalid
			}
			if ctx.Err() != nil {
				tr.Outcome = Classify(ctx, ctx.Err())
			}
			return fmt.Errorf("generate turn %d: %w", iter, err)
		}
		msg, perr := conv.AppendSampled(res.IDs)
		tr.Logprobs = append(tr.Logprobs, res.Logprobs...)
		tr.Turns = append(tr.Turns, Turn{Role: "assistant", Text: r.chat.Tokenizer.Decode(res.IDs, false), ToolCalls: turnCalls(msg.ToolCalls)})
		if res.StopReason == engine.StopLength {
			tr.Outcome = OutcomeTruncated
			if e.finalAnswerTool() != "" {
				return e.submitFinal(ctx, msg.Content, OutcomeTruncated)
			}
			return nil
		}
		if perr != nil {
			tr.FormatErrors++
			tr.Turns[len(tr.Turns)-1].FormatError = true
		}
		actor, textAction := e.sess.(envtarget.TextActor)
		if len(msg.ToolCalls) == 0 && perr == nil && !textAction {
			return e.submitFinal(ctx, msg.Content, OutcomeStopped)
		}
		if iter >= r.opts.MaxToolIterations {
			tr.Outcome = OutcomeIterations
			return nil
		}
		var turn []chat.Message
		if textAction {
			// The plain answer is the env's action; its observation is the
			// next user turn.
			obs, err := e.textAction(ctx, actor, msg.Content)
			if err != nil {
				return err
			}
			turn = []chat.Message{{Role: "user", Content: obs}}
		} else {
			results, err := e.callTools(ctx, msg.ToolCalls, perr)
			if err != nil {
				return err
			}
			turn = toolMessages(results)
		}
		if stop, err := e.appendTurn(promptLen, turn); stop || err != nil {
			return err
		}
		if e.done {
			tr.Outcome = OutcomeDone
			return nil
		}
	}
}

// start reads the prompt and the session's own tools (task-scoped ones included).
func (e *episode) start(ctx context.Context) (string, []envtarget.ToolSpec, error) {
	var prompt string
	var tools []envtarget.ToolSpec
	_, err := e.r.callEnv(ctx, e.tr, func(cctx context.Context) (Session, error) {
		var err error
		if prompt, err = e.sess.Prompt(cctx); err != nil {
			return nil, fmt.Errorf("get prompt: %w", err)
		}
		if tools, err = e.sess.Tools(cctx); err != nil {
			return nil, fmt.Errorf("list tools: %w", err)
		}
		return nil, nil
	})
	if err != nil {
		return "", nil, err
	}
	return prompt, tools, nil
}

func (e *episode) generate(ctx context.Context, ids []int32, budget, iter int) (engine.Result, error) {
	t0 := time.Now()
	defer func() { e.tr.addGen(t0) }()
	seed := e.seed
	if seed != 0 {
		seed = seed*1000003 + int64(iter)
	}
	return e.r.gen.Generate(ctx, engine.Request{
		PromptIDs:  ids,
		MaxTokens:  budget,
		Sampling:   e.r.opts.Sampling,
		StopIDs:    e.r.chat.stopIDs(),
		Seed:       seed,
		SessionKey: e.sessionKey,
	})
}

// submitFinal handles a plain-text answer: it is submitted to the
// final-answer tool when one is configured, else the episode simply ends.
func (e *episode) submitFinal(ctx context.Context, content string, outcome Outcome) error {
	e.tr.Outcome = outcome
	tool := e.finalAnswerTool()
	if tool == "" {
		return nil
	}
	args, _ := json.Marshal(map[string]string{e.finalAnswerArg(tool): strings.TrimSpace(content)})
	if _, err := e.callTool(ctx, ToolCall{Name: tool, Arguments: args}); err != nil {
		return err
	}
	if e.done && outcome != OutcomeTruncated {
		e.tr.Outcome = OutcomeDone
	}
	return nil
}

// finalAnswerArg names the argument that receives a plain-text answer:
// the schema's only property, else its first string property by name, else
// "answer".
func (e *episode) finalAnswerArg(tool string) string {
	for _, t := range e.tools {
		if t.Name != tool {
			continue
		}
		var schema struct {
			Properties map[string]struct {
				Type string `json:"type"`
			} `json:"properties"`
		}
		if json.Unmarshal(t.InputSchema, &schema) != nil {
			break
		}
		names := slices.Sorted(maps.Keys(schema.Properties))
		if len(names) == 1 {
			return names[0]
		}
		for _, n := range names {
			if schema.Properties[n].Type == "string" {
				return n
			}
		}
	}
	return "answer"
}

// callTools runs the model's calls in order. A parse error becomes one
// Error: tool message; tool-level failures become Error: text for the model
// and are counted; transport failures end the episode.
func (e *episode) callTools(ctx context.Context, calls []ToolCall, perr error) ([]chat.ToolResult, error) {
	results := make([]chat.ToolResult, 0, len(calls)+1)
	for _, c := range calls {
		res, err := e.callTool(ctx, c)
		if err != nil {
			return nil, err
		}
		results = append(results, res)
	}
	// A malformed call, or one whose arguments break its tool's schema, is
	// answered, not executed: the model sees why, the trajectory records it.
	var failed chat.ToolCallErrors
	if perr != nil && !errors.As(perr, &failed) {
		failed = chat.ToolCallErrors{{Reason: perr.Error()}}
	}
	for _, pe := range failed {
		e.tr.ToolFailures++
		e.tr.Turns = append(e.tr.Turns, Turn{Role: "tool", Tool: pe.Name, Error: pe.Error()})
		name := pe.Name
		if name == "" {
			name = "error"
		}
		results = append(results, chat.ToolResult{ToolCallID: pe.ID, Name: name, Content: errText(fmt.Errorf("could not parse your tool call: %w", pe))})
	}
	return results, nil
}

func (e *episode) callTool(ctx context.Context, c ToolCall) (chat.ToolResult, error) {
	tr := e.tr
	tr.ToolCalls++
	input := c.Arguments
	if len(input) == 0 || string(input) == "null" {
		input = json.RawMessage("{}")
	}
	var out *envtarget.ToolOutput
	_, err := e.r.callEnv(ctx, tr, func(cctx context.Context) (Session, error) {
		var err error
		out, err = e.sess.CallTool(cctx, c.Name, input)
		return nil, err
	})
	var toolErr *envtarget.ToolError
	switch {
	case errors.As(err, &toolErr):
		// The tool ran (or refused the input): the model sees the error.
		tr.ToolFailures++
		tr.Rewards = append(tr.Rewards, nil)
		tr.Turns = append(tr.Turns, Turn{Role: "tool", Tool: c.Name, Error: err.Error()})
		return chat.ToolResult{ToolCallID: c.ID, Name: c.Name, Content: errText(err)}, nil
	case err != nil:
		return chat.ToolResult{}, fmt.Errorf("call tool %s: %w", c.Name, err)
	}
	text := out.Text
	if text == "" {
		text = "(no output)"
	}
	tr.Rewards = append(tr.Rewards, out.Reward)
	tr.Turns = append(tr.Turns, Turn{Role: "tool", Tool: c.Name, Text: text, Reward: out.Reward, Finished: out.Finished})
	if len(out.Metadata) > 0 && string(out.Metadata) != "null" {
		tr.Metadata = out.Metadata
	}
	if out.Finished {
		e.done = true
	}
	return chat.ToolResult{ToolCallID: c.ID, Name: c.Name, Content: text}, nil
}

// textAction sends the assistant's plain text as the env's action and
// returns the observation's text (an action the env refused is shown to the
// model the same way).
func (e *episode) textAction(ctx context.Context, actor envtarget.TextActor, text string) (string, error) {
	tr := e.tr
	tr.ToolCalls++
	var out *envtarget.ToolOutput
	_, err := e.r.callEnv(ctx, tr, func(cctx context.Context) (Session, error) {
		var err error
		out, err = actor.TextAction(cctx, strings.TrimSpace(text))
		return nil, err
	})
	var toolErr *envtarget.ToolError
	switch {
	case errors.As(err, &toolErr):
		tr.ToolFailures++
		tr.Rewards = append(tr.Rewards, nil)
		tr.Turns = append(tr.Turns, Turn{Role: "user", Error: err.Error()})
		return errText(err), nil
	case err != nil:
		return "", fmt.Errorf("text action: %w", err)
	}
	tr.Rewards = append(tr.Rewards, out.Reward)
	tr.Turns = append(tr.Turns, Turn{Role: "user", Text: out.Text, Reward: out.Reward, Finished: out.Finished})
	if out.Finished {
		e.done = true
	}
	return out.Text, nil
}

func toolMessages(results []chat.ToolResult) []chat.Message {
	msgs := make([]chat.Message, len(results))
	for i, r := range results {
		msgs[i] = chat.Message{Role: "tool", Content: r.Content, Name: r.Name, ToolCallID: r.ToolCallID}
	}
	return msgs
}

// appendTurn renders the env's turn (tool results or an observation); if it
// would overflow the completion budget the turn is cut off and the episode
// ends (TRL's overlong guard).
func (e *episode) appendTurn(promptLen int, msgs []chat.Message) (stop bool, err error) {
	before := len(e.conv.IDs())
	ids, err := e.conv.AppendMessages(msgs)
	if err != nil {
		e.tr.Outcome = OutcomeRenderError
		return true, fmt.Errorf("render tool results: %w", err)
	}
	e.tr.Divergences = len(e.conv.Divergences())
	if len(ids)-promptLen >= e.r.opts.MaxCompletionTokens {
		e.keep = before
		e.tr.Outcome = OutcomeBudget
		if e.done {
			e.tr.Outcome = OutcomeDone
		}
		return true, nil
	}
	e.tr.Logprobs = append(e.tr.Logprobs, make([]float32, len(ids)-before)...)
	return false, nil
}

// snapshot copies the conversation's tokens and mask into the trajectory.
func (e *episode) snapshot(promptLen int) {
	ids := e.conv.IDs()
	mask := e.conv.LossMask()
	if e.keep >= 0 && e.keep < len(ids) {
		ids, mask = ids[:e.keep], mask[:e.keep-promptLen]
	}
	e.tr.Tokens, e.tr.PromptLen = ids, promptLen
	e.tr.LossMask = make([]uint8, len(mask))
	for i, m := range mask {
		e.tr.LossMask[i] = uint8(m)
	}
	if n := len(ids) - promptLen; len(e.tr.Logprobs) > n {
		e.tr.Logprobs = e.tr.Logprobs[:n]
	}
}
