package chat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// ToolCallFormat is how a model writes tool calls in its output.
type ToolCallFormat int

const (
	// FormatNone: no tool-call syntax; the whole turn is content.
	FormatNone ToolCallFormat = iota
	// FormatHermes: <tool_call>{"name": …, "arguments": …}</tool_call>
	// blocks (Hermes, Qwen2.5, Qwen3), any number, text around them.
	FormatHermes
	// FormatLlama3JSON: a bare {"name": …, "parameters": …} object
	// (optionally after <|python_tag|>, several separated by ";"). A JSON
	// object without "name" and "parameters"/"arguments" is an answer.
	FormatLlama3JSON
	// FormatMistral: [TOOL_CALLS] followed by a JSON array of calls, or by
	// NAME[ARGS]{…} (optionally NAME[CALL_ID]ID[ARGS]{…}) per marker.
	FormatMistral
	// FormatQwenXML: <tool_call><function=NAME><parameter=KEY>VALUE
	// </parameter></function></tool_call> (Qwen3-Coder, Qwen3.5); several
	// functions may share one wrapper and the wrapper may be missing.
	// Values are text, typed by the tool's JSON Schema.
	FormatQwenXML
	// FormatDeepSeekV3: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>…
	// <｜tool▁call▁end｜>…<｜tool▁calls▁end｜>, in DeepSeek-V3/R1's form
	// (function<｜tool▁sep｜>NAME\n```json\nARGS\n```) or V3.1's
	// (NAME<｜tool▁sep｜>ARGS).
	FormatDeepSeekV3
	// FormatGLM45: <tool_call>NAME<arg_key>K</arg_key><arg_value>V
	// </arg_value>…</tool_call> (GLM-4.5, GLM-4.6). Values are text.
	FormatGLM45
	// FormatMiniMaxM2: <minimax:tool_call><invoke name="NAME"><parameter
	// name="K">V</parameter>…</invoke>…</minimax:tool_call>. Values are text.
	FormatMiniMaxM2
	// FormatKimiK2: <|tool_calls_section_begin|><|tool_call_begin|>
	// functions.NAME:IDX<|tool_call_argument_begin|>ARGS<|tool_call_end|>…
	// <|tool_calls_section_end|>; the call id is functions.NAME:IDX.
	FormatKimiK2
)

var toolCallFormatNames = [...]string{"none", "hermes", "llama3_json", "mistral", "qwen_xml", "deepseek_v3", "glm45", "minimax_m2", "kimi_k2"}

func (f ToolCallFormat) String() string {
	if f >= 0 && int(f) < len(toolCallFormatNames) {
		return toolCallFormatNames[f]
	}
	return fmt.Sprintf("ToolCallFormat(%d)", int(f))
}

// ToolCallFormatNames lists the names ParseToolCallFormat accepts, for
// configuration validation ("auto" is the caller's).
func ToolCallFormatNames() []string { return append([]string(nil), toolCallFormatNames[:]...) }

// ParseToolCallFormat reads a format name from configuration.
func ParseToolCallFormat(name string) (ToolCallFormat, error) {
	for i, n := range toolCallFormatNames {
		if n == name {
			return ToolCallFormat(i), nil
		}
	}
	return FormatNone, fmt.Errorf("unknown tool-call format %q (allowed: %s)", name, strings.Join(toolCallFormatNames[:], ", "))
}

// UnknownToolCallFormatError: the chat template writes tool calls in no
// syntax ortrain can parse. With tools in use it is a startup error; the
// user names the format with chat.tool_call_format.
type UnknownToolCallFormatError struct {
	// Formats are the names chat.tool_call_format accepts.
	Formats []string
}

func (e *UnknownToolCallFormatError) Error() string {
	return fmt.Sprintf("the chat template uses no tool-call syntax ortrain recognizes; set chat.tool_call_format to the one the model writes (%s)",
		strings.Join(e.Formats, ", "))
}

// Detection markers, most specific first: GLM-4.5 and Qwen XML templates
// also contain <tool_call>, so they are checked before hermes.
var formatMarkers = []struct {
	format ToolCallFormat
	all    []string
}{
	{FormatKimiK2, []string{"<|tool_calls_section_begin|>"}},
	{FormatMiniMaxM2, []string{"<minimax:tool_call>"}},
	{FormatDeepSeekV3, []string{"<｜tool▁calls▁begin｜>"}},
	{FormatGLM45, []string{"<tool_call>", "<arg_key>", "<arg_value>"}},
	{FormatQwenXML, []string{"<function=", "<parameter="}},
	{FormatHermes, []string{"<tool_call>"}},
	{FormatMistral, []string{"[TOOL_CALLS]"}},
	{FormatLlama3JSON, []string{"<|start_header_id|>", "<|python_tag|>"}},
	{FormatLlama3JSON, []string{"<|start_header_id|>", `"parameters"`}},
}

// DetectToolCallFormat picks the format a chat template teaches the model
// from the literal markers it writes. A template with none of them returns
// FormatNone and *UnknownToolCallFormatError; that matters only when tools
// are offered.
func DetectToolCallFormat(template string) (ToolCallFormat, error) {
	for _, m := range formatMarkers {
		found := true
		for _, s := range m.all {
			if !strings.Contains(template, s) {
				found = false
				break
			}
		}
		if found {
			return m.format, nil
		}
	}
	return FormatNone, &UnknownToolCallFormatError{Formats: ToolCallFormatNames()[1:]}
}

// ToolCallErrorKind says why a call was not returned as a ToolCall.
type ToolCallErrorKind int

const (
	// Malformed: the call's text does not follow the format.
	Malformed ToolCallErrorKind = iota
	// SchemaViolation: the call parsed, but an argument does not fit the
	// tool's JSON Schema (wrong type, not in the enum, missing, unknown).
	SchemaViolation
)

func (k ToolCallErrorKind) String() string {
	if k == SchemaViolation {
		return "schema violation"
	}
	return "malformed"
}

// ToolCallError is one call the parser could not turn into a ToolCall. Its
// message is written for the model: the rollout answers the call with a
// tool turn holding it.
type ToolCallError struct {
	Format ToolCallFormat
	Kind   ToolCallErrorKind
	Index  int    // which call (0-based) in the turn
	Name   string // the tool named, when it could be read
	// ID is the call's id: the one the model wrote, or the one the
	// Conversation assigned so the tool turn can answer it.
	ID     string
	Text   string // the offending text, truncated
	Reason string
}

func (e *ToolCallError) Error() string {
	if e.Kind == SchemaViolation {
		return fmt.Sprintf("tool call %d (%s) does not match the tool's schema: %s", e.Index, e.Name, e.Reason)
	}
	return fmt.Sprintf("tool call %d (%s format) is malformed: %s: %q", e.Index, e.Format, e.Reason, e.Text)
}

// ToolCallErrors is every failed call of one turn, in order. It unwraps to
// its elements, so errors.As finds a *ToolCallError in it.
type ToolCallErrors []*ToolCallError

func (es ToolCallErrors) Error() string {
	msgs := make([]string, len(es))
	for i, e := range es {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "; ")
}

// Unwrap returns the elements for errors.Is and errors.As.
func (es ToolCallErrors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// ParsedTurn is an assistant turn split into content, calls and failures.
type ParsedTurn struct {
	Content string     // the text outside the calls, trimmed
	Calls   []ToolCall // well-formed calls whose arguments fit the schema
	Errors  ToolCallErrors
}

// Err is Errors as an error: nil when every call parsed.
func (p ParsedTurn) Err() error {
	if len(p.Errors) == 0 {
		return nil
	}
	return p.Errors
}

// trailingEndMarkers are end-of-turn strings stripped from the end of a
// decoded turn before parsing.
var trailingEndMarkers = [...]string{
	"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<|endoftext|>", "<end_of_turn>", "</s>",
	"<｜end▁of▁sentence｜>", "<|user|>", "<|observation|>", "[e~[",
}

func stripEndMarkers(text string) string {
	for {
		trimmed := strings.TrimRight(text, " \t\r\n")
		cut := false
		for _, m := range trailingEndMarkers {
			if strings.HasSuffix(trimmed, m) {
				text, cut = strings.TrimSuffix(trimmed, m), true
			}
		}
		if !cut {
			return text
		}
	}
}

// ParseToolCalls is ParseToolCallsFor without schemas: text values
// (qwen_xml, glm45, minimax_m2) are JSON when they parse as JSON, else
// strings. err is ToolCallErrors (errors.As finds each *ToolCallError);
// calls holds the well-formed calls. It never panics.
func ParseToolCalls(format ToolCallFormat, text string) (content string, calls []ToolCall, err error) {
	p := ParseToolCallsFor(format, text, nil)
	return p.Content, p.Calls, p.Err()
}

// ParseToolCallsFor extracts the tool calls from an assistant turn's text
// (decoded with special tokens kept; a trailing end-of-turn marker is
// ignored). tools are the tools offered: in formats whose values are text,
// each argument is typed by its property's JSON Schema (a string stays a
// string; integer, number, boolean, object and array are parsed; enum and
// required are checked) and a mismatch is a SchemaViolation error instead
// of a call. Arguments of a tool not in tools, or of a property without a
// schema, are JSON when they parse as JSON, else strings. Every call in the
// text is either in Calls or in Errors. It never panics.
func ParseToolCallsFor(format ToolCallFormat, text string, tools []Tool) ParsedTurn {
	text = stripEndMarkers(text)
	p := &parser{format: format, schemas: toolSchemas(tools)}
	var content string
	switch format {
	case FormatHermes:
		content = p.parseHermes(text)
	case FormatLlama3JSON:
		content = p.parseLlama3JSON(text)
	case FormatMistral:
		content = p.parseMistral(text)
	case FormatQwenXML:
		content = p.parseQwenXML(text)
	case FormatDeepSeekV3:
		content = p.parseDeepSeek(text)
	case FormatGLM45:
		content = p.parseGLM45(text)
	case FormatMiniMaxM2:
		content = p.parseMiniMax(text)
	case FormatKimiK2:
		content = p.parseKimi(text)
	default:
		content = text
	}
	return ParsedTurn{Content: strings.TrimSpace(content), Calls: p.calls, Errors: p.errs}
}

// parser collects the calls and failures of one turn, numbering them in
// order of appearance.
type parser struct {
	format  ToolCallFormat
	schemas map[string]*objectSchema
	calls   []ToolCall
	errs    ToolCallErrors
	n       int
}

func (p *parser) fail(name, text, reason string) {
	p.errs = append(p.errs, &ToolCallError{Format: p.format, Kind: Malformed, Index: p.n, Name: name, Text: truncate(strings.TrimSpace(text)), Reason: reason})
	p.n++
}

// addJSON records a call whose arguments are JSON (an object, a string
// holding one, or null/missing).
func (p *parser) addJSON(id, name string, raw json.RawMessage, text string) {
	if name == "" {
		p.fail(name, text, "the tool name is empty")
		return
	}
	args, err := normalizeArguments(raw)
	if err != nil {
		p.fail(name, text, err.Error())
		return
	}
	p.calls = append(p.calls, ToolCall{ID: id, Name: name, Arguments: args})
	p.n++
}

// addText records a call whose argument values are text, typing them by
// the tool's schema.
func (p *parser) addText(name string, params []textParam, text string) {
	if name == "" {
		p.fail(name, text, "the tool name is empty")
		return
	}
	args, violation := typeArguments(p.schemas[name], params)
	if violation != "" {
		p.errs = append(p.errs, &ToolCallError{Format: p.format, Kind: SchemaViolation, Index: p.n, Name: name, Text: truncate(strings.TrimSpace(text)), Reason: violation})
		p.n++
		return
	}
	p.calls = append(p.calls, ToolCall{Name: name, Arguments: args})
	p.n++
}

// addObject records a call from a {"name": …, "arguments"|"parameters": …}
// object.
func (p *parser) addObject(raw json.RawMessage) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		p.fail("", string(raw), "not a JSON object: "+err.Error())
		return
	}
	var name string
	if err := json.Unmarshal(obj["name"], &name); err != nil || name == "" {
		p.fail("", string(raw), `"name" must be a non-empty string`)
		return
	}
	var id string
	if rawID, ok := obj["id"]; ok {
		_ = json.Unmarshal(rawID, &id) // a non-string id is dropped; the conversation assigns one
	}
	args, ok := obj["arguments"]
	if !ok {
		args = obj["parameters"]
	}
	p.addJSON(id, name, args, string(raw))
}

func truncate(s string) string {
	const max = 200
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}

// normalizeArguments accepts an object, a JSON string holding an object,
// or null/missing (meaning {}), and returns the object's JSON.
func normalizeArguments(raw json.RawMessage) (json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return json.RawMessage("{}"), nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("arguments string: %w", err)
		}
		raw = bytes.TrimSpace([]byte(s))
	}
	if len(raw) == 0 || raw[0] != '{' || !json.Valid(raw) {
		return nil, fmt.Errorf(`"arguments" must be a JSON object`)
	}
	return append(json.RawMessage(nil), raw...), nil
}

// decodeJSONPrefix reads one JSON value at the start of s (after
// whitespace) and returns it and the text after it. Strings inside the
// value may hold any closing tag.
func decodeJSONPrefix(s string) (json.RawMessage, string, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return nil, s, err
	}
	return raw, s[dec.InputOffset():], nil
}

// jsonString encodes s without HTML escaping (json.Marshal writes < as
// \u003c).
func jsonString(s string) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// cutAny finds the earliest of seps in s.
func cutAny(s string, seps ...string) (before, sep, after string, found bool) {
	best := -1
	for _, m := range seps {
		if i := strings.Index(s, m); i >= 0 && (best < 0 || i < best || i == best && len(m) > len(sep)) {
			best, sep = i, m
		}
	}
	if best < 0 {
		return s, "", "", false
	}
	return s[:best], sep, s[best+len(sep):], true
}

// cutClosing finds the closing tag close in s whose following text (after
// whitespace) starts with one of next, or is empty: a value may itself
// contain the closing tag.
func cutClosing(s, closeTag string, next ...string) (value, rest string, ok bool) {
	from := 0
	for {
		i := strings.Index(s[from:], closeTag)
		if i < 0 {
			return "", s, false
		}
		end := from + i
		after := s[end+len(closeTag):]
		tail := strings.TrimLeft(after, " \t\r\n")
		if tail == "" {
			return s[:end], after, true
		}
		for _, n := range next {
			if strings.HasPrefix(tail, n) {
				return s[:end], after, true
			}
		}
		from = end + len(closeTag)
	}
}
