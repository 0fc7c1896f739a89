package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ortrain/ortrain/internal/chat"
)

// respItem is any input item; which fields matter depends on Type. id,
// status, phase, annotations and the like are ignored.
type respItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`   // message: a string or parts
	CallID    string          `json:"call_id"`   // function_call, function_call_output
	Name      string          `json:"name"`      // function_call
	Namespace string          `json:"namespace"` // function_call of a namespaced tool
	Arguments json.RawMessage `json:"arguments"` // function_call: a JSON string
	Output    json.RawMessage `json:"output"`    // function_call_output: a string or parts
}

// respTool is a function tool, a namespace of tools, or a hosted tool (any
// other type).
type respTool struct {
	Type        string            `json:"type"`
	Name        string            `json:"name"`
	Description string            `json:"description"`
	Parameters  json.RawMessage   `json:"parameters"`
	Tools       []json.RawMessage `json:"tools"` // namespace
}

// qualifiedName is a namespaced function as the client knows it.
type qualifiedName struct{ namespace, name string }

// responsesPlan is a checked Responses request as the chat pipeline takes
// it, with what the reply and the store need.
type responsesPlan struct {
	chatPlan
	// conversation is the messages without instructions: what a later
	// previous_response_id continues.
	conversation []chat.Message
	// namespaced maps the rendered name of a namespaced function back to
	// its namespace and name, so a call carries them back to the client.
	namespaced map[string]qualifiedName
	dropped    []string // the types of the tools left out
	forced     bool     // tool_choice asked for a call: accepted, not enforced
}

// planResponses converts the request, after the conversation it continues
// (prev, nil for none), into the chat messages and tools of the same
// conversation in chat/completions.
func planResponses(req *responsesRequest, prev []chat.Message) (*responsesPlan, *apiError) {
	p := &responsesPlan{namespaced: map[string]qualifiedName{}}
	for i, raw := range req.Tools {
		if e := p.addTool(raw, fmt.Sprintf("tools[%d]", i)); e != nil {
			return nil, e
		}
	}
	choice, e := p.toolChoice(req.ToolChoice)
	if e != nil {
		return nil, e
	}
	p.forced = choice == choiceRequired || choice == choiceNamed
	p.parseCalls = len(p.tools) > 0 && choice != choiceNone
	input, e := convertInput(req.Input, prev)
	if e != nil {
		return nil, e
	}
	p.conversation = append(append(make([]chat.Message, 0, len(prev)+len(input)), prev...), input...)
	if len(p.conversation) == 0 {
		return nil, badRequest("input", "input must hold at least one item")
	}
	p.messages = p.conversation
	if hasValue(req.Instructions) {
		var text string
		if json.Unmarshal(req.Instructions, &text) != nil {
			return nil, badRequest("instructions", "instructions must be a string")
		}
		p.messages = append([]chat.Message{{Role: "system", Content: text}}, p.conversation...)
	}
	return p, nil
}

// flatName is the name a namespaced function is offered to the model
// under: Codex's MCP namespaces end in "__" ("mcp__server__"), which joins
// as its older flat names did ("mcp__server__tool"); any other namespace
// is joined with "__".
func flatName(namespace, name string) string {
	if namespace == "" {
		return name
	}
	if strings.HasSuffix(namespace, "__") {
		return namespace + name
	}
	return namespace + "__" + name
}

// addTool offers a function tool, flattens a namespace's functions, and
// drops any other tool (hosted tools the engine cannot run, custom tools
// whose freeform input no chat template renders).
func (p *responsesPlan) addTool(raw json.RawMessage, param string) *apiError {
	var t respTool
	if json.Unmarshal(raw, &t) != nil {
		return badRequest(param, "%s must be a tool object", param)
	}
	switch t.Type {
	case "function":
		tool, e := functionTool(t, param)
		if e != nil {
			return e
		}
		p.tools = append(p.tools, tool)
	case "namespace":
		if t.Name == "" {
			return badRequest(param+".name", "%s.name is required", param)
		}
		for j, innerRaw := range t.Tools {
			ip := fmt.Sprintf("%s.tools[%d]", param, j)
			var inner respTool
			if json.Unmarshal(innerRaw, &inner) != nil {
				return badRequest(ip, "%s must be a tool object", ip)
			}
			if inner.Type != "function" {
				p.dropped = append(p.dropped, inner.Type)
				continue
			}
			tool, e := functionTool(inner, ip)
			if e != nil {
				return e
			}
			tool.Name = flatName(t.Name, inner.Name)
			p.namespaced[tool.Name] = qualifiedName{namespace: t.Name, name: inner.Name}
			p.tools = append(p.tools, tool)
		}
	case "":
		return badRequest(param+".type", "%s.type is required", param)
	default:
		p.dropped = append(p.dropped, t.Type)
	}
	return nil
}

func functionTool(t respTool, param string) (chat.Tool, *apiError) {
	if t.Name == "" {
		return chat.Tool{}, badRequest(param+".name", "%s.name is required", param)
	}
	params := bytes.TrimSpace(t.Parameters)
	if string(params) == "null" {
		params = nil
	}
	if len(params) > 0 && params[0] != '{' {
		return chat.Tool{}, badRequest(param+".parameters", "%s.parameters must be a JSON Schema object", param)
	}
	return chat.Tool{Name: t.Name, Description: t.Description, Parameters: json.RawMessage(params)}, nil
}

// toolChoice reads "auto", "none", "required", or an object: a function
// by name (which must be offered), allowed_tools (its mode), or a hosted
// or custom tool type (which names a dropped tool, so it cannot be more
// than a wish).
func (p *responsesPlan) toolChoice(raw json.RawMessage) (toolChoice, *apiError) {
	if !hasValue(raw) {
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
			if len(p.tools) == 0 && len(p.dropped) == 0 {
				return 0, badRequest("tool_choice", `tool_choice "required" needs tools`)
			}
			return choiceRequired, nil
		}
		return 0, badRequest("tool_choice", `tool_choice %q: want "auto", "none", "required" or an object`, s)
	}
	var c struct {
		Type string `json:"type"`
		Name string `json:"name"`
		Mode string `json:"mode"`
	}
	if json.Unmarshal(raw, &c) != nil || c.Type == "" {
		return 0, badRequest("tool_choice", `tool_choice must be "auto", "none", "required" or an object with a "type"`)
	}
	switch c.Type {
	case "function":
		if c.Name == "" {
			return 0, badRequest("tool_choice.name", `tool_choice.name is required with type "function"`)
		}
		for _, t := range p.tools {
			if t.Name == c.Name || p.namespaced[t.Name].name == c.Name {
				return choiceNamed, nil
			}
		}
		return 0, badRequest("tool_choice.name", "tool_choice.name is %q, which is not among the tools", c.Name)
	case "allowed_tools":
		if c.Mode == "required" {
			return choiceRequired, nil
		}
		return choiceAuto, nil
	}
	return choiceNamed, nil
}

// convertInput lays the input out as chat messages: a string is one user
// message; a message item keeps its role (developer becomes system) and
// its text; function_call items join the assistant turn before them (or
// open one whose content is null, as chat's reply of only calls has);
// function_call_output items become tool messages named after the call
// they answer (in prev or the input); reasoning items are skipped (no
// reply of this server holds one: the model's thinking stays in its text).
func convertInput(raw json.RawMessage, prev []chat.Message) ([]chat.Message, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if raw[0] == '"' {
		var text string
		if json.Unmarshal(raw, &text) != nil {
			return nil, badRequest("input", "input is not a valid JSON string")
		}
		return []chat.Message{{Role: "user", Content: text}}, nil
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return nil, badRequest("input", "input must be a string or a list of items")
	}
	callNames := map[string]string{} // call id → rendered function name
	for _, m := range prev {
		for _, c := range m.ToolCalls {
			callNames[c.ID] = c.Name
		}
	}
	var out []chat.Message
	turn := -1 // the assistant turn function calls join; -1: none
	for i, itemRaw := range items {
		p := fmt.Sprintf("input[%d]", i)
		var it respItem
		if json.Unmarshal(itemRaw, &it) != nil {
			return nil, badRequest(p, "%s must be an item object", p)
		}
		typ := it.Type
		if typ == "" && it.Role != "" {
			typ = "message"
		}
		switch typ {
		case "message":
			msg, e := inputMessage(it, p)
			if e != nil {
				return nil, e
			}
			out = append(out, msg)
			turn = -1
			if msg.Role == "assistant" {
				turn = len(out) - 1
			}
		case "function_call":
			if it.Name == "" {
				return nil, badRequest(p+".name", "%s.name is required", p)
			}
			if it.CallID == "" {
				return nil, badRequest(p+".call_id", "%s.call_id is required", p)
			}
			call := chat.ToolCall{ID: it.CallID, Name: flatName(it.Namespace, it.Name), Arguments: callArguments(it.Arguments)}
			callNames[call.ID] = call.Name
			if turn < 0 {
				out = append(out, chat.Message{Role: "assistant", NullContent: true})
				turn = len(out) - 1
			}
			out[turn].ToolCalls = append(out[turn].ToolCalls, call)
		case "function_call_output":
			if it.CallID == "" {
				return nil, badRequest(p+".call_id", "%s.call_id is required", p)
			}
			text, e := partsText(it.Output, p+".output", false)
			if e != nil {
				return nil, e
			}
			out = append(out, chat.Message{Role: "tool", ToolCallID: it.CallID, Name: callNames[it.CallID], Content: text})
			turn = -1
		case "reasoning":
		case "":
			return nil, badRequest(p+".type", "%s.type is required (or a role, for a message)", p)
		default:
			return nil, badRequest(p+".type", "%s.type is %q; this server accepts message, function_call, "+
				"function_call_output and reasoning items", p, typ)
		}
	}
	return out, nil
}

// inputMessage converts a message item: role user, assistant, system or
// developer, content a string or text parts.
func inputMessage(it respItem, p string) (chat.Message, *apiError) {
	role := it.Role
	switch role {
	case "user", "assistant", "system":
	case "developer":
		role = "system"
	default:
		return chat.Message{}, badRequest(p+".role", "%s.role %q: want user, assistant, system or developer", p, it.Role)
	}
	text, e := partsText(it.Content, p+".content", true)
	if e != nil {
		return chat.Message{}, e
	}
	return chat.Message{Role: role, Content: text}, nil
}

// partsText reads a string or a list of text parts (input_text,
// output_text, text), joined with newlines as chat joins text parts; null
// is "" where nullOK.
func partsText(raw json.RawMessage, param string, nullOK bool) (string, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		if nullOK {
			return "", nil
		}
		return "", badRequest(param, "%s is required", param)
	}
	if raw[0] == '"' {
		var text string
		if json.Unmarshal(raw, &text) != nil {
			return "", badRequest(param, "%s is not a valid JSON string", param)
		}
		return text, nil
	}
	var parts []contentPart
	if json.Unmarshal(raw, &parts) != nil {
		return "", badRequest(param, `%s must be a string or a list of {"type": "input_text", "text": …} parts`, param)
	}
	texts := make([]string, 0, len(parts))
	for j, part := range parts {
		switch part.Type {
		case "input_text", "output_text", "text":
			texts = append(texts, part.Text)
		default:
			why := ""
			switch part.Type {
			case "input_image", "input_file", "input_audio":
				why = " (this server serves a text-only model)"
			}
			return "", badRequest(fmt.Sprintf("%s[%d].type", param, j), "%s[%d].type is %q%s; only input_text and output_text parts are supported",
				param, j, part.Type, why)
		}
	}
	return strings.Join(texts, "\n"), nil
}
