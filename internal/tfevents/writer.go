package tfevents

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"
)

// Writer appends scalar events to one TensorBoard event file. Safe for
// concurrent use.
type Writer struct {
	mu     sync.Mutex
	f      *os.File
	w      *bufio.Writer
	buf    []byte
	closed bool
}

// ErrClosed is returned by writes after Close.
var ErrClosed = errors.New("tfevents writer closed")

// FileName returns TensorFlow's event file name for a writer started at t:
// events.out.tfevents.<unix seconds>.<host>, plus the pid so two writers
// started in the same second on one host do not collide.
func FileName(t time.Time, host string, pid int) string {
	return fmt.Sprintf("events.out.tfevents.%d.%s.%d", t.Unix(), host, pid)
}

// Create makes dir if needed, creates a new event file in it and writes the
// file_version event TensorBoard expects first.
func Create(dir string) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create event dir: %w", err)
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	now := time.Now()
	path := filepath.Join(dir, FileName(now, host, os.Getpid()))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create event file: %w", err)
	}
	w := &Writer{f: f, w: bufio.NewWriter(f)}
	if err := w.write(Event{WallTime: unixSeconds(now), FileVersion: FileVersion}); err != nil {
		f.Close()
		return nil, err
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return nil, err
	}
	return w, nil
}

// Path is the event file's path.
func (w *Writer) Path() string { return w.f.Name() }

// AddScalars writes one event holding every value of scalars under its key
// as tag, in sorted tag order. TensorBoard stores simple_value as float32.
// Call Flush to make the event visible to readers.
func (w *Writer) AddScalars(step int, wall time.Time, scalars map[string]float64) error {
	tags := make([]string, 0, len(scalars))
	for tag := range scalars {
		tags = append(tags, tag)
	}
	sort.Strings(tags)
	e := Event{WallTime: unixSeconds(wall), Step: int64(step), Scalars: make([]Scalar, len(tags))}
	for i, tag := range tags {
		e.Scalars[i] = Scalar{Tag: tag, Value: float32(scalars[tag])}
	}
	return w.write(e)
}

func (w *Writer) write(e Event) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	w.buf = appendRecord(w.buf[:0], e.marshal())
	if _, err := w.w.Write(w.buf); err != nil {
		return fmt.Errorf("write event for step %d: %w", e.Step, err)
	}
	return nil
}

// Flush hands buffered events to the operating system so a running
// TensorBoard sees them.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	if err := w.w.Flush(); err != nil {
		return fmt.Errorf("flush %s: %w", filepath.Base(w.f.Name()), err)
	}
	return nil
}

// Close flushes and closes the file. Closing twice is a no-op.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	if err := w.w.Flush(); err != nil {
		w.f.Close()
		return fmt.Errorf("flush %s: %w", filepath.Base(w.f.Name()), err)
	}
	if err := w.f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", filepath.Base(w.f.Name()), err)
	}
	return nil
}

func unixSeconds(t time.Time) float64 {
	return float64(t.UnixNano()) / 1e9
}

// ReadEvents reads every event from r, verifying framing and checksums.
func ReadEvents(r io.Reader) ([]Event, error) {
	rr := NewRecordReader(r)
	var out []Event
	for {
		data, err := rr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		e, err := UnmarshalEvent(data)
		if err != nil {
			return out, fmt.Errorf("event %d: %w", len(out), err)
		}
		out = append(out, e)
	}
}

// ReadFile reads every event of the event file at path.
func ReadFile(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open event file: %w", err)
	}
	defer f.Close()
	events, err := ReadEvents(bufio.NewReader(f))
	if err != nil {
		return events, fmt.Errorf("read %s: %w", filepath.Base(path), err)
	}
	return events, nil
}
