package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/chat"
)

// readResponseStream reassembles a Responses stream as the openai clients'
// accumulator does (the snapshot from response.created, items appended on
// output_item.added, parts on content_part.added, deltas concatenated),
// checking each event's name against its type and the sequence numbers;
// it returns the snapshot, the final event's response and the event names.
func readResponseStream(tb testing.TB, body []byte) (snapshot, final clientResponse, events []string) {
	tb.Helper()
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	name := ""
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		if n, ok := strings.CutPrefix(line, "event: "); ok {
			require.Empty(tb, name, "two event lines in a row")
			name = n
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		require.True(tb, ok, "SSE line neither event nor data: %q", line)
		require.NotEmpty(tb, name, "data without an event name: %s", data)
		var ev struct {
			Type           string          `json:"type"`
			SequenceNumber *int            `json:"sequence_number"`
			Response       *clientResponse `json:"response"`
			OutputIndex    *int            `json:"output_index"`
			ContentIndex   *int            `json:"content_index"`
			ItemID         string          `json:"item_id"`
			Item           *clientRespItem `json:"item"`
			Part           *struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"part"`
			Delta     string          `json:"delta"`
			Text      *string         `json:"text"`
			Arguments *string         `json:"arguments"`
			Name      string          `json:"name"`
			Logprobs  json.RawMessage `json:"logprobs"`
		}
		require.NoError(tb, json.Unmarshal([]byte(data), &ev), "event %s", data)
		require.Equal(tb, name, ev.Type, "the event name is its data's type")
		require.NotNil(tb, ev.SequenceNumber, "event %s", data)
		require.Equal(tb, len(events), *ev.SequenceNumber)
		events = append(events, name)
		name = ""
		switch ev.Type {
		case "response.created":
			require.NotNil(tb, ev.Response)
			snapshot = *ev.Response
			require.Empty(tb, snapshot.Output)
			require.Equal(tb, "in_progress", snapshot.Status)
		case "response.output_item.added":
			require.Equal(tb, len(snapshot.Output), *ev.OutputIndex)
			snapshot.Output = append(snapshot.Output, *ev.Item)
		case "response.content_part.added":
			out := &snapshot.Output[*ev.OutputIndex]
			require.Equal(tb, out.ID, ev.ItemID)
			require.Equal(tb, len(out.Content), *ev.ContentIndex)
			out.Content = append(out.Content, struct {
				Type        string `json:"type"`
				Text        string `json:"text"`
				Annotations []any  `json:"annotations"`
			}{Type: ev.Part.Type, Text: ev.Part.Text})
		case "response.output_text.delta":
			require.JSONEq(tb, `[]`, string(ev.Logprobs))
			snapshot.Output[*ev.OutputIndex].Content[*ev.ContentIndex].Text += ev.Delta
		case "response.output_text.done":
			require.JSONEq(tb, `[]`, string(ev.Logprobs))
			require.Equal(tb, snapshot.Output[*ev.OutputIndex].Content[*ev.ContentIndex].Text, *ev.Text)
		case "response.function_call_arguments.delta":
			snapshot.Output[*ev.OutputIndex].Arguments += ev.Delta
		case "response.function_call_arguments.done":
			require.Equal(tb, snapshot.Output[*ev.OutputIndex].Arguments, *ev.Arguments)
			require.Equal(tb, snapshot.Output[*ev.OutputIndex].Name, ev.Name)
		case "response.output_item.done":
			snapshot.Output[*ev.OutputIndex].Status = ev.Item.Status
		case "response.completed", "response.incomplete":
			final = *ev.Response
		}
	}
	require.NoError(tb, sc.Err())
	return snapshot, final, events
}

func TestResponsesStream(t *testing.T) {
	messageEvents := []string{"response.output_item.added", "response.content_part.added", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done"}
	callEvents := []string{"response.output_item.added", "response.function_call_arguments.delta",
		"response.function_call_arguments.done", "response.output_item.done"}
	seq := func(parts ...[]string) []string {
		out := []string{"response.created", "response.in_progress"}
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	cases := []struct {
		name   string
		sample string
		extra  map[string]any
		events []string
		status string
	}{
		{name: "text", sample: "Hello there.", events: seq(messageEvents, []string{"response.completed"}), status: "completed"},
		{name: "text then call", sample: "I will look it up.\n" + weatherCall, extra: map[string]any{"tools": []any{respWeatherTool}},
			events: seq(messageEvents, callEvents, []string{"response.completed"}), status: "completed"},
		{name: "call only", sample: weatherCall, extra: map[string]any{"tools": []any{respWeatherTool}},
			events: seq(callEvents, []string{"response.completed"}), status: "completed"},
		{name: "cut by the budget", sample: "Hello there, a long answer.", extra: map[string]any{"max_output_tokens": 4},
			events: seq(messageEvents, []string{"response.incomplete"}), status: "incomplete"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			key, rec := h.open(t, "r")
			h.sampler.script(tc.sample, true)
			body := map[string]any{"model": "m", "input": "Weather in Paris?", "stream": true}
			for k, v := range tc.extra {
				body[k] = v
			}
			// The same request unstreamed, for comparison.
			whole, _ := h.postResponse(t, "r", key, map[string]any{"model": "m", "input": "Weather in Paris?", "tools": body["tools"],
				"max_output_tokens": body["max_output_tokens"]})

			req, err := http.NewRequest(http.MethodPost, h.url+responsesPath("r"), strings.NewReader(mustJSON(t, body)))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+key)
			resp, err := h.client.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
			var buf bytes.Buffer
			_, err = buf.ReadFrom(resp.Body)
			require.NoError(t, err)
			assert.NotContains(t, buf.String(), "[DONE]")

			snapshot, final, events := readResponseStream(t, buf.Bytes())
			assert.Equal(t, tc.events, events)
			assert.Equal(t, tc.status, final.Status)
			require.Len(t, snapshot.Output, len(final.Output))
			for i := range final.Output {
				got, want := snapshot.Output[i], final.Output[i]
				assert.Equal(t, want.ID, got.ID)
				assert.Equal(t, want.Status, got.Status)
				assert.Equal(t, want.Arguments, got.Arguments)
				assert.Equal(t, want.Name, got.Name)
				if want.Type == "message" {
					assert.Equal(t, want.Content[0].Text, got.Content[0].Text)
				}
				// Streamed and whole replies hold the same items.
				assert.Equal(t, whole.Output[i].Type, want.Type)
				assert.Equal(t, whole.Output[i].Content, want.Content)
				assert.Equal(t, whole.Output[i].Arguments, want.Arguments)
			}
			calls := rec.Calls()
			require.Len(t, calls, 2)
			require.NotNil(t, final.Usage)
			assert.Equal(t, len(calls[1].CompletionIDs), final.Usage.OutputTokens)
			assert.Equal(t, calls[0].PromptIDs, calls[1].PromptIDs)
		})
	}
}

func mustJSON(tb testing.TB, v any) string {
	tb.Helper()
	data, err := json.Marshal(v)
	require.NoError(tb, err)
	return string(data)
}

func TestResponsesErrors(t *testing.T) {
	user := []any{map[string]any{"role": "user", "content": "hi"}}
	item := func(kv ...any) []any {
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return []any{m}
	}
	cases := []struct {
		name  string
		body  any
		param string
		code  string
	}{
		{name: "image part", body: map[string]any{"input": item("role", "user", "content", []any{map[string]any{"type": "input_text", "text": "look"},
			map[string]any{"type": "input_image", "image_url": "data:"}})}, param: "input[0].content[1].type"},
		{name: "refusal part", body: map[string]any{"input": item("role", "assistant", "content", []any{map[string]any{"type": "refusal", "refusal": "no"}})},
			param: "input[0].content[0].type"},
		{name: "unsupported item", body: map[string]any{"input": append(user, map[string]any{"type": "item_reference", "id": "msg_1"})}, param: "input[1].type"},
		{name: "item without a type or role", body: map[string]any{"input": []any{map[string]any{"content": "x"}}}, param: "input[0].type"},
		{name: "tool role", body: map[string]any{"input": item("role", "tool", "content", "x")}, param: "input[0].role"},
		{name: "function_call without a name", body: map[string]any{"input": item("type", "function_call", "call_id", "c", "arguments", "{}")},
			param: "input[0].name"},
		{name: "function_call without a call_id", body: map[string]any{"input": item("type", "function_call", "name", "f", "arguments", "{}")},
			param: "input[0].call_id"},
		{name: "function_call_output without a call_id", body: map[string]any{"input": item("type", "function_call_output", "output", "x")},
			param: "input[0].call_id"},
		{name: "function_call_output with a file", body: map[string]any{"input": item("type", "function_call_output", "call_id", "c",
			"output", []any{map[string]any{"type": "input_file", "file_id": "f"}})}, param: "input[0].output[0].type"},
		{name: "no input", body: map[string]any{}, param: "input"},
		{name: "input a number", body: map[string]any{"input": 3}, param: "input"},
		{name: "instructions not a string", body: map[string]any{"input": "hi", "instructions": []any{}}, param: "instructions"},
		{name: "function tool without a name", body: map[string]any{"input": "hi", "tools": []any{map[string]any{"type": "function"}}}, param: "tools[0].name"},
		{name: "chat-shaped tool", body: map[string]any{"input": "hi", "tools": []any{weatherToolJSON}}, param: "tools[0].name"},
		{name: "tool without a type", body: map[string]any{"input": "hi", "tools": []any{map[string]any{"name": "f"}}}, param: "tools[0].type"},
		{name: "namespace function without a name", body: map[string]any{"input": "hi", "tools": []any{map[string]any{"type": "namespace", "name": "ns",
			"tools": []any{map[string]any{"type": "function", "name": "ok"}, map[string]any{"type": "function"}}}}}, param: "tools[0].tools[1].name"},
		{name: "parameters not an object", body: map[string]any{"input": "hi", "tools": []any{map[string]any{"type": "function", "name": "f", "parameters": "x"}}},
			param: "tools[0].parameters"},
		{name: "tool_choice names no tool", body: map[string]any{"input": "hi", "tools": []any{respWeatherTool},
			"tool_choice": map[string]any{"type": "function", "name": "nope"}}, param: "tool_choice.name"},
		{name: "tool_choice unknown", body: map[string]any{"input": "hi", "tool_choice": "any"}, param: "tool_choice"},
		{name: "max_output_tokens zero", body: map[string]any{"input": "hi", "max_output_tokens": 0}, param: "max_output_tokens"},
		{name: "bad temperature", body: map[string]any{"input": "hi", "temperature": -1}, param: "temperature"},
		{name: "background", body: map[string]any{"input": "hi", "background": true}, param: "background"},
		{name: "conversation", body: map[string]any{"input": "hi", "conversation": "conv_1"}, param: "conversation"},
		{name: "bad truncation", body: map[string]any{"input": "hi", "truncation": "sometimes"}, param: "truncation"},
		{name: "unknown previous response", body: map[string]any{"input": "hi", "previous_response_id": "resp_x"}, param: "previous_response_id",
			code: "previous_response_not_found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			key, rec := h.open(t, "r")
			if m, ok := tc.body.(map[string]any); ok {
				m["model"] = "m"
			}
			status, raw := h.post(t, responsesPath("r"), key, tc.body)
			require.Equal(t, http.StatusBadRequest, status, string(raw))
			var e clientError
			require.NoError(t, json.Unmarshal(raw, &e), string(raw))
			assert.Equal(t, "invalid_request_error", e.Error.Type)
			require.NotNil(t, e.Error.Param, string(raw))
			assert.Equal(t, tc.param, *e.Error.Param)
			if tc.code != "" {
				require.NotNil(t, e.Error.Code)
				assert.Equal(t, tc.code, *e.Error.Code)
			}
			assert.Equal(t, 1, rec.Rejected())
			require.Len(t, rec.Rejections(), 1)
			assert.Equal(t, tc.param, rec.Rejections()[0].Param)
			assert.Equal(t, "POST "+responsesPath("r"), rec.Rejections()[0].Route)
			assert.Empty(t, rec.Calls())
		})
	}
}

// The single tenant (serve-engine) serves responses at /v1 and keeps them
// for previous_response_id, with no recorder.
func TestResponsesSingleTenant(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.SingleTenant = &SingleTenant{APIKey: "k"} })
	status, raw := h.post(t, "/v1/responses", "k", map[string]any{"model": "m", "input": "hi",
		"tools": []any{map[string]any{"type": "web_search"}}, "reasoning": map[string]any{"effort": "low"}})
	require.Equal(t, http.StatusOK, status, string(raw))
	var first clientResponse
	require.NoError(t, json.Unmarshal(raw, &first))
	status, raw = h.post(t, "/v1/responses", "k", map[string]any{"model": "m", "input": "again", "previous_response_id": first.ID})
	require.Equal(t, http.StatusOK, status, string(raw))
	assert.Equal(t, h.render(t, []chat.Message{{Role: "user", Content: "hi"}, {Role: "assistant", Content: "Hello there."},
		{Role: "user", Content: "again"}}, nil), h.sampler.lastRequest(t).PromptIDs)
	status, _ = h.post(t, "/v1/responses", "wrong", map[string]any{"model": "m", "input": "hi"})
	assert.Equal(t, http.StatusUnauthorized, status)
}

func TestResponseStoreBound(t *testing.T) {
	s := newResponseStore()
	for i := range maxStoredResponses + 44 {
		s.put(fmt.Sprintf("resp_%d", i), []chat.Message{{Role: "user", Content: fmt.Sprint(i)}})
	}
	assert.Equal(t, maxStoredResponses, s.len())
	_, ok := s.get("resp_43")
	assert.False(t, ok, "the oldest are dropped")
	msgs, ok := s.get("resp_44")
	require.True(t, ok)
	assert.Equal(t, "44", msgs[0].Content)
	var nilStore *responseStore
	_, ok = nilStore.get("x")
	assert.False(t, ok)
}

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Accepted-but-ignored settings are logged at info once per gateway, not
// once per call or per rollout.
func TestResponsesNotesOnce(t *testing.T) {
	var logs syncBuffer
	h := newHarness(t, func(o *Options) { o.Logger = zerolog.New(&logs).Level(zerolog.InfoLevel) })
	body := map[string]any{"model": "m", "input": "hi", "parallel_tool_calls": true, "reasoning": map[string]any{"effort": "high"},
		"include": []string{"reasoning.encrypted_content"}, "store": true, "truncation": "auto", "tools": []any{respWeatherTool},
		"tool_choice": "required", "text": map[string]any{"format": map[string]any{"type": "json_object"}}}
	for _, id := range []string{"a", "b"} {
		key, _ := h.open(t, id)
		for range 2 {
			h.postResponse(t, id, key, body)
		}
	}
	for _, field := range []string{"parallel_tool_calls", "reasoning", "include", "store", "truncation", "tool_choice", "text.format"} {
		assert.Equal(t, 1, strings.Count(logs.String(), `"message":"responses: `+field), field)
	}
}
