package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"unicode/utf8"
)

// readChunk is the size of one read from an agent's output pipe; the reader
// reuses one buffer so memory stays bounded whatever the agent prints.
const readChunk = 32 << 10

// tailBuffer keeps the last limit bytes written to it.
type tailBuffer struct {
	limit int
	buf   []byte
	total int64
}

func newTailBuffer(limit int) tailBuffer {
	return tailBuffer{limit: limit, buf: make([]byte, 0, min(limit, readChunk))}
}

func (t *tailBuffer) write(p []byte) {
	t.total += int64(len(p))
	if len(p) >= t.limit {
		t.buf = append(t.buf[:0], p[len(p)-t.limit:]...)
		return
	}
	t.buf = append(t.buf, p...)
	// Trim only once twice the limit is held, so copying is amortized.
	if len(t.buf) > 2*t.limit {
		n := copy(t.buf, t.buf[len(t.buf)-t.limit:])
		t.buf = t.buf[:n]
	}
}

// String is the kept tail. When the start was cut off, a partial UTF-8
// character at the cut is dropped.
func (t *tailBuffer) String() string {
	b := t.buf
	if len(b) > t.limit {
		b = b[len(b)-t.limit:]
	}
	if t.total > int64(len(b)) {
		for i := 0; i < utf8.UTFMax-1 && len(b) > 0 && !utf8.RuneStart(b[0]); i++ {
			b = b[1:]
		}
	}
	return string(b)
}

// lastLine remembers the last non-blank line written to it, keeping at most
// limit bytes of it and its full length, so a cut-off line is recognised.
type lastLine struct {
	limit   int
	cur     []byte
	curLen  int64
	last    []byte
	lastLen int64
}

func (l *lastLine) write(p []byte) {
	for len(p) > 0 {
		seg := p
		i := bytes.IndexByte(p, '\n')
		if i >= 0 {
			seg = p[:i]
		}
		if room := l.limit - len(l.cur); room > 0 {
			l.cur = append(l.cur, seg[:min(room, len(seg))]...)
		}
		l.curLen += int64(len(seg))
		if i < 0 {
			return
		}
		l.endLine()
		p = p[i+1:]
	}
}

func (l *lastLine) endLine() {
	if len(bytes.TrimSpace(l.cur)) > 0 || l.curLen > int64(len(l.cur)) {
		l.last = append(l.last[:0], l.cur...)
		l.lastLen = l.curLen
	}
	l.cur = l.cur[:0]
	l.curLen = 0
}

// final ends an unterminated last line and returns the last non-blank line
// (its first limit bytes) and whether it was longer than that.
func (l *lastLine) final() (line []byte, cut bool) {
	l.endLine()
	return l.last, l.lastLen > int64(len(l.last))
}

// stream collects one output stream of an agent. It is owned by its reading
// goroutine until that goroutine is done.
type stream struct {
	tail tailBuffer
	line *lastLine // nil where no report is read (stderr)
}

func newStream(limit int, wantLine bool) *stream {
	s := &stream{tail: newTailBuffer(limit)}
	if wantLine {
		s.line = &lastLine{limit: limit}
	}
	return s
}

// readFrom reads r to its end (nil) or to a read error such as a passed
// read deadline.
func (s *stream) readFrom(r io.Reader) error {
	buf := make([]byte, readChunk)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			s.tail.write(buf[:n])
			if s.line != nil {
				s.line.write(buf[:n])
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return errors.New("output still open after the agent's process group ended")
			}
			return fmt.Errorf("read agent output: %w", err)
		}
	}
}

// errBadOutput marks malformed reward reports.
var errBadOutput = errors.New("agent output is malformed")

// parseReportLine reads a command agent's reward from its last non-blank
// stdout line: a line starting with '{' must be a JSON object whose
// "reward" is a finite number or null; any other text reports no reward.
func parseReportLine(line []byte, cut bool) (*float64, error) {
	if !validUTF8(line, cut) {
		return nil, fmt.Errorf("%w: the last stdout line is not valid UTF-8", errBadOutput)
	}
	trimmed := bytes.TrimSpace(line)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, nil
	}
	if cut {
		return nil, fmt.Errorf("%w: the last stdout line starts with '{' but is longer than %d bytes", errBadOutput, len(line))
	}
	reward, err := parseReward(trimmed, true)
	if err != nil {
		return nil, fmt.Errorf("%w: the last stdout line: %w", errBadOutput, err)
	}
	return reward, nil
}

// parseReward reads {"reward": number|null, ...}; keyRequired says whether
// an object without "reward" is malformed or just reports no reward.
func parseReward(b []byte, keyRequired bool) (*float64, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	if obj == nil { // the JSON was null
		return nil, errors.New("not a JSON object")
	}
	raw, ok := obj["reward"]
	if !ok {
		if keyRequired {
			return nil, errors.New(`no "reward" field`)
		}
		return nil, nil
	}
	if string(bytes.TrimSpace(raw)) == "null" {
		return nil, nil
	}
	var reward float64
	if err := json.Unmarshal(raw, &reward); err != nil {
		return nil, fmt.Errorf(`"reward" is not a finite number: %w`, err)
	}
	if math.IsNaN(reward) || math.IsInf(reward, 0) {
		return nil, errors.New(`"reward" is not a finite number`)
	}
	return &reward, nil
}

// validUTF8 checks b; a cut line may end in a partial character, which is
// not held against it.
func validUTF8(b []byte, cut bool) bool {
	if cut {
		for i := 1; i < utf8.UTFMax && i <= len(b); i++ {
			if utf8.RuneStart(b[len(b)-i]) {
				if !utf8.FullRune(b[len(b)-i:]) {
					b = b[:len(b)-i]
				}
				break
			}
		}
	}
	return utf8.Valid(b)
}
