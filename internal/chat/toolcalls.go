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
	// FormatNone: the template has no tool-call syntax we know.
	FormatNone ToolCallFormat = iota
	// FormatHermes: <tool_call>{"name": …, "arguments": …}</tool_call>
	// blocks (Hermes, Qwen2.5, Qwen3), any number, text around them.
	FormatHermes
	// FormatLlama3JSON: a bare {"name": …, "parameters": …} object
	// (optionally after <|python_tag|>, several separated by ";").
	FormatLlama3JSON
	// FormatMistral: [TOOL_CALLS] followed by a JSON array of calls, or by
	// name[ARGS]{…} (newer Mistral tokenizers).
	FormatMistral
	// FormatQwenXML: <tool_call><function=NAME><parameter=KEY>VALUE
	// </parameter></function></tool_call> (Qwen3-Coder, Qwen3.5); a value
	// is JSON when it parses as JSON, else a string.
	FormatQwenXML
)

var toolCallFormatNames = [...]string{"none", "hermes", "llama3_json", "mistral", "qwen_xml"}

func (f ToolCallFormat) String() string {
	if int(f) < len(toolCallFormatNames) {
		return toolCallFormatNames[f]
	}
	return fmt.Sprintf("ToolCallFormat(%d)", int(f))
}

// ParseToolCallFormat reads a format name from configuration.
func ParseToolCallFormat(name string) (ToolCallFormat, error) {
	for i, n := range toolCallFormatNames {
		if n == name {
			return ToolCallFormat(i), nil
		}
	}
	return FormatNone, fmt.Errorf("unknown tool-call format %q (allowed: %s)", name, strings.Join(toolCallFormatNames[:], ", "))
}

// DetectToolCallFormat picks the format a chat template teaches the model.
func DetectToolCallFormat(template string) ToolCallFormat {
	switch {
	case strings.Contains(template, "<function=") && strings.Contains(template, "<parameter="):
		return FormatQwenXML
	case strings.Contains(template, "<tool_call>"):
		return FormatHermes
	case strings.Contains(template, "[TOOL_CALLS]"):
		return FormatMistral
	case strings.Contains(template, "<|start_header_id|>") &&
		(strings.Contains(template, `"parameters"`) || strings.Contains(template, "<|python_tag|>")):
		return FormatLlama3JSON
	}
	return FormatNone
}

// ToolCallError describes a malformed tool call in words the rollout can
// show the model.
type ToolCallError struct {
	Format ToolCallFormat
	Index  int    // which call (0-based) in the message
	Text   string // the offending text, truncated
	Reason string
}

func (e *ToolCallError) Error() string {
	return fmt.Sprintf("tool call %d (%s format) is malformed: %s: %q", e.Index, e.Format, e.Reason, e.Text)
}

// trailingEndMarkers are end-of-turn strings stripped from the end of a
// decoded turn before parsing.
var trailingEndMarkers = [...]string{"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<|endoftext|>", "<end_of_turn>", "</s>"}

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

// ParseToolCalls extracts the tool calls from an assistant turn's text
// (decoded with special tokens kept; a trailing end-of-turn marker is
// ignored). content is the text outside the calls, trimmed. When a call is
// malformed, err is a *ToolCallError and calls holds the well-formed ones.
// It never panics.
func ParseToolCalls(format ToolCallFormat, text string) (content string, calls []ToolCall, err error) {
	text = stripEndMarkers(text)
	switch format {
	case FormatHermes:
		return parseHermes(text)
	case FormatLlama3JSON:
		return parseLlama3JSON(text)
	case FormatMistral:
		return parseMistral(text)
	case FormatQwenXML:
		return parseQwenXML(text)
	}
	return strings.TrimSpace(text), nil, nil
}

func truncate(s string) string {
	const max = 200
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}

func parseHermes(text string) (string, []ToolCall, error) {
	return parseToolCallBlocks(text, func(i int, body string) (ToolCall, error) {
		return decodeCallObject(FormatHermes, i, body, "arguments")
	})
}

func parseQwenXML(text string) (string, []ToolCall, error) {
	return parseToolCallBlocks(text, decodeXMLCall)
}

// parseToolCallBlocks cuts <tool_call>…</tool_call> blocks (the last may be
// unclosed) out of text and decodes each.
func parseToolCallBlocks(text string, decode func(i int, body string) (ToolCall, error)) (string, []ToolCall, error) {
	const open, closeTag = "<tool_call>", "</tool_call>"
	var content strings.Builder
	var calls []ToolCall
	var firstErr error
	for i := 0; ; i++ {
		start := strings.Index(text, open)
		if start < 0 {
			content.WriteString(text)
			break
		}
		content.WriteString(text[:start])
		body := text[start+len(open):]
		end := strings.Index(body, closeTag)
		rest := ""
		if end >= 0 {
			body, rest = body[:end], body[end+len(closeTag):]
		}
		call, err := decode(i, body)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		if err == nil {
			calls = append(calls, call)
		}
		if end < 0 {
			break // unclosed last call: the model stopped inside it
		}
		text = rest
	}
	return strings.TrimSpace(content.String()), calls, firstErr
}

// decodeCallObject reads {"name": …, "arguments"|"parameters": …}.
func decodeCallObject(format ToolCallFormat, index int, body string, argKeys ...string) (ToolCall, error) {
	fail := func(reason string) (ToolCall, error) {
		return ToolCall{}, &ToolCallError{Format: format, Index: index, Text: truncate(strings.TrimSpace(body)), Reason: reason}
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(strings.TrimSpace(body)), &obj); err != nil {
		return fail("not a JSON object: " + err.Error())
	}
	var name string
	if err := json.Unmarshal(obj["name"], &name); err != nil || name == "" {
		return fail(`"name" must be a non-empty string`)
	}
	call := ToolCall{Name: name}
	if rawID, ok := obj["id"]; ok {
		_ = json.Unmarshal(rawID, &call.ID)
	}
	var raw json.RawMessage
	for _, k := range append(argKeys, "arguments", "parameters") {
		if v, ok := obj[k]; ok {
			raw = v
			break
		}
	}
	args, err := normalizeArguments(raw)
	if err != nil {
		return fail(err.Error())
	}
	call.Arguments = args
	return call, nil
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

func parseLlama3JSON(text string) (string, []ToolCall, error) {
	body := strings.TrimSpace(text)
	body = strings.TrimSpace(strings.TrimPrefix(body, "<|python_tag|>"))
	if !strings.HasPrefix(body, "{") {
		return strings.TrimSpace(text), nil, nil
	}
	dec := json.NewDecoder(strings.NewReader(body))
	var calls []ToolCall
	for i := 0; ; i++ {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return "", calls, &ToolCallError{Format: FormatLlama3JSON, Index: i, Text: truncate(body), Reason: "not a JSON object: " + err.Error()}
		}
		call, err := decodeCallObject(FormatLlama3JSON, i, string(raw), "parameters")
		if err != nil {
			return "", calls, err
		}
		calls = append(calls, call)
		rest := strings.TrimLeft(body[dec.InputOffset():], " \t\r\n;")
		if rest == "" {
			return "", calls, nil
		}
		body = rest
		dec = json.NewDecoder(strings.NewReader(body))
	}
}

func parseMistral(text string) (string, []ToolCall, error) {
	const marker = "[TOOL_CALLS]"
	start := strings.Index(text, marker)
	if start < 0 {
		return strings.TrimSpace(text), nil, nil
	}
	content := strings.TrimSpace(text[:start])
	body := strings.TrimSpace(text[start+len(marker):])
	if strings.HasPrefix(body, "[") {
		var items []json.RawMessage
		if err := json.Unmarshal([]byte(body), &items); err != nil {
			return content, nil, &ToolCallError{Format: FormatMistral, Text: truncate(body), Reason: "not a JSON array of calls: " + err.Error()}
		}
		var calls []ToolCall
		for i, it := range items {
			call, err := decodeCallObject(FormatMistral, i, string(it), "arguments")
			if err != nil {
				return content, calls, err
			}
			calls = append(calls, call)
		}
		return content, calls, nil
	}
	// name[ARGS]{…}, one per [TOOL_CALLS] marker.
	var calls []ToolCall
	for i, part := range strings.Split(body, marker) {
		name, args, ok := strings.Cut(strings.TrimSpace(part), "[ARGS]")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return content, calls, &ToolCallError{Format: FormatMistral, Index: i, Text: truncate(part), Reason: "want NAME[ARGS]{…} or a JSON array"}
		}
		norm, err := normalizeArguments(json.RawMessage(strings.TrimSpace(args)))
		if err != nil {
			return content, calls, &ToolCallError{Format: FormatMistral, Index: i, Text: truncate(part), Reason: err.Error()}
		}
		calls = append(calls, ToolCall{Name: name, Arguments: norm})
	}
	return content, calls, nil
}

// decodeXMLCall reads <function=NAME><parameter=KEY>VALUE</parameter>…
// </function>.
func decodeXMLCall(index int, body string) (ToolCall, error) {
	fail := func(reason string) (ToolCall, error) {
		return ToolCall{}, &ToolCallError{Format: FormatQwenXML, Index: index, Text: truncate(strings.TrimSpace(body)), Reason: reason}
	}
	rest := strings.TrimSpace(body)
	if !strings.HasPrefix(rest, "<function=") {
		return fail("want <function=NAME>")
	}
	name, rest, ok := strings.Cut(rest[len("<function="):], ">")
	name = strings.TrimSpace(name)
	if !ok || name == "" {
		return fail("want <function=NAME> with a non-empty name")
	}
	var args bytes.Buffer
	args.WriteByte('{')
	for n := 0; ; n++ {
		rest = strings.TrimSpace(rest)
		if strings.HasPrefix(rest, "</function>") || rest == "" {
			break // an unclosed function at the end is accepted
		}
		if !strings.HasPrefix(rest, "<parameter=") {
			return fail("want <parameter=KEY> or </function>")
		}
		key, after, ok := strings.Cut(rest[len("<parameter="):], ">")
		value, tail, closed := strings.Cut(after, "</parameter>")
		if !ok || strings.TrimSpace(key) == "" || !closed {
			return fail("want <parameter=KEY>VALUE</parameter>")
		}
		if n > 0 {
			args.WriteString(", ")
		}
		args.Write(jsonString(strings.TrimSpace(key)))
		args.WriteString(": ")
		args.Write(xmlParameterJSON(value))
		rest = tail
	}
	args.WriteByte('}')
	return ToolCall{Name: name, Arguments: json.RawMessage(args.Bytes())}, nil
}

// xmlParameterJSON is a parameter value as JSON: the value itself when it
// parses as JSON, else a JSON string (one newline trimmed at each end).
func xmlParameterJSON(value string) []byte {
	value = strings.TrimSuffix(strings.TrimPrefix(value, "\n"), "\n")
	if trimmed := strings.TrimSpace(value); trimmed != "" && json.Valid([]byte(trimmed)) {
		return []byte(trimmed)
	}
	return jsonString(value)
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
