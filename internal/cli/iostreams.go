package cli

import (
	"bytes"
	"io"
	"os"
	"sync"

	"github.com/mattn/go-isatty"
)

// IOStreams decides where output goes: Out carries only what the user asked
// for (tables, JSON, URLs); ErrOut carries logs, warnings and progress bars.
type IOStreams struct {
	In     io.Reader
	Out    io.Writer
	ErrOut io.Writer

	outTTY bool
	errTTY bool

	statusOnce sync.Once
	status     *statusLine
}

// SystemIO returns the process's standard streams with TTY detection.
func SystemIO() *IOStreams {
	return &IOStreams{
		In:     os.Stdin,
		Out:    os.Stdout,
		ErrOut: os.Stderr,
		outTTY: isTerminal(os.Stdout),
		errTTY: isTerminal(os.Stderr),
	}
}

func isTerminal(f *os.File) bool {
	return isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd())
}

// TestIO returns streams backed by buffers, for tests.
func TestIO() (*IOStreams, *bytes.Buffer, *bytes.Buffer) {
	out, errOut := &bytes.Buffer{}, &bytes.Buffer{}
	return &IOStreams{In: &bytes.Buffer{}, Out: out, ErrOut: errOut}, out, errOut
}

// IsStdoutTTY reports whether Out is a terminal (tables vs TSV).
func (s *IOStreams) IsStdoutTTY() bool { return s.outTTY }

// IsStderrTTY reports whether ErrOut is a terminal (progress bars and
// console logs vs plain lines).
func (s *IOStreams) IsStderrTTY() bool { return s.errTTY }

// SetTTY forces TTY behaviour, for tests.
func (s *IOStreams) SetTTY(out, errOut bool) { s.outTTY, s.errTTY = out, errOut }

// statusLine is ErrOut as logs and progress bars share it: log lines
// written through it never land on the bar's line.
func (s *IOStreams) statusLine() *statusLine {
	s.statusOnce.Do(func() { s.status = newStatusLine(s.ErrOut) })
	return s.status
}
