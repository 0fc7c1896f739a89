package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ortrain/ortrain/internal/chat"
)

// anthMessage is one request message: role user, assistant or system, and
// content a string or a list of blocks.
type anthMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// anthBlock is any content block; which fields matter depends on Type.
// cache_control, citations and signatures are ignored.
type anthBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`          // tool_use
	Name      string          `json:"name"`        // tool_use
	Input     json.RawMessage `json:"input"`       // tool_use
	ToolUseID string          `json:"tool_use_id"` // tool_result
	Content   json.RawMessage `json:"content"`     // tool_result: a string or text blocks
}

// anthTool is a custom tool (no type, or "custom") or a server tool (any
// other type).
type anthTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// messagesPlan is a checked Messages request as the chat pipeline takes
// it, with what is noted about it.
type messagesPlan struct {
	chatPlan
	dropped []string // the types of the server tools left out
	forced  bool     // tool_choice "any" or "tool": accepted, not enforced
}

// planMessages converts the request into the chat messages and tools of the
// same conversation in chat/completions.
func planMessages(req *messagesRequest) (*messagesPlan, *apiError) {
	p := &messagesPlan{}
	var serverNames []string
	for i, t := range req.Tools {
		param := fmt.Sprintf("tools[%d]", i)
		if t.Type != "" && t.Type != "custom" {
			p.dropped = append(p.dropped, t.Type)
			serverNames = append(serverNames, t.Name)
			continue
		}
		if t.Name == "" {
			return nil, badRequest(param+".name", "%s.name is required", param)
		}
		schema := bytes.TrimSpace(t.InputSchema)
		if string(schema) == "null" {
			schema = nil
		}
		if len(schema) > 0 && schema[0] != '{' {
			return nil, badRequest(param+".input_schema", "%s.input_schema must be a JSON Schema object", param)
		}
		p.tools = append(p.tools, chat.Tool{Name: t.Name, Description: t.Description, Parameters: json.RawMessage(schema)})
	}
	choice, e := parseAnthToolChoice(req.ToolChoice, p.tools, serverNames)
	if e != nil {
		return nil, e
	}
	p.forced = choice == choiceRequired || choice == choiceNamed
	p.parseCalls = len(p.tools) > 0 && choice != choiceNone
	if p.messages, e = convertAnthMessages(req); e != nil {
		return nil, e
	}
	return p, nil
}

// parseAnthToolChoice reads {"type": "auto"|"any"|"tool"|"none", "name"};
// a named tool must be offered (a dropped server tool counts as offered).
func parseAnthToolChoice(raw json.RawMessage, tools []chat.Tool, serverNames []string) (toolChoice, *apiError) {
	if !present(raw) {
		return choiceAuto, nil
	}
	var c struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if json.Unmarshal(raw, &c) != nil {
		return 0, badRequest("tool_choice", `tool_choice must be an object {"type": "auto"|"any"|"tool"|"none"}`)
	}
	switch c.Type {
	case "auto":
		return choiceAuto, nil
	case "none":
		return choiceNone, nil
	case "any":
		if len(tools) == 0 && len(serverNames) == 0 {
			return 0, badRequest("tool_choice", `tool_choice "any" needs tools`)
		}
		return choiceRequired, nil
	case "tool":
		if c.Name == "" {
			return 0, badRequest("tool_choice.name", `tool_choice.name is required with type "tool"`)
		}
		for _, t := range tools {
			if t.Name == c.Name {
				return choiceNamed, nil
			}
		}
		for _, n := range serverNames {
			if n == c.Name {
				return choiceNamed, nil
			}
		}
		return 0, badRequest("tool_choice.name", "tool_choice.name is %q, which is not among the tools", c.Name)
	}
	return 0, badRequest("tool_choice.type", `tool_choice.type is %q: want "auto", "any", "tool" or "none"`, c.Type)
}

// convertAnthMessages lays the conversation out as chat messages: system
// (its blocks joined) first; a user turn's tool_result blocks become tool
// messages, named after the tool_use they answer, and its text a user
// message, in the order sent; an assistant turn's text becomes content
// and its tool_use blocks tool calls (content null when it has only
// calls, as chat's reply then has). Text blocks are joined with newlines,
// as chat joins text parts.
func convertAnthMessages(req *messagesRequest) ([]chat.Message, *apiError) {
	if len(req.Messages) == 0 {
		return nil, badRequest("messages", "messages must hold at least one message")
	}
	var out []chat.Message
	if present(req.System) {
		text, n, e := anthText(req.System, "system")
		if e != nil {
			return nil, e
		}
		if n > 0 {
			out = append(out, chat.Message{Role: "system", Content: text})
		}
	}
	callNames := map[string]string{} // tool_use id → tool name
	for i, m := range req.Messages {
		p := fmt.Sprintf("messages[%d]", i)
		switch m.Role {
		case "system":
			text, _, e := anthText(m.Content, p+".content")
			if e != nil {
				return nil, e
			}
			out = append(out, chat.Message{Role: "system", Content: text})
		case "user":
			msgs, e := convertUserTurn(m.Content, p, callNames)
			if e != nil {
				return nil, e
			}
			out = append(out, msgs...)
		case "assistant":
			msg, e := convertAssistantTurn(m.Content, p)
			if e != nil {
				return nil, e
			}
			for _, c := range msg.ToolCalls {
				callNames[c.ID] = c.Name
			}
			out = append(out, msg)
		default:
			return nil, badRequest(p+".role", "%s.role %q: want user, assistant or system", p, m.Role)
		}
	}
	return out, nil
}

// anthText reads content that may only be text: a string, null, or a list
// of text blocks joined with newlines. n counts the pieces (0: nothing).
func anthText(raw json.RawMessage, param string) (text string, n int, e *apiError) {
	if !present(raw) {
		return "", 0, nil
	}
	blocks, str, e := anthBlocks(raw, param)
	if e != nil || blocks == nil {
		return str, 1, e
	}
	texts := make([]string, 0, len(blocks))
	for j, b := range blocks {
		if b.Type != "text" {
			return "", 0, unsupportedBlock(fmt.Sprintf("%s[%d]", param, j), b.Type, "text")
		}
		texts = append(texts, b.Text)
	}
	return strings.Join(texts, "\n"), len(texts), nil
}

// anthBlocks reads content as a string (blocks nil) or a list of blocks.
func anthBlocks(raw json.RawMessage, param string) (blocks []anthBlock, text string, e *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return []anthBlock{}, "", nil
	}
	if raw[0] == '"' {
		if json.Unmarshal(raw, &text) != nil {
			return nil, "", badRequest(param, "%s is not a valid JSON string", param)
		}
		return nil, text, nil
	}
	if json.Unmarshal(raw, &blocks) != nil {
		return nil, "", badRequest(param, "%s must be a string or a list of content blocks", param)
	}
	if blocks == nil {
		blocks = []anthBlock{}
	}
	return blocks, "", nil
}

// unsupportedBlock refuses a block naming where it is and what the turn
// may hold.
func unsupportedBlock(param, typ, allowed string) *apiError {
	why := ""
	switch typ {
	case "image", "document":
		why = " (this server serves a text-only model)"
	}
	return badRequest(param+".type", "%s.type is %q%s; this content may hold %s blocks", param, typ, why, allowed)
}

// skippedBlock: thinking sent back is not rendered (no reply of this server
// has a thinking block; the model's thinking stays in its text).
func skippedBlock(typ string) bool { return typ == "thinking" || typ == "redacted_thinking" }

func convertUserTurn(raw json.RawMessage, p string, callNames map[string]string) ([]chat.Message, *apiError) {
	blocks, text, e := anthBlocks(raw, p+".content")
	if e != nil {
		return nil, e
	}
	if blocks == nil {
		return []chat.Message{{Role: "user", Content: text}}, nil
	}
	var out []chat.Message
	var texts []string
	flush := func() {
		if len(texts) > 0 {
			out = append(out, chat.Message{Role: "user", Content: strings.Join(texts, "\n")})
			texts = nil
		}
	}
	for j, b := range blocks {
		bp := fmt.Sprintf("%s.content[%d]", p, j)
		switch {
		case b.Type == "text":
			texts = append(texts, b.Text)
		case b.Type == "tool_result":
			flush()
			result, _, e := anthText(b.Content, bp+".content")
			if e != nil {
				return nil, e
			}
			out = append(out, chat.Message{Role: "tool", ToolCallID: b.ToolUseID, Name: callNames[b.ToolUseID], Content: result})
		case skippedBlock(b.Type):
		default:
			return nil, unsupportedBlock(bp, b.Type, "text and tool_result")
		}
	}
	flush()
	if len(out) == 0 { // an empty turn renders as chat's content ""
		out = append(out, chat.Message{Role: "user"})
	}
	return out, nil
}

func convertAssistantTurn(raw json.RawMessage, p string) (chat.Message, *apiError) {
	msg := chat.Message{Role: "assistant"}
	blocks, text, e := anthBlocks(raw, p+".content")
	if e != nil || blocks == nil {
		msg.Content = text
		return msg, e
	}
	var texts []string
	for j, b := range blocks {
		bp := fmt.Sprintf("%s.content[%d]", p, j)
		switch {
		case b.Type == "text":
			texts = append(texts, b.Text)
		case b.Type == "tool_use":
			if b.Name == "" {
				return msg, badRequest(bp+".name", "%s.name is required", bp)
			}
			input := bytes.TrimSpace(b.Input)
			if len(input) == 0 || string(input) == "null" {
				input = []byte("{}")
			}
			if input[0] != '{' {
				return msg, badRequest(bp+".input", "%s.input must be a JSON object", bp)
			}
			msg.ToolCalls = append(msg.ToolCalls, chat.ToolCall{ID: b.ID, Name: b.Name, Arguments: append(json.RawMessage(nil), input...)})
		case skippedBlock(b.Type):
		default:
			return msg, unsupportedBlock(bp, b.Type, "text and tool_use")
		}
	}
	msg.Content = strings.Join(texts, "\n")
	msg.NullContent = len(texts) == 0 && len(msg.ToolCalls) > 0
	return msg, nil
}
