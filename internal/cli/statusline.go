package cli

import (
	"io"
	"sync"

	"github.com/schollz/progressbar/v3"
)

// statusLine owns the last line of a terminal: a progress bar that log
// lines must not print onto. Every write to the terminal while a bar is
// shown goes through it: the bar line is cleared, the log line written,
// and the bar drawn again below it. One mutex orders bar updates and log
// lines, so neither can interleave with the other.
type statusLine struct {
	mu  sync.Mutex
	out io.Writer
	bar *progressbar.ProgressBar
}

func newStatusLine(out io.Writer) *statusLine { return &statusLine{out: out} }

// Write writes one log line (zerolog writes a whole event per call) above
// the bar.
func (s *statusLine) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bar == nil {
		return s.out.Write(p)
	}
	_ = s.bar.Clear()
	n, err := s.out.Write(p)
	_ = s.bar.RenderBlank()
	return n, err
}

// showBar starts a bar of max units, described by desc, drawn on out.
func (s *statusLine) showBar(max int, desc string, extra ...progressbar.Option) {
	opts := append([]progressbar.Option{
		progressbar.OptionSetWriter(s.out),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
	}, extra...)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bar = progressbar.NewOptions(max, opts...)
	_ = s.bar.RenderBlank()
}

// update changes the bar (Set, Add, Describe) under the lock; it does
// nothing when no bar is shown. A bar that reaches its end stays on screen
// as its last line (100/100 and the elapsed time); later writes go below it.
func (s *statusLine) update(f func(*progressbar.ProgressBar)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bar != nil {
		f(s.bar)
		if s.bar.IsFinished() {
			_, _ = io.WriteString(s.out, "\n")
			s.bar = nil
		}
	}
}

// hideBar erases an unfinished bar; later writes go straight to out.
func (s *statusLine) hideBar() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bar != nil {
		_ = s.bar.Clear()
		s.bar = nil
	}
}
