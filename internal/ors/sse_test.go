package ors

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func readAll(t *testing.T, s string) []Event {
	t.Helper()
	r := NewSSEReader(strings.NewReader(s))
	var out []Event
	for {
		ev, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		out = append(out, ev)
	}
}

func TestSSEReader(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []Event
	}{
		{"crlf", "event: a\r\ndata: 1\r\n\r\n", []Event{{Name: "a", Data: "1"}}},
		{"lf", "event: a\ndata: 1\n\n", []Event{{Name: "a", Data: "1"}}},
		{"cr", "event: a\rdata: 1\r\r", []Event{{Name: "a", Data: "1"}}},
		{"mixed ends", "event: a\r\ndata: 1\n\revent: b\rdata: 2\r\n\r\n", []Event{{Name: "a", Data: "1"}, {Name: "b", Data: "2"}}},
		{"one space stripped only", "event: a\ndata:   x\n\n", []Event{{Name: "a", Data: "  x"}}},
		{"no space", "event:a\ndata:x\n\n", []Event{{Name: "a", Data: "x"}}},
		{"multi data lines", "event: e\ndata: l1\ndata: l2\n\n", []Event{{Name: "e", Data: "l1\nl2"}}},
		{"empty data", "event: end\ndata: \n\n", []Event{{Name: "end"}}},
		{"comments ignored", ": ping - now\n\n:x\nevent: a\ndata: 1\n\n", []Event{{Name: "a", Data: "1"}}},
		{"bare field name", "event: a\ndata\n\n", []Event{{Name: "a"}}},
		{"data only event", "data: d\n\n", []Event{{Data: "d"}}},
		{"id and unknown fields", "id: 7\nretry: 5\nfoo: bar\nevent: a\ndata: 1\n\n", []Event{{Name: "a", Data: "1", ID: "7"}}},
		{"unterminated last event dropped", "event: a\ndata: 1\n\nevent: b\ndata: 2", []Event{{Name: "a", Data: "1"}}},
		{"colon in value", "event: a\ndata: {\"k\":\"v\"}\n\n", []Event{{Name: "a", Data: `{"k":"v"}`}}},
		{"long line", "event: a\ndata: " + strings.Repeat("x", 300000) + "\n\n", []Event{{Name: "a", Data: strings.Repeat("x", 300000)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, readAll(t, tt.in))
		})
	}
}

// encodeEvents writes events with the given line end, plus comments.
func encodeEvents(evs []Event, eol string) string {
	var b strings.Builder
	for _, ev := range evs {
		b.WriteString(": hb" + eol)
		b.WriteString("event: " + ev.Name + eol)
		for _, line := range strings.Split(ev.Data, "\n") {
			b.WriteString("data: " + line + eol)
		}
		b.WriteString(eol)
	}
	return b.String()
}

func FuzzSSEReader(f *testing.F) {
	f.Add("event: a\r\ndata: 1\r\n\r\n", "chunk", "x y", uint8(0))
	f.Add("\r\r\n\n::", "end", "", uint8(1))
	f.Add("data", "task_id", "\x00\xff", uint8(2))
	f.Fuzz(func(t *testing.T, raw, name, data string, eolSel uint8) {
		// Arbitrary input never panics and terminates.
		r := NewSSEReader(strings.NewReader(raw))
		for i := 0; i <= len(raw)+1; i++ {
			if _, err := r.Next(); err != nil {
				break
			}
		}
		// Well-formed events round-trip for every line-ending style.
		if name == "" || strings.ContainsAny(name, "\r\n") || strings.ContainsAny(data, "\r") {
			return
		}
		evs := []Event{{Name: name, Data: data}, {Name: "end", Data: data}}
		eol := []string{"\r\n", "\n", "\r"}[eolSel%3]
		got := readAll(t, encodeEvents(evs, eol))
		want := make([]Event, len(evs))
		for i, ev := range evs {
			want[i] = Event{Name: ev.Name, Data: ev.Data} // exactly one space is stripped
		}
		require.Equal(t, want, got)
	})
}
