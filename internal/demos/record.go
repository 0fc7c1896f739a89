package demos

import (
	"bytes"
	"encoding/json"
)

// Record is one episode, one line of a demonstrations file: TRL's
// conversational SFT format (messages, tools), plus the episode's reward
// and task. There is no system message: the trainer adds its own.
type Record struct {
	Messages []Message `json:"messages"`
	Tools    []Tool    `json:"tools"`
	Reward   float64   `json:"reward"`
	TaskID   string    `json:"task_id"`
}

// Message is a user prompt, an assistant turn with its tool calls, or a
// tool's answer (ToolCallID and Name say which call it answers).
type Message struct {
	Role       string     `json:"role"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
	Name       string     `json:"name,omitempty"`
	Content    string     `json:"content"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
}

// ToolCall is one call of an assistant turn; Arguments is a JSON object.
type ToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function FunctionCall `json:"function"`
}

// FunctionCall names the tool and its arguments.
type FunctionCall struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// Tool is one offered tool as chat templates take it.
type Tool struct {
	Type     string   `json:"type"`
	Function Function `json:"function"`
}

// Function is a tool's name, description and parameters' JSON schema.
type Function struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
}

// emptyParameters is the schema of a tool that takes no parameters, as the
// chat templates render it.
const emptyParameters = `{"type":"object","properties":{}}`

// parameters is a tool's input schema, compacted (its key order kept), or
// the empty object schema when it has none.
func parameters(schema json.RawMessage) (json.RawMessage, error) {
	s := bytes.TrimSpace(schema)
	if len(s) == 0 || string(s) == "null" {
		return json.RawMessage(emptyParameters), nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, s); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// marshalLine encodes r as one JSON line, without HTML escaping.
func marshalLine(r *Record) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
