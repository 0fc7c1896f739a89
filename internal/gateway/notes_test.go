package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lockedBuffer is a log sink the server's goroutines write to.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// infoFields counts, per "field", the info lines the gateway logged.
func (b *lockedBuffer) infoFields(t *testing.T) map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(b.buf.String()), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), line)
		if f, ok := rec["field"].(string); ok && rec["level"] == "info" {
			out[f]++
		}
	}
	return out
}

// TestIgnoredChatFieldsAreNotedOnce: chat fields the gateway accepts but
// does not apply (parallel_tool_calls, store, a forcing tool_choice,
// response_format) are logged at info once per run each, however many
// calls and rollouts send them; the calls are served.
func TestIgnoredChatFieldsAreNotedOnce(t *testing.T) {
	var logs lockedBuffer
	h := newHarness(t, func(o *Options) { o.Logger = zerolog.New(&logs).Level(zerolog.DebugLevel) })
	body := map[string]any{"model": "m", "messages": []map[string]any{{"role": "user", "content": "hi"}},
		"tools":               []map[string]any{{"type": "function", "function": map[string]any{"name": "f", "parameters": map[string]any{"type": "object"}}}},
		"tool_choice":         "required",
		"parallel_tool_calls": false, "store": true, "response_format": map[string]any{"type": "json_object"}}
	for _, id := range []string{"n1", "n2"} {
		key, _ := h.open(t, id)
		for range 2 {
			status, out := h.post(t, RolloutPath(id)+"/chat/completions", key, body)
			require.Equal(t, http.StatusOK, status, "%s", out)
		}
	}
	assert.Equal(t, map[string]int{"chat.parallel_tool_calls": 1, "chat.store": 1, "chat.tool_choice": 1, "chat.response_format": 1},
		logs.infoFields(t))
}
