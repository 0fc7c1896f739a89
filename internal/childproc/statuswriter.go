package childproc

import (
	"bytes"
	"io"
	"strings"
	"sync"
	"time"
)

// errorMarkers pick the child's lines worth repeating when it dies.
var errorMarkers = []string{
	"Traceback", "Error", "error:", "CUDA error", "out of memory", "OutOfMemoryError",
	"ValueError:", "RuntimeError:", "panic:", "fatal", "Killed",
	`"level":"error"`, // serve-engine's JSON logs
}

const tailLimit = 8 << 10

// StatusWriter passes a child's output to its log file, remembers when it
// last wrote (readiness waits on a stall deadline, not a fixed one) and
// keeps a bounded tail of error-like lines for the crash report.
type StatusWriter struct {
	mu       sync.Mutex
	out      io.Writer
	partial  []byte
	tail     []string
	tailSize int
	last     time.Time
	now      func() time.Time
}

// NewStatusWriter writes through to out (a log file; nil discards).
func NewStatusWriter(out io.Writer, now func() time.Time) *StatusWriter {
	if out == nil {
		out = io.Discard
	}
	if now == nil {
		now = time.Now
	}
	return &StatusWriter{out: out, now: now, last: now()}
}

func (w *StatusWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.last = w.now()
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.line(string(w.partial[:i]))
		w.partial = w.partial[i+1:]
	}
	if len(w.partial) > tailLimit {
		w.line(string(w.partial))
		w.partial = w.partial[:0]
	}
	_, err := w.out.Write(p)
	return len(p), err
}

func (w *StatusWriter) line(s string) {
	for _, m := range errorMarkers {
		if strings.Contains(s, m) {
			w.tail = append(w.tail, s)
			w.tailSize += len(s)
			for w.tailSize > tailLimit && len(w.tail) > 1 {
				w.tailSize -= len(w.tail[0])
				w.tail = w.tail[1:]
			}
			return
		}
	}
}

// LastOutput is when the child last wrote anything.
func (w *StatusWriter) LastOutput() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// Tail returns the remembered error lines, oldest first.
func (w *StatusWriter) Tail() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.tail, "\n")
}
