package gateway

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPromptsBeyondTheContextAreRefused: with the model's context set, a
// prompt that cannot fit is refused with OpenAI's 400
// context_length_exceeded, counted against the rollout, and never reaches
// the engine: a text too long to fit whatever its tokens is refused before
// it is encoded, one that encodes to too many tokens after; a body larger
// than the context could hold is 413.
func TestPromptsBeyondTheContextAreRefused(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.MaxModelLen = 256 })
	key, rec := h.open(t, "ctx")
	chatBody := func(text string) map[string]any {
		return map[string]any{"model": "m", "messages": []map[string]any{{"role": "user", "content": text}}}
	}
	limit := h.gw.opts.MaxBodyBytes
	require.Equal(t, int64(1<<20), limit, "a small context caps bodies at the 1 MiB floor")
	for _, tc := range []struct {
		name, path string
		body       any
		status     int
		param      string
	}{
		{"chat, too many bytes to fit", "/chat/completions", chatBody(strings.Repeat("x", 256*h.gw.maxTokenBytes+1)), http.StatusBadRequest, "messages"},
		{"chat, too many tokens", "/chat/completions", chatBody(strings.Repeat("ab ", 200)), http.StatusBadRequest, "messages"},
		{"text, too many bytes to fit", "/completions", map[string]any{"model": "m", "prompt": strings.Repeat("y", 256*h.gw.maxTokenBytes+1)}, http.StatusBadRequest, "prompt"},
		{"responses, too many tokens", "/responses", map[string]any{"model": "m", "input": strings.Repeat("ab ", 200)}, http.StatusBadRequest, "input"},
		{"a body beyond what the context can hold", "/chat/completions", chatBody(strings.Repeat("z", int(limit))), http.StatusRequestEntityTooLarge, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			requests := func() int {
				h.sampler.mu.Lock()
				defer h.sampler.mu.Unlock()
				return len(h.sampler.requests)
			}
			before := requests()
			status, out := h.post(t, RolloutPath("ctx")+tc.path, key, tc.body)
			require.Equal(t, tc.status, status, "%s", out)
			if tc.status == http.StatusBadRequest {
				var e clientError
				require.NoError(t, json.Unmarshal(out, &e))
				require.NotNil(t, e.Error.Code)
				assert.Equal(t, "context_length_exceeded", *e.Error.Code)
				require.NotNil(t, e.Error.Param)
				assert.Equal(t, tc.param, *e.Error.Param)
			}
			assert.Equal(t, before, requests(), "the engine never saw it")
		})
	}
	assert.Equal(t, 5, rec.Rejected())
	status, out := h.post(t, RolloutPath("ctx")+"/chat/completions", key, chatBody("hi"))
	assert.Equal(t, http.StatusOK, status, "%s", out)
}
