package ors

import (
	"bufio"
	"bytes"
	"io"
	"strings"
)

// Event is one dispatched server-sent event.
type Event struct {
	Name string // the event: field ("" when the event had none)
	Data string // data: lines joined with "\n"
	ID   string
}

// SSEReader parses a text/event-stream per the WHATWG rules: CRLF, CR or LF
// line ends, comments ignored, exactly one space after the colon stripped,
// unbounded line length. Events without data are still dispatched when they
// carry an event name (ORS sends `data: ` empty on create_session's end).
type SSEReader struct {
	r       *bufio.Reader
	pendCR  bool // the previous line ended in CR: skip a following LF
	name    string
	data    strings.Builder
	hasData bool
	id      string
}

// NewSSEReader reads events from r.
func NewSSEReader(r io.Reader) *SSEReader {
	return &SSEReader{r: bufio.NewReaderSize(r, 16<<10)}
}

// Next returns the next event, or io.EOF when the stream ends (a trailing
// event without its blank line is discarded, as the spec requires).
func (p *SSEReader) Next() (Event, error) {
	for {
		line, err := p.readLine()
		if err != nil {
			return Event{}, err
		}
		if len(line) == 0 {
			if p.name == "" && !p.hasData {
				continue
			}
			ev := Event{Name: p.name, Data: p.data.String(), ID: p.id}
			p.name, p.hasData = "", false
			p.data.Reset()
			return ev, nil
		}
		if line[0] == ':' {
			continue
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		switch string(field) {
		case "event":
			p.name = string(value)
		case "data":
			if p.hasData {
				p.data.WriteByte('\n')
			}
			p.data.Write(value)
			p.hasData = true
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				p.id = string(value)
			}
		}
	}
}

// readLine returns one line without its terminator. The returned slice is
// valid until the next call.
func (p *SSEReader) readLine() ([]byte, error) {
	var line []byte
	for {
		b, err := p.r.ReadByte()
		if err != nil {
			if err == io.EOF && len(line) > 0 {
				// A final line without terminator cannot complete an event.
				return nil, io.EOF
			}
			return nil, err
		}
		if p.pendCR {
			p.pendCR = false
			if b == '\n' {
				continue
			}
		}
		switch b {
		case '\n':
			return line, nil
		case '\r':
			p.pendCR = true
			return line, nil
		}
		line = append(line, b)
		// Read the rest of the line in bulk when possible.
		if p.r.Buffered() > 0 {
			buf, _ := p.r.Peek(p.r.Buffered())
			if i := bytes.IndexAny(buf, "\r\n"); i > 0 {
				line = append(line, buf[:i]...)
				_, _ = p.r.Discard(i)
			} else if i < 0 {
				line = append(line, buf...)
				_, _ = p.r.Discard(len(buf))
			}
		}
	}
}
