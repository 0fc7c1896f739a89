package chat

import (
	"encoding/json"
	"strings"
)

// Parsers of the formats whose arguments are a JSON object. Each returns
// the content (the text outside the calls) and records calls and failures
// on p.

const ws = " \t\r\n"

func (p *parser) parseHermes(text string) string {
	const open, closeTag = "<tool_call>", "</tool_call>"
	var content strings.Builder
	for {
		before, _, body, found := cutAny(text, open)
		content.WriteString(before)
		if !found {
			return content.String()
		}
		text = p.hermesCall(body, closeTag)
	}
}

// hermesCall reads one JSON call object and its closing tag (missing at
// the end of the text: the model stopped there); it returns the text after.
func (p *parser) hermesCall(body, closeTag string) string {
	trimmed := strings.TrimLeft(body, ws)
	if !strings.HasPrefix(trimmed, "{") {
		bad, rest, _ := strings.Cut(body, closeTag)
		p.fail("", bad, "want a JSON object {\"name\": …, \"arguments\": {…}}")
		return rest
	}
	raw, after, err := decodeJSONPrefix(trimmed)
	if err != nil {
		bad, rest, _ := strings.Cut(body, closeTag)
		p.fail("", bad, "not a JSON object: "+err.Error())
		return rest
	}
	tail := strings.TrimLeft(after, ws)
	switch {
	case strings.HasPrefix(tail, closeTag):
		p.addObject(raw)
		return tail[len(closeTag):]
	case tail == "":
		p.addObject(raw)
		return ""
	}
	extra, rest, _ := strings.Cut(tail, closeTag)
	p.fail("", string(raw)+extra, "text after the JSON object, before "+closeTag)
	return rest
}

// isLlamaCall says whether a JSON object is a call ("name" and
// "parameters" or "arguments") rather than a JSON answer.
func isLlamaCall(raw json.RawMessage) bool {
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil {
		return false
	}
	_, hasName := obj["name"]
	_, hasParams := obj["parameters"]
	_, hasArgs := obj["arguments"]
	return hasName && (hasParams || hasArgs)
}

func (p *parser) parseLlama3JSON(text string) string {
	body := strings.TrimLeft(text, ws)
	tagged := strings.HasPrefix(body, "<|python_tag|>")
	body = strings.TrimLeft(strings.TrimPrefix(body, "<|python_tag|>"), ws)
	if !strings.HasPrefix(body, "{") {
		if tagged {
			p.fail("", body, "want a JSON call object after <|python_tag|>")
			return ""
		}
		return text
	}
	for first := true; ; first = false {
		raw, rest, err := decodeJSONPrefix(body)
		if err != nil {
			if first && !tagged && !looksLikeCallStart(body) {
				return text // not JSON at all: an answer that starts with {
			}
			p.fail("", body, "not a JSON object: "+err.Error())
			return ""
		}
		if !isLlamaCall(raw) {
			if first && !tagged {
				return text // a JSON answer, not a call
			}
			p.fail("", string(raw), `want {"name": …, "parameters": {…}}`)
		} else {
			p.addObject(raw)
		}
		rest = strings.TrimLeft(rest, ws+";")
		if !strings.HasPrefix(rest, "{") {
			return rest // text after the calls stays content
		}
		body = rest
	}
}

// looksLikeCallStart: the text starts a JSON object whose first key is
// "name" (a call the model did not finish).
func looksLikeCallStart(s string) bool {
	s = strings.TrimLeft(strings.TrimPrefix(s, "{"), ws)
	return strings.HasPrefix(s, `"name"`)
}

func (p *parser) parseMistral(text string) string {
	const marker = "[TOOL_CALLS]"
	content, body, found := strings.Cut(text, marker)
	if !found {
		return text
	}
	if trimmed := strings.TrimLeft(body, ws); strings.HasPrefix(trimmed, "[") {
		raw, rest, err := decodeJSONPrefix(trimmed)
		var items []json.RawMessage
		if err == nil {
			err = json.Unmarshal(raw, &items)
		}
		if err != nil {
			p.fail("", trimmed, "not a JSON array of calls: "+err.Error())
			return content
		}
		if len(items) == 0 {
			p.fail("", trimmed, "[TOOL_CALLS] followed by an empty list of calls")
		}
		for _, it := range items {
			p.addObject(it)
		}
		if rest = strings.TrimSpace(rest); rest != "" {
			return content + "\n" + rest
		}
		return content
	}
	// NAME[ARGS]{…} or NAME[CALL_ID]ID[ARGS]{…}, one per marker.
	for _, part := range strings.Split(body, marker) {
		head, args, ok := strings.Cut(part, "[ARGS]")
		name, id, _ := strings.Cut(head, "[CALL_ID]")
		name, id = strings.TrimSpace(name), strings.TrimSpace(id)
		if !ok || name == "" {
			p.fail(name, part, "want NAME[ARGS]{…} or a JSON array")
			continue
		}
		raw, rest, err := decodeJSONPrefix(args)
		if err != nil {
			p.fail(name, part, "arguments are not JSON: "+err.Error())
			continue
		}
		if strings.TrimSpace(rest) != "" {
			p.fail(name, part, "text after the arguments")
			continue
		}
		p.addJSON(id, name, raw, part)
	}
	return content
}

const (
	dsCallsBegin = "<｜tool▁calls▁begin｜>"
	dsCallsEnd   = "<｜tool▁calls▁end｜>"
	dsCallBegin  = "<｜tool▁call▁begin｜>"
	dsCallEnd    = "<｜tool▁call▁end｜>"
	dsSep        = "<｜tool▁sep｜>"
)

func (p *parser) parseDeepSeek(text string) string {
	var content strings.Builder
	for {
		// A call outside a section (the R1 template writes its later calls
		// after the section's end) is still a call.
		before, tag, body, found := cutAny(text, dsCallsBegin, dsCallBegin)
		content.WriteString(before)
		if !found {
			return content.String()
		}
		if tag == dsCallBegin {
			text = p.deepSeekCall(body)
			continue
		}
		text = p.deepSeekSection(body)
	}
}

// deepSeekSection reads calls up to the section's end marker and returns
// the text after it.
func (p *parser) deepSeekSection(body string) string {
	for n := 0; ; n++ {
		body = strings.TrimLeft(body, ws)
		if n == 0 && (body == "" || strings.HasPrefix(body, dsCallsEnd)) {
			p.fail("", dsCallsBegin+body, "a tool-call section without calls")
		}
		switch {
		case body == "":
			return ""
		case strings.HasPrefix(body, dsCallsEnd):
			return body[len(dsCallsEnd):]
		case !strings.HasPrefix(body, dsCallBegin):
			bad, rest, _ := strings.Cut(body, dsCallsEnd)
			p.fail("", bad, "want "+dsCallBegin+" or "+dsCallsEnd)
			return rest
		}
		body = p.deepSeekCall(body[len(dsCallBegin):])
	}
}

// deepSeekCall reads TYPE<sep>NAME\n```json\nARGS\n``` (V3, R1) or
// NAME<sep>ARGS (V3.1), then the call's end marker.
func (p *parser) deepSeekCall(body string) string {
	skip := func(reason, name string) string {
		bad, rest, found := strings.Cut(body, dsCallEnd)
		if !found {
			if bad, rest, found = strings.Cut(body, dsCallsEnd); found {
				rest = dsCallsEnd + rest // the section loop ends there
			}
		}
		p.fail(name, bad, reason)
		return rest
	}
	head, afterSep, ok := strings.Cut(body, dsSep)
	if !ok || strings.Contains(head, dsCallEnd) {
		return skip("want NAME"+dsSep+"ARGUMENTS", "")
	}
	name := strings.TrimSpace(head)
	argText := strings.TrimLeft(afterSep, ws)
	if !strings.HasPrefix(argText, "{") && !strings.HasPrefix(argText, `"`) {
		// V3: the head is the call type, the name ends the line, then a
		// ```json fence.
		var line string
		line, argText, _ = strings.Cut(afterSep, "\n")
		name = strings.TrimSpace(line)
		argText = strings.TrimLeft(argText, ws)
		if !strings.HasPrefix(argText, "```") {
			return skip("want NAME then a ```json block", name)
		}
		argText = strings.TrimPrefix(strings.TrimPrefix(argText, "```"), "json")
	}
	raw, rest, err := decodeJSONPrefix(argText)
	if err != nil {
		return skip("arguments are not JSON: "+err.Error(), name)
	}
	rest = strings.TrimLeft(rest, ws)
	rest = strings.TrimLeft(strings.TrimPrefix(rest, "```"), ws)
	switch {
	case strings.HasPrefix(rest, dsCallEnd):
		rest = rest[len(dsCallEnd):]
	case rest != "":
		return skip("text after the arguments", name)
	}
	p.addJSON("", name, raw, head+dsSep+string(raw))
	return rest
}

const (
	kimiSectionBegin = "<|tool_calls_section_begin|>"
	kimiSectionEnd   = "<|tool_calls_section_end|>"
	kimiCallBegin    = "<|tool_call_begin|>"
	kimiArgBegin     = "<|tool_call_argument_begin|>"
	kimiCallEnd      = "<|tool_call_end|>"
)

func (p *parser) parseKimi(text string) string {
	var content strings.Builder
	for {
		before, _, body, found := cutAny(text, kimiSectionBegin)
		content.WriteString(before)
		if !found {
			return content.String()
		}
		text = p.kimiSection(body)
	}
}

func (p *parser) kimiSection(body string) string {
	for n := 0; ; n++ {
		body = strings.TrimLeft(body, ws)
		if n == 0 && (body == "" || strings.HasPrefix(body, kimiSectionEnd)) {
			p.fail("", kimiSectionBegin+body, "a tool-call section without calls")
		}
		switch {
		case body == "":
			return ""
		case strings.HasPrefix(body, kimiSectionEnd):
			return body[len(kimiSectionEnd):]
		case !strings.HasPrefix(body, kimiCallBegin):
			bad, rest, _ := strings.Cut(body, kimiSectionEnd)
			p.fail("", bad, "want "+kimiCallBegin+" or "+kimiSectionEnd)
			return rest
		}
		body = p.kimiCall(body[len(kimiCallBegin):])
	}
}

// kimiCall reads functions.NAME:IDX<arg>ARGS<end>.
func (p *parser) kimiCall(body string) string {
	skip := func(reason, name string) string {
		bad, rest, found := strings.Cut(body, kimiCallEnd)
		if !found {
			if bad, rest, found = strings.Cut(body, kimiSectionEnd); found {
				rest = kimiSectionEnd + rest // the section loop ends there
			}
		}
		p.fail(name, bad, reason)
		return rest
	}
	head, argText, ok := strings.Cut(body, kimiArgBegin)
	if !ok || strings.Contains(head, kimiCallEnd) {
		return skip("want functions.NAME:INDEX"+kimiArgBegin+"ARGUMENTS", "")
	}
	id := strings.TrimSpace(head)
	name := strings.TrimPrefix(id, "functions.")
	if i := strings.LastIndex(name, ":"); i >= 0 {
		name = name[:i]
	}
	raw, rest, err := decodeJSONPrefix(argText)
	if err != nil {
		return skip("arguments are not JSON: "+err.Error(), name)
	}
	rest = strings.TrimLeft(rest, ws)
	switch {
	case strings.HasPrefix(rest, kimiCallEnd):
		rest = rest[len(kimiCallEnd):]
	case rest != "":
		return skip("text after the arguments", name)
	}
	p.addJSON(id, name, raw, head+kimiArgBegin+string(raw))
	return rest
}
