package chat

import "strings"

// Parsers of the formats whose argument values are text (typed later by
// the tool's schema). A value ends at the first closing tag that is
// followed by the next parameter, the end of the call or the end of the
// text, so values may contain the closing tags themselves.

// textParam is one key/value pair as the model wrote it. trimNewline:
// the template puts one newline on each side of the value.
type textParam struct {
	key, value  string
	trimNewline bool
}

func (p *parser) parseQwenXML(text string) string {
	const open, closeTag, fn = "<tool_call>", "</tool_call>", "<function="
	var content strings.Builder
	for {
		before, tag, body, found := cutAny(text, open, fn)
		content.WriteString(before)
		if !found {
			return content.String()
		}
		if tag == fn {
			text = p.qwenFunction(body, closeTag) // a function without the <tool_call> wrapper
			continue
		}
		// One wrapper may hold several functions.
		for n := 0; ; n++ {
			body = strings.TrimLeft(body, ws)
			if n == 0 && (body == "" || strings.HasPrefix(body, closeTag)) {
				p.fail("", open+body, "empty "+open+" block")
			}
			if strings.HasPrefix(body, closeTag) {
				body = body[len(closeTag):]
				break
			}
			if body == "" {
				break // the text ended inside the wrapper
			}
			if !strings.HasPrefix(body, fn) {
				bad, rest, _ := strings.Cut(body, closeTag)
				p.fail("", bad, "want <function=NAME> inside <tool_call>")
				body = rest
				break
			}
			body = p.qwenFunction(body[len(fn):], closeTag)
		}
		text = body
	}
}

// qwenFunction reads NAME><parameter=K>V</parameter>…</function> (body is
// after "<function=") and returns the text after it.
func (p *parser) qwenFunction(body, wrapperClose string) string {
	const param, paramClose, fnClose = "<parameter=", "</parameter>", "</function>"
	skip := func(name, reason string) string {
		bad, rest, found := strings.Cut(body, fnClose)
		if !found {
			bad, rest, _ = strings.Cut(body, wrapperClose)
		}
		p.fail(name, "<function="+bad, reason)
		return rest
	}
	name, rest, ok := strings.Cut(body, ">")
	name = strings.TrimSpace(name)
	if !ok || !validToolName(name) {
		return skip("", "want <function=NAME> with a tool name")
	}
	var params []textParam
	for {
		rest = strings.TrimLeft(rest, ws)
		switch {
		case strings.HasPrefix(rest, fnClose):
			p.addText(name, params, "<function="+body[:len(body)-len(rest)])
			return rest[len(fnClose):]
		case rest == "", strings.HasPrefix(rest, wrapperClose):
			// The function was not closed; what was read is complete.
			p.addText(name, params, "<function="+body[:len(body)-len(rest)])
			return rest
		case !strings.HasPrefix(rest, param):
			return skip(name, "want <parameter=KEY> or </function>")
		}
		key, after, ok := strings.Cut(rest[len(param):], ">")
		key = strings.TrimSpace(key)
		if !ok || key == "" || strings.ContainsAny(key, "<\n") {
			return skip(name, "want <parameter=KEY> with a non-empty key")
		}
		value, tail, ok := cutClosing(after, paramClose, param, fnClose, wrapperClose)
		if !ok {
			return skip(name, "parameter "+key+" is not closed with </parameter>")
		}
		params = append(params, textParam{key: key, value: value, trimNewline: true})
		rest = tail
	}
}

func (p *parser) parseGLM45(text string) string {
	const open, closeTag = "<tool_call>", "</tool_call>"
	const key, keyClose, val, valClose = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
	var content strings.Builder
	for {
		before, _, body, found := cutAny(text, open)
		content.WriteString(before)
		if !found {
			return content.String()
		}
		text = ""
		skip := func(name, reason string) {
			bad, rest, _ := strings.Cut(body, closeTag)
			p.fail(name, bad, reason)
			text = rest
		}
		name, sep, after, _ := cutAny(body, key, closeTag)
		name = strings.TrimSpace(name)
		rest := sep + after
		if !validToolName(name) {
			skip("", "want <tool_call>NAME followed by <arg_key>…")
			continue
		}
		var params []textParam
		for {
			rest = strings.TrimLeft(rest, ws)
			if strings.HasPrefix(rest, closeTag) || rest == "" {
				p.addText(name, params, body[:len(body)-len(rest)])
				text = strings.TrimPrefix(rest, closeTag)
				break
			}
			if !strings.HasPrefix(rest, key) {
				skip(name, "want <arg_key>KEY</arg_key> or </tool_call>")
				break
			}
			k, after, ok := strings.Cut(rest[len(key):], keyClose)
			k = strings.TrimSpace(k)
			after = strings.TrimLeft(after, ws)
			if !ok || k == "" || !strings.HasPrefix(after, val) {
				skip(name, "want <arg_key>KEY</arg_key><arg_value>VALUE</arg_value>")
				break
			}
			v, tail, ok := cutClosing(after[len(val):], valClose, key, closeTag)
			if !ok {
				skip(name, "argument "+k+" is not closed with </arg_value>")
				break
			}
			params = append(params, textParam{key: k, value: v})
			rest = tail
		}
	}
}

func (p *parser) parseMiniMax(text string) string {
	const open, closeTag, invoke = "<minimax:tool_call>", "</minimax:tool_call>", "<invoke name="
	var content strings.Builder
	for {
		before, _, body, found := cutAny(text, open)
		content.WriteString(before)
		if !found {
			return content.String()
		}
		for n := 0; ; n++ {
			body = strings.TrimLeft(body, ws)
			if strings.HasPrefix(body, closeTag) || body == "" {
				if n == 0 {
					p.fail("", open+body, "empty "+open+" block")
				}
				body = strings.TrimPrefix(body, closeTag)
				break
			}
			if !strings.HasPrefix(body, invoke) {
				bad, rest, _ := strings.Cut(body, closeTag)
				p.fail("", bad, `want <invoke name="NAME"> inside <minimax:tool_call>`)
				body = rest
				break
			}
			body = p.miniMaxInvoke(body, closeTag)
		}
		text = body
	}
}

// miniMaxInvoke reads <invoke name="NAME"><parameter name="K">V
// </parameter>…</invoke> and returns the text after it.
func (p *parser) miniMaxInvoke(body, wrapperClose string) string {
	const invoke, invokeClose, param, paramClose = "<invoke name=", "</invoke>", "<parameter name=", "</parameter>"
	skip := func(name, reason string) string {
		bad, rest, found := strings.Cut(body, invokeClose)
		if !found {
			bad, rest, _ = strings.Cut(body, wrapperClose)
			rest = wrapperClose + rest
		}
		p.fail(name, bad, reason)
		return rest
	}
	name, rest, ok := quotedAttr(body[len(invoke):])
	if !ok || name == "" {
		return skip("", `want <invoke name="NAME">`)
	}
	var params []textParam
	for {
		rest = strings.TrimLeft(rest, ws)
		switch {
		case strings.HasPrefix(rest, invokeClose):
			p.addText(name, params, body[:len(body)-len(rest)])
			return rest[len(invokeClose):]
		case rest == "", strings.HasPrefix(rest, wrapperClose):
			p.addText(name, params, body[:len(body)-len(rest)])
			return rest
		case !strings.HasPrefix(rest, param):
			return skip(name, `want <parameter name="KEY"> or </invoke>`)
		}
		key, after, ok := quotedAttr(rest[len(param):])
		if !ok || key == "" {
			return skip(name, `want <parameter name="KEY"> with a non-empty key`)
		}
		value, tail, ok := cutClosing(after, paramClose, param, invokeClose, wrapperClose)
		if !ok {
			return skip(name, "parameter "+key+" is not closed with </parameter>")
		}
		params = append(params, textParam{key: key, value: value})
		rest = tail
	}
}

// validToolName: a tool name is one word without markup or JSON
// punctuation; anything else is the model writing another format.
func validToolName(name string) bool {
	return name != "" && !strings.ContainsAny(name, " \t\r\n<>{}[]\"'")
}

// quotedAttr reads "VALUE"> (the rest of a tag after name=).
func quotedAttr(s string) (value, rest string, ok bool) {
	if !strings.HasPrefix(s, `"`) {
		return "", s, false
	}
	value, rest, ok = strings.Cut(s[1:], `">`)
	if !ok || strings.ContainsAny(value, "\n<>") {
		return "", s, false
	}
	return value, rest, true
}
