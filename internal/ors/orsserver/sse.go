package orsserver

import (
	"net/http"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// MaxChunkBytes bounds one SSE data line of a /call result. The Python
// clients' line reader fails above 128 KiB; the reference cuts at 4096.
const MaxChunkBytes = 4096

// IsPySpace reports whether r is whitespace by Python's str.isspace, which
// the Python SSE parser strips from the start of every data value. It adds
// the information separators U+001C..U+001F to Go's unicode.IsSpace.
func IsPySpace(r rune) bool {
	return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f)
}

// Chunks cuts s into consecutive pieces whose concatenation is s, each at
// most max bytes, cut only between runes, and none after the first starting
// with whitespace (IsPySpace) — so the Python client's lstrip of each data
// value cannot drop payload bytes. The one exception: when a piece's first
// rune is followed by more than max bytes of whitespace there is no legal cut,
// so that piece runs to the end of the whitespace (encodeResult escapes such
// runs in JSON payloads first, so /call never hits it).
func Chunks(s string, max int) []string {
	if max < utf8.UTFMax {
		max = utf8.UTFMax
	}
	var out []string
	for len(s) > max {
		cut := cutPoint(s, max)
		out = append(out, s[:cut])
		s = s[cut:]
	}
	if len(s) > 0 || len(out) == 0 {
		out = append(out, s)
	}
	return out
}

// cutPoint returns the largest index in (0, max] that starts a rune which is
// not whitespace, or the end of the whitespace run after the first rune.
func cutPoint(s string, max int) int {
	_, first := utf8.DecodeRuneInString(s)
	for i := max; i >= first; i-- {
		if i < len(s) && !utf8.RuneStart(s[i]) {
			continue
		}
		r, _ := utf8.DecodeRuneInString(s[i:])
		if !IsPySpace(r) {
			return i
		}
	}
	i := first
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !IsPySpace(r) {
			break
		}
		i += n
	}
	return i
}

// escapeLongWhitespaceRuns rewrites whitespace runes in runs longer than
// limit bytes as \uXXXX escapes. In compact JSON every whitespace rune sits
// inside a string, so the result parses to the same value, and Chunks can
// always find a cut that does not start with whitespace.
func escapeLongWhitespaceRuns(payload string, limit int) string {
	var b strings.Builder
	last := 0
	for i := 0; i < len(payload); {
		r, n := utf8.DecodeRuneInString(payload[i:])
		if !IsPySpace(r) {
			i += n
			continue
		}
		j := i
		for j < len(payload) {
			r2, n2 := utf8.DecodeRuneInString(payload[j:])
			if !IsPySpace(r2) {
				break
			}
			j += n2
		}
		if j-i > limit {
			if b.Len() == 0 {
				b.Grow(len(payload) + 6*(j-i))
			}
			b.WriteString(payload[last:i])
			for _, ws := range payload[i:j] {
				b.WriteString(`\u`)
				const hex = "0123456789abcdef"
				b.WriteByte(hex[ws>>12&0xf])
				b.WriteByte(hex[ws>>8&0xf])
				b.WriteByte(hex[ws>>4&0xf])
				b.WriteByte(hex[ws&0xf])
			}
			last = j
		}
		i = j
	}
	if last == 0 {
		return payload
	}
	b.WriteString(payload[last:])
	return b.String()
}

// sseStream writes events in the framing the Python parser accepts: CRLF
// line ends, an event: line on every event, one data: line per payload line,
// comments for heartbeats.
type sseStream struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func startSSE(w http.ResponseWriter) *sseStream {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	return &sseStream{w: w, rc: http.NewResponseController(w)}
}

// event writes one event and flushes it.
func (s *sseStream) event(name, data string) error {
	var b strings.Builder
	b.Grow(len(name) + len(data) + 24)
	b.WriteString("event: ")
	b.WriteString(name)
	b.WriteString("\r\n")
	for _, line := range splitLines(data) {
		b.WriteString("data: ")
		b.WriteString(line)
		b.WriteString("\r\n")
	}
	b.WriteString("\r\n")
	if _, err := s.w.Write([]byte(b.String())); err != nil {
		return err
	}
	return s.rc.Flush()
}

// comment writes a heartbeat comment line.
func (s *sseStream) comment(now time.Time) error {
	if _, err := s.w.Write([]byte(": ping - " + now.UTC().Format("2006-01-02 15:04:05.000000+00:00") + "\r\n\r\n")); err != nil {
		return err
	}
	return s.rc.Flush()
}

// splitLines splits on CRLF, CR or LF, as sse-starlette does.
func splitLines(s string) []string {
	if !strings.ContainsAny(s, "\r\n") {
		return []string{s}
	}
	s = strings.ReplaceAll(s, "\r\n", "\n")
	s = strings.ReplaceAll(s, "\r", "\n")
	return strings.Split(s, "\n")
}
