package envcheck

import (
	"bytes"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// maxSSELine is the longest line the Python clients read: aiohttp's line
// reader raises "Chunk too big" above 2×64 KiB (protocol §3.3 rule 4).
const maxSSELine = 128 << 10

// maxSSEProblems bounds the problems one body reports; a case names only
// the first, and a garbage body must not grow the list without end.
const maxSSEProblems = 32

// sseEvent is one dispatched event: a block with an event: line, ended by
// a blank line. Data joins the block's data lines with "\n".
type sseEvent struct {
	Name string
	Data string
	Line int // the event's first event:/data: line (1-based)
}

// parseSSEStrict reads an SSE body the way the Python ORS clients do and
// reports everything in it that those clients, or a spec-correct parser,
// would read differently or fail on (protocol §3.3): a lone \r line ending,
// a non-empty non-comment line without a colon, an event without an event:
// line (Python drops it) or without a data: line (spec parsers drop it), a
// line over 128 KiB, invalid UTF-8 (Python drops those bytes), a non-error
// data or event value that starts with whitespace after the one optional
// space (Python strips it all), and a body that does not end with a blank
// line after its last event or ends in an unterminated line. Fields other
// than event and data are ignored, as the clients ignore them. events holds
// what a Python client would dispatch, problems the findings in body order,
// each "line N: ...".
func parseSSEStrict(body []byte) (events []sseEvent, problems []string) {
	report := func(line int, format string, args ...any) {
		if len(problems) < maxSSEProblems {
			problems = append(problems, fmt.Sprintf("line %d: ", line)+fmt.Sprintf(format, args...))
		}
	}
	var (
		name      string
		hasName   bool
		data      []string
		start     int // first event:/data: line of the pending block; 0 = none
		spaceLine int // first data line whose value starts with whitespace
	)
	dispatch := func() {
		switch {
		case start == 0:
			// A blank line with nothing pending (between events, after a
			// comment or an id: line) dispatches nothing.
			return
		case !hasName:
			report(start, "event without an event: line (Python clients ignore it)")
		default:
			if data == nil {
				report(start, "event %q without a data: line (spec parsers drop it)", name)
			}
			if spaceLine != 0 && name != "error" {
				report(spaceLine, "data of event %q starts with whitespace (Python clients strip it)", name)
			}
			events = append(events, sseEvent{Name: name, Data: joinLines(data), Line: start})
		}
		name, hasName, data, start, spaceLine = "", false, nil, 0, 0
	}
	lineNo := 0
	for rest := body; len(rest) > 0; {
		lineNo++
		raw := rest
		terminated := false
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			raw, rest, terminated = rest[:i], rest[i+1:], true
		} else {
			rest = nil
		}
		line := bytes.TrimSuffix(raw, []byte{'\r'})
		if bytes.IndexByte(line, '\r') >= 0 {
			report(lineNo, `lone \r line ending (use \n or \r\n)`)
		}
		if !terminated {
			report(lineNo, "the last line has no line ending")
		}
		if len(line) > maxSSELine {
			report(lineNo, "%d bytes, over the 128 KiB a Python client reads in one line", len(line))
		}
		if !utf8.Valid(line) {
			report(lineNo, "invalid UTF-8 (Python clients drop those bytes)")
		}
		if len(line) == 0 {
			dispatch()
			continue
		}
		if line[0] == ':' {
			continue // comment (heartbeat)
		}
		colon := bytes.IndexByte(line, ':')
		if colon < 0 {
			report(lineNo, "no colon in %q", clip(line))
			continue
		}
		field := string(line[:colon])
		value := line[colon+1:]
		value = bytes.TrimPrefix(value, []byte{' '}) // the spec strips one space
		switch field {
		case "event":
			if startsWithSpace(value) {
				report(lineNo, "event name %q starts with whitespace (Python clients strip it)", clip(value))
			}
			name, hasName = string(value), true
		case "data":
			if spaceLine == 0 && startsWithSpace(value) {
				spaceLine = lineNo
			}
			data = append(data, string(value))
		default:
			continue // id, retry or unknown: ignored by the clients
		}
		if start == 0 {
			start = lineNo
		}
	}
	if start != 0 {
		report(start, "the last event is not ended by a blank line (Python clients never dispatch it)")
	}
	return events, problems
}

// joinLines joins data lines as SSE does; nil (no data line) is "".
func joinLines(lines []string) string {
	var b bytes.Buffer
	for i, l := range lines {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(l)
	}
	return b.String()
}

// startsWithSpace: b begins with a rune Python's str.isspace accepts, which
// the clients' lstrip() removes (Go's unicode.IsSpace plus U+001C..U+001F).
func startsWithSpace(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	r, _ := utf8.DecodeRune(b)
	return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f)
}

// clip shortens a line for a problem text.
func clip(b []byte) string {
	const n = 40
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// sseNames summarises events for an observed text: "task_id, chunk×2, end".
func sseNames(events []sseEvent) string {
	var b bytes.Buffer
	for i := 0; i < len(events); {
		j := i
		for j < len(events) && events[j].Name == events[i].Name {
			j++
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(events[i].Name)
		if j-i > 1 {
			fmt.Fprintf(&b, "×%d", j-i)
		}
		i = j
	}
	if b.Len() == 0 {
		return "no events"
	}
	return b.String()
}
