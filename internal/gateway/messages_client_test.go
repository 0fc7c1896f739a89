package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/testclients"
)

// TestMessagesFromAnthropicClient runs the official Anthropic SDK
// (testdata/anthropic_client.js) against a rollout: plain, streamed, a
// tool round trip, the beta surface, count_tokens and a refusal.
func TestMessagesFromAnthropicClient(t *testing.T) {
	n := testclients.RequireNode(t, "@anthropic-ai/sdk")
	h := newHarness(t, nil)
	key, rec := h.open(t, "sdk-1")
	h.sampler.mu.Lock()
	h.sampler.reply = func(req engine.Request) (string, bool) {
		prompt := h.tok.Decode(req.PromptIDs, false)
		switch {
		case strings.Contains(prompt, "<tool_response>"):
			return "It is 22C in Paris.", true
		case strings.Contains(prompt, "get_weather"):
			return "I will look it up.\n" + weatherCall, true
		}
		return "Hello there.", true
	}
	h.sampler.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := h.url + strings.TrimSuffix(RolloutPath("sdk-1"), "/v1")
	cmd := exec.CommandContext(ctx, n.Bin, "testdata/anthropic_client.js", base, key)
	cmd.Env = n.Env()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "node: %s", stderr.String())

	type block struct {
		Type  string          `json:"type"`
		Text  string          `json:"text"`
		ID    string          `json:"id"`
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	}
	type message struct {
		ID           string  `json:"id"`
		Role         string  `json:"role"`
		Content      []block `json:"content"`
		StopReason   string  `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
		Usage        struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
	}
	var out struct {
		Plain, Streamed, Tool1, Tool2, Beta message
		StreamEvents                        []string `json:"streamEvents"`
		StreamedText                        string   `json:"streamedText"`
		Count                               struct {
			InputTokens int `json:"input_tokens"`
		} `json:"count"`
		Error struct {
			Status  int    `json:"status"`
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &out), stdout.String())

	calls := rec.Calls()
	require.Len(t, calls, 5, "plain, streamed, two tool turns, beta")
	for _, m := range []message{out.Plain, out.Streamed, out.Beta} {
		assert.Equal(t, "assistant", m.Role)
		assert.Equal(t, "end_turn", m.StopReason)
		assert.Nil(t, m.StopSequence)
		require.Len(t, m.Content, 1)
		assert.Equal(t, block{Type: "text", Text: "Hello there."}, m.Content[0])
	}
	assert.Equal(t, "Hello there.", out.StreamedText)
	// The SDK passes every event on but ping.
	assert.Equal(t, []string{"message_start", "content_block_start", "content_block_delta", "content_block_stop",
		"message_delta", "message_stop"}, out.StreamEvents)
	assert.Equal(t, len(calls[1].PromptIDs), out.Streamed.Usage.InputTokens)
	assert.Equal(t, len(calls[1].CompletionIDs), out.Streamed.Usage.OutputTokens)

	require.Len(t, out.Tool1.Content, 2)
	assert.Equal(t, "tool_use", out.Tool1.StopReason)
	assert.Equal(t, "I will look it up.", out.Tool1.Content[0].Text)
	assert.Equal(t, "get_weather", out.Tool1.Content[1].Name)
	assert.JSONEq(t, `{"city":"Paris"}`, string(out.Tool1.Content[1].Input))
	assert.Equal(t, "It is 22C in Paris.", out.Tool2.Content[0].Text)
	// The SDK's round trip continues the sampled ids: one segment.
	got := Assemble(calls[2:4])
	assert.Zero(t, got.PrefixBreaks)
	assert.Len(t, got.Segments, 1)
	for _, c := range calls {
		assert.Equal(t, KindMessages, c.Kind)
	}

	assert.Equal(t, len(h.render(t, []chat.Message{{Role: "user", Content: "Hello"}}, nil)), out.Count.InputTokens)
	assert.Equal(t, 400, out.Error.Status)
	assert.Equal(t, "invalid_request_error", out.Error.Type)
	assert.Contains(t, out.Error.Message, "messages[0].content[0].type")
	assert.Equal(t, 1, rec.Rejected())
}
