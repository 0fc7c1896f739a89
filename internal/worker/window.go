package worker

import (
	"fmt"

	"github.com/ortrain/ortrain/internal/grpo"
)

// WindowError is a sequence longer than the model's sliding attention
// window (model.Config.SlidingWindow). The worker attends to the whole
// sequence, which is what transformers and vLLM compute only while a
// sequence fits the window; past it their attention differs, so the worker
// refuses rather than train or sample something else.
type WindowError struct {
	What   string // "row 3", "request 0"
	Len    int    // tokens the sequence has or may reach
	Window int
}

func (e *WindowError) Error() string {
	return fmt.Sprintf("%s has %d tokens, more than the model's sliding attention window of %d (config.json sliding_window): "+
		"ortrain attends to whole sequences, which differs from windowed attention past the window; "+
		"keep prompts + max_completion_length within %d tokens, or use a model without a sliding window", e.What, e.Len, e.Window, e.Window)
}

// checkRowsWindow refuses training rows longer than the sliding window.
func (m *Model) checkRowsWindow(rows []grpo.Row) error {
	w := m.cfg.SlidingWindow()
	if w == 0 {
		return nil
	}
	for i, r := range rows {
		if len(r.Tokens) > w {
			return &WindowError{What: fmt.Sprintf("row %d", i), Len: len(r.Tokens), Window: w}
		}
	}
	return nil
}

// checkRequestsWindow refuses sampling requests that could grow past the
// sliding window (prompt + MaxNewTokens).
func (m *Model) checkRequestsWindow(reqs []SampleRequest) error {
	w := m.cfg.SlidingWindow()
	if w == 0 {
		return nil
	}
	for i, r := range reqs {
		if n := len(r.PromptIDs) + r.MaxNewTokens; n > w {
			return &WindowError{What: fmt.Sprintf("request %d (prompt + max new tokens)", i), Len: n, Window: w}
		}
	}
	return nil
}
