package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/ortrain/ortrain/internal/chat/jinja"
)

// Message is one chat message as chat templates see it (OpenAI style).
type Message struct {
	Role    string // "system", "user", "assistant" or "tool"
	Content string
	// NullContent renders content as None (an assistant turn that only
	// calls tools, in templates that test `content is none`).
	NullContent bool
	// ContentJSON, when set, is rendered instead of Content: a structured
	// tool result or a list of content blocks.
	ContentJSON      json.RawMessage
	ReasoningContent string // assistant's thinking; "" leaves the key out
	ToolCalls        []ToolCall
	Name             string // tool messages: the tool's name
	ToolCallID       string // tool messages: the call answered
}

// ToolCall is one function call an assistant message makes.
type ToolCall struct {
	ID        string          // optional; Mistral templates require 9 characters
	Name      string          // function name
	Arguments json.RawMessage // a JSON object (a JSON string is passed through as a string)
}

// Tool is a JSON-Schema function specification (ORS ToolSpec: name,
// description, input_schema).
type Tool struct {
	Name        string
	Description string
	Parameters  json.RawMessage // JSON Schema of the arguments; empty: no parameters
}

// ToolResult is the output of one tool call, fed back as a tool message.
type ToolResult struct {
	ToolCallID string
	Name       string
	Content    string
}

// Template renders a model's chat template the way transformers'
// apply_chat_template does.
type Template struct {
	source  string
	tmpl    *jinja.Template
	special map[string]string // bos_token, eos_token, ... passed to the template
	now     func() time.Time
}

// NewTemplate compiles template source. special holds the tokenizer's
// special-token strings (bos_token, eos_token, pad_token, unk_token) that
// transformers passes to every rendering; now is the strftime_now clock
// (nil: time.Now).
func NewTemplate(source string, special map[string]string, now func() time.Time) (*Template, error) {
	tmpl, err := jinja.Parse(source)
	if err != nil {
		return nil, fmt.Errorf("compile chat template: %w", err)
	}
	return &Template{source: source, tmpl: tmpl, special: maps.Clone(special), now: now}, nil
}

// ErrNoChatTemplate means the model directory has no chat template.
var ErrNoChatTemplate = errors.New("model has no chat template (tokenizer_config.json chat_template or chat_template.jinja)")

// Template compiles the tokenizer's chat template ("" for the default, or
// a named one such as "tool_use").
func (t *Tokenizer) Template(name string) (*Template, error) {
	src, ok := t.ChatTemplate(name)
	if !ok {
		if name != "" && name != "default" {
			return nil, fmt.Errorf("chat template %q: %w", name, ErrNoChatTemplate)
		}
		return nil, ErrNoChatTemplate
	}
	return NewTemplate(src, t.specialStrings, nil)
}

// Source returns the template text.
func (t *Template) Source() string { return t.source }

// Render renders messages with the tools and extra template kwargs (such
// as enable_thinking). No tools renders `tools` as None, as transformers
// does. A raise_exception in the template returns *jinja.TemplateError.
func (t *Template) Render(messages []Message, tools []Tool, addGenerationPrompt bool, kwargs map[string]any) (string, error) {
	vars := map[string]jinja.Value{"documents": nil}
	for k, v := range t.special {
		vars[k] = v
	}
	for k, v := range kwargs {
		jv, err := toValue(v)
		if err != nil {
			return "", fmt.Errorf("template kwarg %q: %w", k, err)
		}
		vars[k] = jv
	}
	msgs := make([]jinja.Value, len(messages))
	for i, m := range messages {
		mv, err := messageValue(m)
		if err != nil {
			return "", fmt.Errorf("message %d (%s): %w", i, m.Role, err)
		}
		msgs[i] = mv
	}
	vars["messages"] = msgs
	vars["tools"] = nil
	if len(tools) > 0 {
		list := make([]jinja.Value, len(tools))
		for i, tool := range tools {
			tv, err := toolValue(tool)
			if err != nil {
				return "", fmt.Errorf("tool %d (%s): %w", i, tool.Name, err)
			}
			list[i] = tv
		}
		vars["tools"] = list
	}
	vars["add_generation_prompt"] = addGenerationPrompt
	out, err := t.tmpl.Render(vars, jinja.RenderOptions{Now: t.now})
	if err != nil {
		return "", fmt.Errorf("render chat template: %w", err)
	}
	return out, nil
}

func messageValue(m Message) (*jinja.Dict, error) {
	d := jinja.NewDict()
	d.Set("role", m.Role)
	switch {
	case len(m.ContentJSON) > 0:
		v, err := jinja.FromJSON(m.ContentJSON)
		if err != nil {
			return nil, fmt.Errorf("content JSON: %w", err)
		}
		d.Set("content", v)
	case m.NullContent:
		d.Set("content", nil)
	default:
		d.Set("content", m.Content)
	}
	if m.ReasoningContent != "" {
		d.Set("reasoning_content", m.ReasoningContent)
	}
	if len(m.ToolCalls) > 0 {
		calls := make([]jinja.Value, len(m.ToolCalls))
		for i, c := range m.ToolCalls {
			args := jinja.Value(jinja.NewDict())
			if len(c.Arguments) > 0 {
				v, err := jinja.FromJSON(c.Arguments)
				if err != nil {
					return nil, fmt.Errorf("tool call %d (%s) arguments: %w", i, c.Name, err)
				}
				args = v
			}
			fn := jinja.NewDict()
			fn.Set("name", c.Name)
			fn.Set("arguments", args)
			call := jinja.NewDict()
			if c.ID != "" {
				call.Set("id", c.ID)
			}
			call.Set("type", "function")
			call.Set("function", fn)
			calls[i] = call
		}
		d.Set("tool_calls", calls)
	}
	if m.Name != "" {
		d.Set("name", m.Name)
	}
	if m.ToolCallID != "" {
		d.Set("tool_call_id", m.ToolCallID)
	}
	return d, nil
}

// toolValue builds {"type": "function", "function": {name, description,
// parameters}}, the shape transformers' get_json_schema produces.
func toolValue(t Tool) (*jinja.Dict, error) {
	fn := jinja.NewDict()
	fn.Set("name", t.Name)
	fn.Set("description", t.Description)
	params := []byte(`{"type": "object", "properties": {}}`)
	if len(t.Parameters) > 0 {
		params = t.Parameters
	}
	pv, err := jinja.FromJSON(params)
	if err != nil {
		return nil, fmt.Errorf("parameters schema: %w", err)
	}
	fn.Set("parameters", pv)
	d := jinja.NewDict()
	d.Set("type", "function")
	d.Set("function", fn)
	return d, nil
}

// toValue converts a Go value to a template value through JSON (maps get
// sorted keys; pass json.RawMessage to keep an order).
func toValue(v any) (jinja.Value, error) {
	switch x := v.(type) {
	case nil, bool, string, int64, float64:
		return x, nil
	case int:
		return int64(x), nil
	case json.RawMessage:
		return jinja.FromJSON(x)
	}
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return jinja.FromJSON(data)
}

// SpecialStrings returns the special-token strings (bos_token, eos_token,
// pad_token, unk_token) a chat template is rendered with.
func (t *Tokenizer) SpecialStrings() map[string]string { return maps.Clone(t.specialStrings) }
