package openenvserver

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/ortrain/ortrain/internal/openenv"
)

// validationError is an action that failed validation (VALIDATION_ERROR on
// /ws, 422 on HTTP).
type validationError struct{ issues []openenv.ValidationIssue }

func (e *validationError) Error() string { return "Invalid message" }

// execError wraps an env failure (EXECUTION_ERROR on /ws, 500 on HTTP).
type execError struct{ err error }

func (e *execError) Error() string { return e.err.Error() }

// safely runs fn, turning a panic into an error: one env bug must not take
// the server down.
func safely[T any](fn func() (T, error)) (out T, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return fn()
}

// filterKwargs keeps the reset keys the env takes.
func (s *Server) filterKwargs(kwargs map[string]json.RawMessage) map[string]json.RawMessage {
	if s.env.ResetKwargs == nil {
		return kwargs
	}
	out := map[string]json.RawMessage{}
	for k, v := range kwargs {
		if slices.Contains(s.env.ResetKwargs, k) {
			out[k] = v
		}
	}
	return out
}

func (s *Server) reset(ctx context.Context, sess *session, data json.RawMessage) (openenv.StepResult, error) {
	kwargs := map[string]json.RawMessage{}
	if len(data) > 0 {
		if err := json.Unmarshal(data, &kwargs); err != nil {
			return openenv.StepResult{}, &execError{fmt.Errorf("reset kwargs: %w", err)}
		}
	}
	kwargs = s.filterKwargs(kwargs)
	sess.mu.Lock()
	defer sess.mu.Unlock()
	obs, err := safely(func() (Observation, error) { return sess.inst.Reset(ctx, kwargs) })
	if err != nil {
		return openenv.StepResult{}, &execError{err}
	}
	return stepResult(obs)
}

// step validates the action (Gym fields or an MCP action) and runs it.
func (s *Server) step(ctx context.Context, sess *session, action json.RawMessage) (openenv.StepResult, error) {
	if s.env.MCP {
		return s.mcpStep(ctx, sess, action)
	}
	norm, issues := validateAction(action, s.actionFields)
	if issues != nil {
		return openenv.StepResult{}, &validationError{issues}
	}
	gym, ok := sess.inst.(GymInstance)
	if !ok {
		return openenv.StepResult{}, &execError{fmt.Errorf("%T does not implement Step", sess.inst)}
	}
	sess.mu.Lock()
	defer sess.mu.Unlock()
	obs, err := safely(func() (Observation, error) { return gym.Step(ctx, norm) })
	if err != nil {
		return openenv.StepResult{}, &execError{err}
	}
	return stepResult(obs)
}

func (s *Server) mcpStep(ctx context.Context, sess *session, action json.RawMessage) (openenv.StepResult, error) {
	var head struct {
		Type *string `json:"type"`
	}
	_ = json.Unmarshal(action, &head)
	mcp, ok := sess.inst.(MCPInstance)
	if !ok {
		return openenv.StepResult{}, &execError{fmt.Errorf("%T does not implement MCP tools", sess.inst)}
	}
	if head.Type != nil && *head.Type == "list_tools" {
		if _, issues := validateAction(action, listToolsFields); issues != nil {
			return openenv.StepResult{}, &validationError{issues}
		}
		sess.mu.Lock()
		defer sess.mu.Unlock()
		tools, err := safely(func() ([]openenv.Tool, error) { return mcp.ListTools(ctx) })
		if err != nil {
			return openenv.StepResult{}, &execError{err}
		}
		return stepResult(Observation{Fields: map[string]any{"tools": nonNil(tools)}})
	}
	norm, issues := validateAction(action, callToolFields)
	if issues != nil {
		return openenv.StepResult{}, &validationError{issues}
	}
	var call struct {
		ToolName  string          `json:"tool_name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	_ = json.Unmarshal(norm, &call)
	if len(call.Arguments) == 0 {
		call.Arguments = json.RawMessage(`{}`)
	}
	sess.mu.Lock()
	defer sess.mu.Unlock()
	out, err := safely(func() (ToolOutput, error) { return mcp.CallTool(ctx, call.ToolName, call.Arguments) })
	obs := openenv.ToolCall{ToolName: call.ToolName}
	if err != nil {
		obs.Error = toolFailure(err)
		return stepResult(Observation{Fields: obs})
	}
	res, err := toolResult(out.Value)
	if err != nil {
		obs.Error = toolFailure(err)
		return stepResult(Observation{Fields: obs})
	}
	obs.Result = &res
	return stepResult(Observation{Fields: obs, Reward: out.Reward, Done: out.Done})
}

func toolFailure(err error) *openenv.ToolFailure {
	if te, ok := err.(*ToolError); ok {
		return &openenv.ToolFailure{Type: te.Type, Message: te.Message}
	}
	return &openenv.ToolFailure{Type: openenv.ToolExecutionError, Message: err.Error()}
}

// toolResult renders a tool's value as FastMCP's CallToolResult: a string
// is its own text and structured as {"result":s}; an object is its JSON as
// text and itself as structured content.
func toolResult(v any) (openenv.ToolResult, error) {
	data, err := mustMarshalErr(v)
	if err != nil {
		return openenv.ToolResult{}, fmt.Errorf("encode tool result: %w", err)
	}
	res := openenv.ToolResult{Data: data}
	var text string
	switch firstByte(data) {
	case '"':
		_ = json.Unmarshal(data, &text)
		res.StructuredContent = mustMarshal(map[string]json.RawMessage{"result": data})
	case '{':
		text = string(data)
		res.StructuredContent = data
	default:
		text = string(data)
		res.StructuredContent = mustMarshal(map[string]json.RawMessage{"result": data})
	}
	res.Content = []openenv.ContentBlock{{Type: "text", Text: text}}
	return res, nil
}

func mustMarshalErr(v any) (json.RawMessage, error) {
	if raw, ok := v.(json.RawMessage); ok {
		if !json.Valid(raw) {
			return nil, fmt.Errorf("invalid JSON value")
		}
		return raw, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return b, nil
}

func (s *Server) state(ctx context.Context, sess *session) (json.RawMessage, error) {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	st, err := safely(func() (json.RawMessage, error) { return sess.inst.State(ctx) })
	if err != nil {
		return nil, &execError{err}
	}
	if firstByte(st) != '{' {
		return nil, &execError{fmt.Errorf("state is not a JSON object")}
	}
	return st, nil
}

// stepResult lifts reward and done; the observation never carries them or
// metadata.
func stepResult(obs Observation) (openenv.StepResult, error) {
	fields := obs.Fields
	if fields == nil {
		fields = struct{}{}
	}
	raw, err := mustMarshalErr(fields)
	if err != nil {
		return openenv.StepResult{}, &execError{fmt.Errorf("encode observation: %w", err)}
	}
	if firstByte(raw) != '{' {
		return openenv.StepResult{}, &execError{fmt.Errorf("observation is not a JSON object")}
	}
	var m map[string]json.RawMessage
	_ = json.Unmarshal(raw, &m)
	for _, k := range []string{"reward", "done", "metadata"} {
		if _, ok := m[k]; ok {
			return openenv.StepResult{}, &execError{fmt.Errorf("observation fields must not hold %q", k)}
		}
	}
	return openenv.StepResult{Observation: raw, Reward: obs.Reward, Done: obs.Done}, nil
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
