package envcheck

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSSEStrictFraming(t *testing.T) {
	long := "data: " + strings.Repeat("x", maxSSELine) + "\n"
	tests := []struct {
		name    string
		body    string
		events  []sseEvent // nil: not compared
		problem string     // "" = no problems; else the first problem contains it
	}{
		{name: "reference CRLF with heartbeat",
			body:   ": ping - 2026-01-01\r\n\r\nevent: task_id\r\ndata: abc\r\n\r\nevent: end\r\ndata: \r\n\r\n",
			events: []sseEvent{{Name: "task_id", Data: "abc", Line: 3}, {Name: "end", Data: "", Line: 6}}},
		{name: "LF endings, no space after colon",
			body:   "event:chunk\ndata:{\"ok\"\n\nevent:end\ndata::true}\n\n",
			events: []sseEvent{{Name: "chunk", Data: `{"ok"`, Line: 1}, {Name: "end", Data: ":true}", Line: 4}}},
		{name: "multi-line data joined with newline",
			body:   "event: error\ndata: one\ndata: two\n\n",
			events: []sseEvent{{Name: "error", Data: "one\ntwo", Line: 1}}},
		{name: "data before event line",
			body:   "data: x\nevent: end\n\n",
			events: []sseEvent{{Name: "end", Data: "x", Line: 1}}},
		{name: "id and retry fields ignored",
			body:   "id: 7\nretry: 100\n\nevent: end\nid: 8\ndata: x\n\n",
			events: []sseEvent{{Name: "end", Data: "x", Line: 4}}},
		{name: "error data may start with whitespace",
			body:   "event: error\ndata: Traceback\ndata:   File x\n\n",
			events: []sseEvent{{Name: "error", Data: "Traceback\n  File x", Line: 1}}},
		{name: "empty body", body: "", events: nil},
		{name: "only blank lines", body: "\n\r\n\n", events: nil},

		{name: "lone CR endings", body: "event: task_id\rdata: abc\r\r", problem: `line 1: lone \r`},
		{name: "lone CR inside a CRLF body", body: "event: end\r\ndata: x\r\r\n\r\n", problem: `line 2: lone \r`},
		{name: "line without colon", body: "event: end\ndata\n\n", problem: `line 2: no colon in "data"`},
		{name: "data-only event", body: "data: abc\n\n", problem: "line 1: event without an event: line"},
		{name: "event without data line", body: "event: end\n\n", problem: `line 1: event "end" without a data: line`},
		{name: "no blank line after the last event", body: "event: task_id\ndata: a\n\nevent: end\ndata: \n", problem: "line 4: the last event is not ended"},
		{name: "unterminated last line", body: "event: end\ndata: x\n\n: bye", problem: "line 4: the last line has no line ending"},
		{name: "line over 128 KiB", body: "event: end\n" + long + "\n", problem: "line 2: 131078 bytes, over the 128 KiB"},
		{name: "invalid UTF-8", body: "event: end\ndata: \xff\n\n", problem: "line 2: invalid UTF-8"},
		{name: "chunk starting with whitespace", body: "event: chunk\ndata:  x\n\nevent: end\ndata: y\n\n", problem: `line 2: data of event "chunk" starts with whitespace`},
		{name: "chunk starting with NBSP", body: "event: chunk\ndata: \u00a0x\n\n", problem: "starts with whitespace"},
		{name: "event name starting with whitespace", body: "event:  end\ndata: x\n\n", problem: "line 1: event name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			events, problems := parseSSEStrict([]byte(tt.body))
			if tt.problem == "" {
				require.Empty(t, problems)
				assert.Equal(t, tt.events, events)
				return
			}
			require.NotEmpty(t, problems)
			assert.Contains(t, problems[0], tt.problem)
		})
	}
}

func TestSSEStrictKeepsEventsDespiteProblems(t *testing.T) {
	// A case names the first problem, but the sid is still read from a
	// failing create_session so cleanup can release it.
	events, problems := parseSSEStrict([]byte("event: task_id\ndata: sid-1\n\nbogus\nevent: end\ndata: \n\n"))
	require.Len(t, problems, 1)
	assert.Contains(t, problems[0], "line 4")
	require.Len(t, events, 2)
	assert.Equal(t, "sid-1", events[0].Data)
}

func TestSSEStrictCapsProblems(t *testing.T) {
	_, problems := parseSSEStrict([]byte(strings.Repeat("nocolon\n", 1000)))
	assert.Len(t, problems, maxSSEProblems)
}

func TestSSENames(t *testing.T) {
	assert.Equal(t, "no events", sseNames(nil))
	assert.Equal(t, "task_id, chunk×2, end", sseNames([]sseEvent{{Name: "task_id"}, {Name: "chunk"}, {Name: "chunk"}, {Name: "end"}}))
}

// FuzzSSE: the parser never panics, and what it reports stays consistent
// with its input.
func FuzzSSE(f *testing.F) {
	for _, seed := range []string{
		"",
		"event: task_id\r\ndata: abc\r\n\r\nevent: end\r\ndata: \r\n\r\n",
		": ping\n\nevent: chunk\ndata: {\"a\"\n\nevent: end\ndata: :1}\n\n",
		"event: task_id\rdata: x\r\r",
		"data\n\n",
		"data: only\n\n",
		"event: end\n",
		"event: end\ndata: \xff\xfe\n\n",
		"event:\ndata:\n\n\n\n",
		"::::\n:\n\r\n\r\r\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		events, problems := parseSSEStrict(body)
		require.LessOrEqual(t, len(problems), maxSSEProblems)
		lines := strings.Count(string(body), "\n") + 1
		for _, p := range problems {
			require.True(t, strings.HasPrefix(p, "line "), p)
		}
		for _, e := range events {
			require.GreaterOrEqual(t, e.Line, 1)
			require.LessOrEqual(t, e.Line, lines)
			require.LessOrEqual(t, len(e.Data), len(body))
		}
		if len(problems) == 0 {
			// A clean body is valid UTF-8 and ends with a newline.
			require.True(t, utf8.Valid(body))
			if len(body) > 0 {
				require.Equal(t, byte('\n'), body[len(body)-1])
			}
		}
	})
}
