package demos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/ortrain/ortrain/internal/envtarget"
)

// Script is a scripted policy: it plays one episode through ep's tool
// calls. ep.Skill says how good it should be, ep.Rand is its only source of
// randomness (so a seed fixes every episode).
type Script func(ctx context.Context, ep *Episode) error

// scripts maps an env key to its scripted policy (read-only).
var scripts = map[string]Script{
	"lockbox": lockbox,
}

// Scripts lists the envs that have a scripted policy, sorted.
func Scripts() []string {
	names := make([]string, 0, len(scripts))
	for k := range scripts {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// NoScriptError is an env without a scripted policy.
type NoScriptError struct {
	Name      string
	Available []string
}

func (e *NoScriptError) Error() string {
	return fmt.Sprintf("no scripted policy for env %q (envs with one: %s)", e.Name, strings.Join(e.Available, ", "))
}

// ScriptFor returns the scripted policy of env name, or a *NoScriptError.
func ScriptFor(name string) (Script, error) {
	s, ok := scripts[strings.ToLower(name)]
	if !ok {
		return nil, &NoScriptError{Name: name, Available: Scripts()}
	}
	return s, nil
}

// Episode is one session being played and recorded: every Call is one
// assistant turn with one tool call, followed by the tool's answer.
type Episode struct {
	// Prompt and Tools are what the session offers.
	Prompt string
	Tools  []envtarget.ToolSpec
	// Skill in [0, 1] says how good the scripted policy plays.
	Skill float64
	// Rand is the episode's own random source.
	Rand *rand.Rand

	sess     envtarget.Session
	messages []Message
	reward   float64
	calls    int
	finished bool
}

// ErrFinished is a Call after the env said the episode is over.
var ErrFinished = errors.New("the episode is already finished")

// Call calls tool name with args (a JSON object; nil: {}) and records the
// turn. A tool that refused or failed (*envtarget.ToolError) is recorded as
// rollouts show it to the model ("Error: ...") and its error returned.
func (e *Episode) Call(ctx context.Context, name string, args map[string]any) (*envtarget.ToolOutput, error) {
	if e.finished {
		return nil, fmt.Errorf("call %s: %w", name, ErrFinished)
	}
	if !slices.ContainsFunc(e.Tools, func(t envtarget.ToolSpec) bool { return t.Name == name }) {
		return nil, fmt.Errorf("call %s: the env offers no such tool (tools: %s)", name, toolNames(e.Tools))
	}
	if args == nil {
		args = map[string]any{}
	}
	input, err := json.Marshal(args)
	if err != nil {
		return nil, fmt.Errorf("call %s: arguments: %w", name, err)
	}
	id := fmt.Sprintf("call_%d", e.calls)
	e.calls++
	e.messages = append(e.messages, Message{Role: "assistant", ToolCalls: []ToolCall{{
		ID: id, Type: "function", Function: FunctionCall{Name: name, Arguments: input},
	}}})
	out, err := e.sess.CallTool(ctx, name, input)
	var toolErr *envtarget.ToolError
	switch {
	case errors.As(err, &toolErr):
		e.messages = append(e.messages, Message{Role: "tool", ToolCallID: id, Name: name, Content: fmt.Sprintf("Error: %v", err)})
		return nil, err
	case err != nil:
		return nil, fmt.Errorf("call %s: %w", name, err)
	}
	text := out.Text
	if text == "" {
		text = "(no output)" // as rollouts show an empty answer
	}
	e.messages = append(e.messages, Message{Role: "tool", ToolCallID: id, Name: name, Content: text})
	if out.Reward != nil {
		e.reward = *out.Reward // the last reward, as rollouts aggregate by default
	}
	e.finished = out.Finished
	return out, nil
}

func toolNames(tools []envtarget.ToolSpec) string {
	names := make([]string, len(tools))
	for i, t := range tools {
		names[i] = t.Name
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// lockbox: with probability Skill, open the envelope and unlock with the
// code it holds; otherwise unlock at once with a random digit.
func lockbox(ctx context.Context, ep *Episode) error {
	var code string
	if ep.Rand.Float64() < ep.Skill {
		out, err := ep.Call(ctx, "open_envelope", nil)
		if err != nil {
			return err
		}
		var ok bool
		if code, ok = strings.CutPrefix(strings.TrimSpace(out.Text), "code: "); !ok {
			return fmt.Errorf("open_envelope answered %q, want \"code: N\"", out.Text)
		}
	} else {
		code = strconv.Itoa(ep.Rand.IntN(10))
	}
	_, err := ep.Call(ctx, "unlock", map[string]any{"code": code})
	return err
}
