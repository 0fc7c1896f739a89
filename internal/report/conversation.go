package report

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// compactArgsRunes is the longest tool-call arguments shown on one line;
// longer ones are indented, one field a line.
const compactArgsRunes = 80

// message is one entry of a rollout's conversation as the page shows it.
type message struct {
	Class string // CSS class: assistant, or tool for what the env answered
	Label string // the role line: "assistant · turn 2", "tool result"
	Tool  string // the tool that answered, shown as named (not upper-cased)
	Text  string
	Calls []shownCall
	// Reward is a tool result's own reward; nil when the env gave none.
	Reward      *float64
	Finished    bool
	Error       string
	FormatError bool
}

// shownCall is a tool call with its arguments formatted for reading.
type shownCall struct {
	Name string
	Args string
}

// conversation lays out t's turns in the order they happened, numbering
// the assistant's turns; every turn that is not the assistant's is what
// the env answered (a tool's result, or the observation of a text action).
func conversation(t *trajectory) []message {
	out := make([]message, 0, len(t.Turns))
	n := 0
	for _, tu := range t.Turns {
		m := message{Text: tu.Text, Reward: tu.Reward, Finished: tu.Finished, Error: tu.Error, FormatError: tu.FormatError}
		switch tu.Role {
		case "assistant":
			n++
			m.Class, m.Label = "assistant", fmt.Sprintf("assistant · turn %d", n)
			for _, c := range tu.ToolCalls {
				m.Calls = append(m.Calls, shownCall{Name: c.Name, Args: formatArgs(c.Arguments)})
			}
		case "tool":
			m.Class, m.Label, m.Tool = "tool", "tool result", tu.Tool
		case "user":
			m.Class, m.Label = "tool", "env observation"
		default:
			m.Class, m.Label = "tool", tu.Role
		}
		out = append(out, m)
	}
	return out
}

// formatArgs writes tool-call arguments for reading: on one line when they
// are short, indented otherwise; keys keep the model's order, and <, >
// and & are shown as written, not as the \u003c escapes the trainer's JSON
// encoder puts in (the page escapes them for HTML). Anything that is not
// valid JSON is shown as it is; absent arguments as "".
func formatArgs(raw json.RawMessage) string {
	s := strings.TrimSpace(string(raw))
	if s == "" || s == "null" {
		return ""
	}
	var buf bytes.Buffer
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	if err := writeValue(dec, &buf); err != nil {
		return s
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return s // trailing data after the value
	}
	if utf8.RuneCount(buf.Bytes()) <= compactArgsRunes {
		return buf.String()
	}
	var ind bytes.Buffer
	if err := json.Indent(&ind, buf.Bytes(), "", "  "); err != nil {
		return buf.String()
	}
	return ind.String()
}

// writeValue copies one JSON value from dec to buf, compact with a space
// after each ':' and ','.
func writeValue(dec *json.Decoder, buf *bytes.Buffer) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch v := tok.(type) {
	case json.Delim:
		closing := byte('}')
		if v == '[' {
			closing = ']'
		}
		buf.WriteByte(byte(v))
		for i := 0; dec.More(); i++ {
			if i > 0 {
				buf.WriteString(", ")
			}
			if closing == '}' {
				key, err := dec.Token()
				if err != nil {
					return err
				}
				writeString(buf, key.(string))
				buf.WriteString(": ")
			}
			if err := writeValue(dec, buf); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil {
			return err
		}
		buf.WriteByte(closing)
	case string:
		writeString(buf, v)
	case json.Number:
		buf.WriteString(v.String())
	case bool:
		fmt.Fprint(buf, v)
	case nil:
		buf.WriteString("null")
	}
	return nil
}

func writeString(buf *bytes.Buffer, s string) {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	buf.Truncate(buf.Len() - 1)
}
