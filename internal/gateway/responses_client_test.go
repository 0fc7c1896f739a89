package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/engine"
)

// TestResponsesFromOpenAIClient runs the real `openai` Python package
// (testdata/openai_responses_client.py) against a rollout: plain,
// streamed (raw events and the stream() helper's accumulator), a
// function-call round trip sending the output items back, a continuation
// by previous_response_id, and two refusals. Skipped where the package is
// missing, unless ORTRAIN_REQUIRE_OPENAI is set.
func TestResponsesFromOpenAIClient(t *testing.T) {
	python := requireOpenAIPython(t)
	h := newHarness(t, nil)
	key, rec := h.open(t, "sdk-1")
	h.sampler.mu.Lock()
	h.sampler.reply = func(req engine.Request) (string, bool) {
		prompt := h.tok.Decode(req.PromptIDs, false)
		switch {
		case strings.Contains(prompt, "And tomorrow?"):
			return "Sunny again.", true
		case strings.Contains(prompt, "<tool_response>"):
			return "It is 22C in Paris.", true
		case strings.Contains(prompt, "get_weather"):
			return "I will look it up.\n" + weatherCall, true
		}
		return "Hello there.", true
	}
	h.sampler.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "testdata/openai_responses_client.py", h.url+RolloutPath("sdk-1"), key)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "python: %s", stderr.String())

	type item struct {
		Type      string `json:"type"`
		Text      string `json:"text"`
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
		CallID    string `json:"call_id"`
	}
	type response struct {
		ID                 string  `json:"id"`
		Status             string  `json:"status"`
		Text               string  `json:"text"`
		Output             []item  `json:"output"`
		InputTokens        int     `json:"input_tokens"`
		OutputTokens       int     `json:"output_tokens"`
		PreviousResponseID *string `json:"previous_response_id"`
	}
	type refusal struct {
		Status int    `json:"status"`
		Param  string `json:"param"`
		Code   string `json:"code"`
		Type   string `json:"type"`
	}
	var out struct {
		Plain, Streamed, Helper, Tool1, Tool2, Tool3 response
		StreamEvents                                 []string `json:"stream_events"`
		StreamText                                   string   `json:"stream_text"`
		HelperEvents                                 []string `json:"helper_events"`
		ImageRefused                                 refusal  `json:"image_refused"`
		NotStored                                    refusal  `json:"not_stored"`
	}
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &out), stdout.String())

	calls := rec.Calls()
	require.Len(t, calls, 6, "plain, streamed, stream helper, three tool turns")
	for _, c := range calls {
		assert.Equal(t, KindResponses, c.Kind)
	}
	for _, r := range []response{out.Plain, out.Streamed, out.Helper} {
		assert.Equal(t, "completed", r.Status)
		assert.Equal(t, "Hello there.", r.Text)
		assert.Equal(t, []item{{Type: "message", Text: "Hello there."}}, r.Output)
	}
	assert.Equal(t, len(calls[0].PromptIDs), out.Plain.InputTokens)
	assert.Equal(t, len(calls[0].CompletionIDs), out.Plain.OutputTokens)
	assert.Equal(t, "Hello there.", out.StreamText)
	wantEvents := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.completed"}
	assert.Equal(t, wantEvents, out.StreamEvents)
	assert.Equal(t, wantEvents, out.HelperEvents)

	require.Len(t, out.Tool1.Output, 2)
	assert.Equal(t, item{Type: "message", Text: "I will look it up."}, out.Tool1.Output[0])
	assert.Equal(t, "get_weather", out.Tool1.Output[1].Name)
	assert.JSONEq(t, `{"city":"Paris"}`, out.Tool1.Output[1].Arguments)
	assert.Equal(t, "It is 22C in Paris.", out.Tool2.Text)
	assert.Equal(t, "Sunny again.", out.Tool3.Text)
	require.NotNil(t, out.Tool3.PreviousResponseID)
	assert.Equal(t, out.Tool2.ID, *out.Tool3.PreviousResponseID)
	// The client's round trip and the continuation extend the sampled ids:
	// one segment.
	got := Assemble(calls[3:])
	assert.Zero(t, got.PrefixBreaks)
	assert.Len(t, got.Segments, 1)

	assert.Equal(t, refusal{Status: 400, Param: "input[0].content[0].type", Type: "invalid_request_error"}, out.ImageRefused)
	assert.Equal(t, refusal{Status: 400, Param: "previous_response_id", Code: "previous_response_not_found", Type: "invalid_request_error"},
		out.NotStored)
	assert.Equal(t, 2, rec.Rejected())
}

// requireOpenAIPython returns python3 when it can import openai; else the
// test skips, or fails when ORTRAIN_REQUIRE_OPENAI is set (CI's lane that
// installs it).
func requireOpenAIPython(t *testing.T) string {
	t.Helper()
	python, err := exec.LookPath("python3")
	if err == nil {
		err = exec.Command(python, "-c", "import openai").Run()
	}
	if err != nil {
		if os.Getenv("ORTRAIN_REQUIRE_OPENAI") != "" {
			t.Fatalf("ORTRAIN_REQUIRE_OPENAI is set but python3 cannot import openai: %v", err)
		}
		t.Skipf("the openai Python package is not installed (Debian: python3-openai): %v", err)
	}
	return python
}
