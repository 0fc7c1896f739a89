package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ortrain/ortrain/internal/chat"
)

// chatRequest is the part of an OpenAI chat completion request the
// gateway reads; unknown fields are ignored.
type chatRequest struct {
	samplingFields
	Model               string          `json:"model"`
	Messages            []wireMessage   `json:"messages"`
	Tools               []wireTool      `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Logprobs            *bool           `json:"logprobs"`
	TopLogprobs         *int            `json:"top_logprobs"`
	Stream              *bool           `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	// Accepted, not applied: noted once per run (noteChat).
	ParallelToolCalls *bool            `json:"parallel_tool_calls"`
	Store             *bool            `json:"store"`
	ResponseFormat    *json.RawMessage `json:"response_format"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// wireMessage is one request message. Content is a string, null, or a
// list of {"type": "text", "text": …} parts.
type wireMessage struct {
	Role       string           `json:"role"`
	Content    json.RawMessage  `json:"content"`
	Name       string           `json:"name"`
	ToolCalls  []wireToolCallIn `json:"tool_calls"`
	ToolCallID string           `json:"tool_call_id"`
	// ReasoningContent (vLLM's field) or Reasoning (its newer name) is
	// passed to templates that render it.
	ReasoningContent *string `json:"reasoning_content"`
	Reasoning        *string `json:"reasoning"`
}

type wireToolCallIn struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name string `json:"name"`
		// Arguments is OpenAI's JSON string holding an object; an object
		// itself is accepted too.
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

type wireTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"function"`
}

type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// toolChoice is what tool_choice asked for.
type toolChoice int

const (
	choiceAuto toolChoice = iota
	choiceNone
	choiceRequired
	choiceNamed
)

// chatPlan is a checked chat request: the conversation as the template sees
// it and the tools replies are parsed against.
type chatPlan struct {
	messages   []chat.Message
	tools      []chat.Tool
	parseCalls bool // tools offered and tool_choice is not "none"
	choice     toolChoice
}

// decodeChatRequest reads and checks a chat completion body.
func decodeChatRequest(data []byte) (*chatRequest, *apiError) {
	var req chatRequest
	if err := decodeJSON(data, &req); err != nil {
		return nil, err
	}
	if req.TopLogprobs != nil && (*req.TopLogprobs < 0 || *req.TopLogprobs > 20) {
		return nil, badRequest("top_logprobs", "top_logprobs must be in [0, 20], got %d", *req.TopLogprobs)
	}
	return &req, nil
}

// planChat converts the request's messages and tools for the template.
func planChat(req *chatRequest) (*chatPlan, *apiError) {
	tools, err := convertTools(req.Tools)
	if err != nil {
		return nil, err
	}
	choice, err := parseToolChoice(req.ToolChoice, tools)
	if err != nil {
		return nil, err
	}
	msgs, err := convertMessages(req.Messages)
	if err != nil {
		return nil, err
	}
	return &chatPlan{messages: msgs, tools: tools, parseCalls: len(tools) > 0 && choice != choiceNone, choice: choice}, nil
}

func convertTools(in []wireTool) ([]chat.Tool, *apiError) {
	out := make([]chat.Tool, 0, len(in))
	for i, t := range in {
		p := fmt.Sprintf("tools[%d]", i)
		if t.Type != "function" {
			return nil, badRequest(p+".type", "%s.type is %q; only \"function\" tools are supported", p, t.Type)
		}
		if t.Function.Name == "" {
			return nil, badRequest(p+".function.name", "%s.function.name is required", p)
		}
		params := bytes.TrimSpace(t.Function.Parameters)
		if string(params) == "null" {
			params = nil
		}
		if len(params) > 0 && params[0] != '{' {
			return nil, badRequest(p+".function.parameters", "%s.function.parameters must be a JSON Schema object", p)
		}
		out = append(out, chat.Tool{Name: t.Function.Name, Description: t.Function.Description, Parameters: json.RawMessage(params)})
	}
	return out, nil
}

// parseToolChoice reads "auto", "none", "required", or a named function,
// which must be one of the tools.
func parseToolChoice(raw json.RawMessage, tools []chat.Tool) (toolChoice, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return choiceAuto, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "auto":
			return choiceAuto, nil
		case "none":
			return choiceNone, nil
		case "required":
			if len(tools) == 0 {
				return 0, badRequest("tool_choice", `tool_choice "required" needs tools`)
			}
			return choiceRequired, nil
		}
		return 0, badRequest("tool_choice", `tool_choice %q: want "auto", "none", "required" or {"type": "function", "function": {"name": …}}`, s)
	}
	var named struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &named); err != nil || named.Type != "function" || named.Function.Name == "" {
		return 0, badRequest("tool_choice", `tool_choice must be "auto", "none", "required" or {"type": "function", "function": {"name": …}}`)
	}
	for _, t := range tools {
		if t.Name == named.Function.Name {
			return choiceNamed, nil
		}
	}
	return 0, badRequest("tool_choice", "tool_choice names %q, which is not among the tools", named.Function.Name)
}

// convertMessages turns OpenAI messages into template messages: developer
// becomes system (chat templates know no developer role), assistant tool
// calls get their arguments as JSON objects (templates render them with
// tojson), and a tool message without a name takes the name of the call it
// answers.
func convertMessages(in []wireMessage) ([]chat.Message, *apiError) {
	if len(in) == 0 {
		return nil, badRequest("messages", "messages must hold at least one message")
	}
	callNames := map[string]string{} // tool call id → function name
	out := make([]chat.Message, 0, len(in))
	for i, m := range in {
		p := fmt.Sprintf("messages[%d]", i)
		text, null, err := messageText(m.Content, p+".content")
		if err != nil {
			return nil, err
		}
		msg := chat.Message{Role: m.Role, Content: text}
		switch m.Role {
		case "system", "user":
		case "developer":
			msg.Role = "system"
		case "assistant":
			if msg.ToolCalls, err = convertCalls(m.ToolCalls, p); err != nil {
				return nil, err
			}
			for _, c := range msg.ToolCalls {
				if c.ID != "" {
					callNames[c.ID] = c.Name
				}
			}
			msg.NullContent = null && len(msg.ToolCalls) > 0
			switch {
			case m.ReasoningContent != nil:
				msg.ReasoningContent = *m.ReasoningContent
			case m.Reasoning != nil:
				msg.ReasoningContent = *m.Reasoning
			}
		case "tool":
			msg.ToolCallID, msg.Name = m.ToolCallID, m.Name
			if msg.Name == "" {
				msg.Name = callNames[m.ToolCallID]
			}
		default:
			return nil, badRequest(p+".role", "%s.role %q: want system, developer, user, assistant or tool", p, m.Role)
		}
		if m.Role != "assistant" && len(m.ToolCalls) > 0 {
			return nil, badRequest(p+".tool_calls", "%s: only assistant messages carry tool_calls", p)
		}
		out = append(out, msg)
	}
	return out, nil
}

// messageText reads content: a string, null/absent (null is true), or a
// list of text parts, joined with newlines as vLLM joins them.
func messageText(raw json.RawMessage, param string) (text string, null bool, err *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", true, nil
	}
	if raw[0] == '"' {
		if json.Unmarshal(raw, &text) != nil {
			return "", false, badRequest(param, "%s is not a valid JSON string", param)
		}
		return text, false, nil
	}
	var parts []contentPart
	if json.Unmarshal(raw, &parts) != nil {
		return "", false, badRequest(param, `%s must be a string or a list of {"type": "text", "text": …} parts`, param)
	}
	texts := make([]string, 0, len(parts))
	for j, part := range parts {
		if part.Type != "text" {
			return "", false, badRequest(fmt.Sprintf("%s[%d].type", param, j), "%s[%d].type is %q; only text parts are supported", param, j, part.Type)
		}
		texts = append(texts, part.Text)
	}
	return strings.Join(texts, "\n"), false, nil
}

func convertCalls(in []wireToolCallIn, msgParam string) ([]chat.ToolCall, *apiError) {
	var out []chat.ToolCall
	for j, c := range in {
		p := fmt.Sprintf("%s.tool_calls[%d]", msgParam, j)
		if c.Type != "" && c.Type != "function" {
			return nil, badRequest(p+".type", "%s.type is %q; only \"function\" calls are supported", p, c.Type)
		}
		if c.Function.Name == "" {
			return nil, badRequest(p+".function.name", "%s.function.name is required", p)
		}
		out = append(out, chat.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: callArguments(c.Function.Arguments)})
	}
	return out, nil
}

// callArguments turns OpenAI's arguments (a JSON string holding an object)
// into the object, which templates render with tojson, as vLLM does before
// rendering. A string that holds no object stays a string; absent is {}.
func callArguments(raw json.RawMessage) json.RawMessage {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return json.RawMessage("{}")
	}
	if raw[0] != '"' {
		return append(json.RawMessage(nil), raw...)
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return append(json.RawMessage(nil), raw...)
	}
	inner := bytes.TrimSpace([]byte(s))
	if len(inner) == 0 {
		return json.RawMessage("{}")
	}
	if inner[0] == '{' && json.Valid(inner) {
		return json.RawMessage(inner)
	}
	return append(json.RawMessage(nil), raw...)
}

// render renders the conversation with the generation prompt and encodes
// it exactly as chat.Conversation does for rollouts (Tokenizer.Encode:
// added tokens cut out first, never split).
func (g *Gateway) render(p *chatPlan) ([]int32, *apiError) {
	text, err := g.opts.Template.Render(p.messages, p.tools, true, g.opts.Kwargs)
	if err != nil {
		return nil, badRequest("messages", "the chat template cannot render these messages: %v", err)
	}
	if e := g.checkTextFits(text, "messages"); e != nil {
		return nil, e
	}
	ids := g.opts.Tokenizer.Encode(text)
	if len(ids) == 0 {
		return nil, badRequest("messages", "the rendered conversation is empty")
	}
	return ids, nil
}

// checkTextFits refuses, before encoding it, a prompt text too long to fit
// the context whatever its tokens: every token is at most maxTokenBytes
// bytes, so a text longer than MaxModelLen of them holds more tokens than
// the context. Encoding a 50 MB prompt only to refuse it costs seconds and
// gigabytes; this costs nothing.
func (g *Gateway) checkTextFits(text, param string) *apiError {
	m := g.opts.MaxModelLen
	if m <= 0 || len(text) <= m*g.maxTokenBytes {
		return nil
	}
	e := badRequest(param, "the prompt is %d bytes, more than this model's %d-token context can hold (a token is at most %d bytes)",
		len(text), m, g.maxTokenBytes)
	e.code = "context_length_exceeded"
	return e
}

// longestToken is the most bytes one token of tok decodes to (at least 1).
func longestToken(tok *chat.Tokenizer) int {
	longest := 1
	for id := range tok.VocabSize() {
		if _, ok := tok.Token(int32(id)); ok {
			longest = max(longest, len(tok.Decode([]int32{int32(id)}, false)))
		}
	}
	return longest
}
