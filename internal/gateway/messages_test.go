package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/chat"
)

var toolUseIDPattern = regexp.MustCompile(`^toolu_[0-9a-f]{24}$`)

// anthWeatherTool is the weather tool as Anthropic's clients send it.
var anthWeatherTool = json.RawMessage(`{"name":"get_weather","description":"Current weather of a city","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}`)

func messagesPath(id string) string { return RolloutPath(id) + "/messages" }

// postMessages sends body with the key as x-api-key (Anthropic's clients'
// way) and Anthropic's headers.
func (h *harness) postMessages(tb testing.TB, path, key string, body any) (int, []byte) {
	tb.Helper()
	raw, ok := body.(string)
	if !ok {
		data, err := json.Marshal(body)
		require.NoError(tb, err)
		raw = string(data)
	}
	req, err := http.NewRequest(http.MethodPost, h.url+path, strings.NewReader(raw))
	require.NoError(tb, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Api-Key", key)
	req.Header.Set("Anthropic-Version", "2023-06-01")
	req.Header.Set("Anthropic-Beta", "interleaved-thinking-2025-05-14")
	return h.do(tb, req)
}

// The client's view of a Messages reply, decoded independently of the
// server's types.
type clientAnthMessage struct {
	ID           string            `json:"id"`
	Type         string            `json:"type"`
	Role         string            `json:"role"`
	Model        string            `json:"model"`
	Content      []clientAnthBlock `json:"content"`
	StopReason   *string           `json:"stop_reason"`
	StopSequence *string           `json:"stop_sequence"`
	Usage        clientAnthUsage   `json:"usage"`
}

type clientAnthBlock struct {
	Type  string          `json:"type"`
	Text  *string         `json:"text,omitempty"`
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
}

type clientAnthUsage struct {
	InputTokens              int  `json:"input_tokens"`
	OutputTokens             int  `json:"output_tokens"`
	CacheCreationInputTokens *int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int `json:"cache_read_input_tokens"`
}

type clientAnthError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// readMessagesStream reassembles a Messages stream as Anthropic's SDKs do,
// checking each event's name against its data's type; it returns the
// message and the event names in order.
func readMessagesStream(tb testing.TB, body []byte) (clientAnthMessage, []string) {
	tb.Helper()
	var msg clientAnthMessage
	var events []string
	var inputs []string // input_json_delta accumulated per block
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
		require.NotEmpty(tb, name, "data without an event name")
		var ev struct {
			Type         string            `json:"type"`
			Message      clientAnthMessage `json:"message"`
			Index        int               `json:"index"`
			ContentBlock clientAnthBlock   `json:"content_block"`
			Delta        struct {
				Type         string  `json:"type"`
				Text         string  `json:"text"`
				PartialJSON  string  `json:"partial_json"`
				StopReason   *string `json:"stop_reason"`
				StopSequence *string `json:"stop_sequence"`
			} `json:"delta"`
			Usage clientAnthUsage `json:"usage"`
		}
		require.NoError(tb, json.Unmarshal([]byte(data), &ev), "event %s", data)
		require.Equal(tb, name, ev.Type, "the event name is its data's type")
		events = append(events, name)
		name = ""
		switch ev.Type {
		case "message_start":
			msg = ev.Message
			require.Empty(tb, msg.Content, "message_start has no content")
		case "content_block_start":
			require.Equal(tb, len(msg.Content), ev.Index)
			msg.Content = append(msg.Content, ev.ContentBlock)
			inputs = append(inputs, "")
		case "content_block_delta":
			b := &msg.Content[ev.Index]
			switch ev.Delta.Type {
			case "text_delta":
				*b.Text += ev.Delta.Text
			case "input_json_delta":
				inputs[ev.Index] += ev.Delta.PartialJSON
			default:
				tb.Fatalf("unknown delta %q", ev.Delta.Type)
			}
		case "content_block_stop":
			if inputs[ev.Index] != "" {
				msg.Content[ev.Index].Input = json.RawMessage(inputs[ev.Index])
			}
		case "message_delta":
			msg.StopReason, msg.StopSequence = ev.Delta.StopReason, ev.Delta.StopSequence
			msg.Usage.OutputTokens = ev.Usage.OutputTokens
		}
	}
	require.NoError(tb, sc.Err())
	return msg, events
}

func TestMessages(t *testing.T) {
	type wantBlock struct{ typ, text, name, input string }
	cases := []struct {
		name      string
		sample    string
		endTurn   bool
		extra     map[string]any
		blocks    []wantBlock
		reason    string
		stopSeq   *string
		finish    string // recorded
		malformed int
		keep      int // completion ids recorded; 0: all
	}{
		{name: "text", sample: "Hello there.", endTurn: true, blocks: []wantBlock{{typ: "text", text: "Hello there."}}, reason: "end_turn", finish: "stop"},
		{name: "tool_use", sample: weatherCall, endTurn: true,
			blocks: []wantBlock{{typ: "tool_use", name: "get_weather", input: `{"city":"Paris"}`}}, reason: "tool_use", finish: "tool_calls"},
		{name: "text and two calls", sample: "Let me check.\n" + weatherCall + "\n" + weatherCall, endTurn: true,
			blocks: []wantBlock{{typ: "text", text: "Let me check."}, {typ: "tool_use", name: "get_weather", input: `{"city":"Paris"}`},
				{typ: "tool_use", name: "get_weather", input: `{"city":"Paris"}`}}, reason: "tool_use", finish: "tool_calls"},
		{name: "tool_choice none returns the call as text", sample: weatherCall, endTurn: true, extra: map[string]any{"tool_choice": map[string]any{"type": "none"}},
			blocks: []wantBlock{{typ: "text", text: weatherCall}}, reason: "end_turn", finish: "stop"},
		{name: "tool_choice tool is accepted", sample: weatherCall, endTurn: true,
			extra:  map[string]any{"tool_choice": map[string]any{"type": "tool", "name": "get_weather"}},
			blocks: []wantBlock{{typ: "tool_use", name: "get_weather", input: `{"city":"Paris"}`}}, reason: "tool_use", finish: "tool_calls"},
		{name: "malformed call is text", sample: "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>", endTurn: true,
			blocks: []wantBlock{{typ: "text", text: "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>"}},
			reason: "end_turn", finish: "stop", malformed: 1},
		{name: "max_tokens", sample: "A long answer that does not fit.", endTurn: true, extra: map[string]any{"max_tokens": 6},
			blocks: []wantBlock{{typ: "text", text: "A long"}}, reason: "max_tokens", finish: "length", keep: 6},
		{name: "stop sequence", sample: "abc STOP def", endTurn: true, extra: map[string]any{"stop_sequences": []string{"zzz", "STOP"}},
			blocks: []wantBlock{{typ: "text", text: "abc"}}, reason: "stop_sequence", stopSeq: ptr("STOP"), finish: "stop", keep: len("abc STOP")},
		{name: "stop sequence not sampled", sample: "abc STOP def", endTurn: true, extra: map[string]any{"stop_sequences": []string{"zzz"}},
			blocks: []wantBlock{{typ: "text", text: "abc STOP def"}}, reason: "end_turn", finish: "stop"},
		{name: "ignored fields", sample: "Hi.", endTurn: true, extra: map[string]any{"metadata": map[string]any{"user_id": "u"},
			"thinking": map[string]any{"type": "enabled", "budget_tokens": 1024}, "context_management": map[string]any{"edits": []any{}},
			"output_config": map[string]any{"effort": "low"}, "service_tier": "auto", "container": nil, "mcp_servers": []any{},
			"temperature": 0.5, "top_p": 0.9, "top_k": 40},
			blocks: []wantBlock{{typ: "text", text: "Hi."}}, reason: "end_turn", finish: "stop"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			key, rec := h.open(t, "r-1")
			h.sampler.script(tc.sample, tc.endTurn)
			h.version.Store(3)
			body := map[string]any{"model": "claude-sonnet-4-5", "max_tokens": 256, "system": "Be brief.",
				"messages": []any{map[string]any{"role": "user", "content": "Weather in Paris?"}},
				"tools":    []json.RawMessage{anthWeatherTool}}
			for k, v := range tc.extra {
				body[k] = v
			}
			status, raw := h.postMessages(t, messagesPath("r-1"), key, body)
			require.Equal(t, http.StatusOK, status, string(raw))
			var msg clientAnthMessage
			require.NoError(t, json.Unmarshal(raw, &msg))
			assert.Regexp(t, `^msg_[0-9a-f]{24}$`, msg.ID)
			assert.Equal(t, "message", msg.Type)
			assert.Equal(t, "assistant", msg.Role)
			assert.Equal(t, "tiny-policy", msg.Model)
			require.NotNil(t, msg.StopReason)
			assert.Equal(t, tc.reason, *msg.StopReason)
			assert.Equal(t, tc.stopSeq, msg.StopSequence)
			require.Len(t, msg.Content, len(tc.blocks), string(raw))
			for i, want := range tc.blocks {
				b := msg.Content[i]
				assert.Equal(t, want.typ, b.Type)
				if want.typ == "text" {
					require.NotNil(t, b.Text)
					assert.Equal(t, want.text, *b.Text)
					continue
				}
				assert.Regexp(t, toolUseIDPattern, b.ID)
				assert.Equal(t, want.name, b.Name)
				assert.JSONEq(t, want.input, string(b.Input))
			}

			// The engine got what chat would send for the same conversation.
			wantPrompt := h.render(t, []chat.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Weather in Paris?"}},
				[]chat.Tool{weatherTool()})
			assert.Equal(t, wantPrompt, h.sampler.lastRequest(t).PromptIDs)
			calls := rec.Calls()
			require.Len(t, calls, 1)
			sampled := h.tok.Encode(tc.sample)
			if tc.endTurn {
				sampled = append(sampled, h.sampler.imEnd)
			}
			if tc.keep > 0 {
				sampled = sampled[:tc.keep]
			}
			c := calls[0]
			assert.Equal(t, KindMessages, c.Kind)
			assert.Equal(t, wantPrompt, c.PromptIDs)
			assert.Equal(t, sampled, c.CompletionIDs)
			assert.Equal(t, fakeLogprobs(len(sampled)), c.Logprobs)
			assert.Equal(t, tc.finish, c.FinishReason)
			assert.Equal(t, tc.malformed, c.MalformedToolCalls)
			assert.Equal(t, 3, c.WeightVersion)
			assert.Equal(t, clientAnthUsage{InputTokens: len(wantPrompt), OutputTokens: len(sampled),
				CacheCreationInputTokens: ptr(0), CacheReadInputTokens: ptr(0)}, msg.Usage)

			// Streamed, the same request reassembles to the same message.
			body["stream"] = true
			status, raw = h.postMessages(t, messagesPath("r-1"), key, body)
			require.Equal(t, http.StatusOK, status, string(raw))
			streamed, events := readMessagesStream(t, raw)
			want := []string{"message_start", "ping"}
			for range tc.blocks {
				want = append(want, "content_block_start", "content_block_delta", "content_block_stop")
			}
			want = append(want, "message_delta", "message_stop")
			assert.Equal(t, want, events)
			for i := range streamed.Content {
				if streamed.Content[i].Type == "tool_use" {
					assert.Regexp(t, toolUseIDPattern, streamed.Content[i].ID)
					assert.JSONEq(t, string(msg.Content[i].Input), string(streamed.Content[i].Input))
					streamed.Content[i].ID, streamed.Content[i].Input = msg.Content[i].ID, msg.Content[i].Input // fresh ids; spacing
				}
			}
			streamed.ID = msg.ID
			assert.Equal(t, msg, streamed)
			assert.Len(t, rec.Calls(), 2)
		})
	}
}

// An Anthropic conversation in all its shapes renders as the equivalent
// chat conversation: system blocks joined, a system message inside
// messages, text blocks joined, thinking skipped, tool_use as tool calls
// (content null with only calls), tool_result as tool messages named after
// their call, text after a tool result as a user message.
func TestMessagesConversion(t *testing.T) {
	h := newHarness(t, nil)
	key, _ := h.open(t, "r")
	body := `{"model":"m","max_tokens":100,"tools":[` + string(anthWeatherTool) + `],
		"system":[{"type":"text","text":"You are an agent.","cache_control":{"type":"ephemeral"}},{"type":"text","text":"Be brief."}],
		"messages":[
		{"role":"system","content":"Extra rules."},
		{"role":"user","content":[{"type":"text","text":"Weather in"},{"type":"text","text":"Paris and Rome?","cache_control":{"type":"ephemeral"}}]},
		{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"sig"},{"type":"redacted_thinking","data":"x"},
			{"type":"tool_use","id":"toolu_a","name":"get_weather","input":{"city":"Paris"}},
			{"type":"tool_use","id":"toolu_b","name":"get_weather","input":{"city":"Rome","units":"C"}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_a","content":"22C"},
			{"type":"tool_result","tool_use_id":"toolu_b","is_error":true,"content":[{"type":"text","text":"25C"},{"type":"text","text":"windy"}]},
			{"type":"text","text":"Summarize."}]},
		{"role":"assistant","content":"Paris 22C, Rome 25C."},
		{"role":"user","content":"Thanks"}]}`
	status, raw := h.postMessages(t, messagesPath("r"), key, body)
	require.Equal(t, http.StatusOK, status, string(raw))
	want := h.render(t, []chat.Message{
		{Role: "system", Content: "You are an agent.\nBe brief."},
		{Role: "system", Content: "Extra rules."},
		{Role: "user", Content: "Weather in\nParis and Rome?"},
		{Role: "assistant", NullContent: true, ToolCalls: []chat.ToolCall{
			{ID: "toolu_a", Name: "get_weather", Arguments: json.RawMessage(`{"city":"Paris"}`)},
			{ID: "toolu_b", Name: "get_weather", Arguments: json.RawMessage(`{"city":"Rome","units":"C"}`)}}},
		{Role: "tool", ToolCallID: "toolu_a", Name: "get_weather", Content: "22C"},
		{Role: "tool", ToolCallID: "toolu_b", Name: "get_weather", Content: "25C\nwindy"},
		{Role: "user", Content: "Summarize."},
		{Role: "assistant", Content: "Paris 22C, Rome 25C."},
		{Role: "user", Content: "Thanks"},
	}, []chat.Tool{weatherTool()})
	assert.Equal(t, want, h.sampler.lastRequest(t).PromptIDs)
}

// An agent's loop: the reply's content goes back as the assistant turn and
// a tool_result follows; the second prompt continues the first prompt and
// completion token for token, so Assemble makes one segment.
func TestMessagesToolRoundTrip(t *testing.T) {
	cases := []struct{ name, first string }{
		{name: "call only", first: weatherCall},
		{name: "text before the call", first: "I will look it up.\n" + weatherCall},
		{name: "thinking kept in the text", first: "<think>\nParis, so call the tool.\n</think>\n" + weatherCall},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			key, rec := h.open(t, "agent")
			messages := []any{map[string]any{"role": "user", "content": "Weather in Paris?"}}
			body := map[string]any{"model": "m", "max_tokens": 256, "system": "You answer weather questions.",
				"tools": []json.RawMessage{anthWeatherTool}, "messages": messages}
			h.sampler.script(tc.first, true)
			status, raw := h.postMessages(t, messagesPath("agent"), key, body)
			require.Equal(t, http.StatusOK, status, string(raw))
			var first struct {
				Content []map[string]any `json:"content"`
			}
			require.NoError(t, json.Unmarshal(raw, &first))
			use := first.Content[len(first.Content)-1]
			require.Equal(t, "tool_use", use["type"])

			h.sampler.script("It is 22C in Paris.", true)
			body["messages"] = append(messages, map[string]any{"role": "assistant", "content": first.Content},
				map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": use["id"], "content": "22C, sunny"}}})
			status, raw = h.postMessages(t, messagesPath("agent"), key, body)
			require.Equal(t, http.StatusOK, status, string(raw))

			calls := rec.Calls()
			require.Len(t, calls, 2)
			got := Assemble(calls)
			require.Zero(t, got.PrefixBreaks, "the re-rendered history must be the sampled ids")
			require.Len(t, got.Segments, 1)
			held := append(append([]int32{}, calls[0].PromptIDs...), calls[0].CompletionIDs...)
			assert.Equal(t, "\n<|im_start|>user\n<tool_response>\n22C, sunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
				h.tok.Decode(calls[1].PromptIDs[len(held):], false))
		})
	}
}

func TestMessagesErrors(t *testing.T) {
	user := []any{map[string]any{"role": "user", "content": "hi"}}
	cases := []struct {
		name   string
		body   any
		status int
		typ    string
		param  string // in the message and the recorded rejection
	}{
		{name: "max_tokens missing", body: map[string]any{"messages": user}, status: 400, typ: "invalid_request_error", param: "max_tokens"},
		{name: "image block", body: map[string]any{"max_tokens": 10, "messages": []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "text", "text": "look"}, map[string]any{"type": "image", "source": map[string]any{"type": "base64"}}}}}},
			status: 400, typ: "invalid_request_error", param: "messages[0].content[1].type"},
		{name: "document in a tool result", body: map[string]any{"max_tokens": 10, "messages": []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "tool_result", "tool_use_id": "t", "content": []any{map[string]any{"type": "document"}}}}}}},
			status: 400, typ: "invalid_request_error", param: "messages[0].content[0].content[0].type"},
		{name: "tool_use on a user turn", body: map[string]any{"max_tokens": 10, "messages": []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "tool_use", "id": "t", "name": "f", "input": map[string]any{}}}}}},
			status: 400, typ: "invalid_request_error", param: "messages[0].content[0].type"},
		{name: "tool_use input not an object", body: map[string]any{"max_tokens": 10, "messages": []any{map[string]any{"role": "assistant", "content": []any{
			map[string]any{"type": "tool_use", "id": "t", "name": "f", "input": []int{1}}}}}},
			status: 400, typ: "invalid_request_error", param: "messages[0].content[0].input"},
		{name: "unknown role", body: map[string]any{"max_tokens": 10, "messages": []any{map[string]any{"role": "tool", "content": "x"}}},
			status: 400, typ: "invalid_request_error", param: "messages[0].role"},
		{name: "no messages", body: map[string]any{"max_tokens": 10, "messages": []any{}}, status: 400, typ: "invalid_request_error", param: "messages"},
		{name: "tool_choice names no tool", body: map[string]any{"max_tokens": 10, "messages": user, "tools": []json.RawMessage{anthWeatherTool},
			"tool_choice": map[string]any{"type": "tool", "name": "nope"}}, status: 400, typ: "invalid_request_error", param: "tool_choice.name"},
		{name: "max_tokens zero", body: map[string]any{"max_tokens": 0, "messages": user}, status: 400, typ: "invalid_request_error", param: "max_tokens"},
		{name: "bad temperature", body: map[string]any{"max_tokens": 10, "temperature": -1, "messages": user}, status: 400, typ: "invalid_request_error", param: "temperature"},
		{name: "empty stop sequence", body: map[string]any{"max_tokens": 10, "stop_sequences": []string{""}, "messages": user}, status: 400, typ: "invalid_request_error", param: "stop_sequences"},
		{name: "invalid JSON", body: `{"max_tokens":`, status: 400, typ: "invalid_request_error"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			key, rec := h.open(t, "r")
			status, raw := h.postMessages(t, messagesPath("r"), key, tc.body)
			require.Equal(t, tc.status, status, string(raw))
			var e clientAnthError
			require.NoError(t, json.Unmarshal(raw, &e), string(raw))
			assert.Equal(t, "error", e.Type)
			assert.Equal(t, tc.typ, e.Error.Type)
			assert.Contains(t, e.Error.Message, tc.param)
			assert.Equal(t, 1, rec.Rejected())
			require.Len(t, rec.Rejections(), 1)
			assert.Equal(t, tc.param, rec.Rejections()[0].Param)
			assert.Equal(t, "POST "+messagesPath("r"), rec.Rejections()[0].Route)
			assert.Empty(t, rec.Calls())
		})
	}
}

// Both of Anthropic's key headers are accepted, a query string (the beta
// surface's ?beta=true) does not change the route, and a wrong key is 401.
func TestMessagesAuthAndRoute(t *testing.T) {
	h := newHarness(t, nil)
	key, rec := h.open(t, "r")
	body := `{"model":"m","max_tokens":20,"messages":[{"role":"user","content":"hi"}]}`
	send := func(path string, header func(*http.Request)) int {
		req, err := http.NewRequest(http.MethodPost, h.url+path, strings.NewReader(body))
		require.NoError(t, err)
		header(req)
		status, raw := h.do(t, req)
		if status == http.StatusOK {
			var msg clientAnthMessage
			require.NoError(t, json.Unmarshal(raw, &msg))
			assert.Equal(t, "Hello there.", *msg.Content[0].Text)
		}
		return status
	}
	assert.Equal(t, http.StatusOK, send(messagesPath("r"), func(r *http.Request) { r.Header.Set("x-api-key", key) }))
	assert.Equal(t, http.StatusOK, send(messagesPath("r"), func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+key) }))
	assert.Equal(t, http.StatusOK, send(messagesPath("r")+"?beta=true", func(r *http.Request) {
		r.Header.Set("x-api-key", key)
		r.Header.Set("anthropic-beta", "context-management-2025-06-27,fine-grained-tool-streaming-2025-05-14")
	}))
	assert.Equal(t, http.StatusUnauthorized, send(messagesPath("r"), func(r *http.Request) { r.Header.Set("x-api-key", "sk-wrong") }))
	assert.Equal(t, http.StatusUnauthorized, send(messagesPath("r"), func(*http.Request) {}))
	assert.Len(t, rec.Calls(), 3)
}

// Server tools are left out of the rendering and counted per served call.
func TestMessagesServerToolsDropped(t *testing.T) {
	h := newHarness(t, nil)
	key, rec := h.open(t, "r")
	body := map[string]any{"model": "m", "max_tokens": 20, "messages": []any{map[string]any{"role": "user", "content": "hi"}},
		"tools": []json.RawMessage{
			json.RawMessage(`{"type":"web_search_20250305","name":"web_search","max_uses":5}`),
			anthWeatherTool,
			json.RawMessage(`{"type":"bash_20250124","name":"bash"}`),
			json.RawMessage(`{"type":"custom","name":"noop","input_schema":{"type":"object"}}`),
		},
		"tool_choice": map[string]any{"type": "tool", "name": "web_search"}}
	for range 2 {
		status, raw := h.postMessages(t, messagesPath("r"), key, body)
		require.Equal(t, http.StatusOK, status, string(raw))
	}
	want := h.render(t, []chat.Message{{Role: "user", Content: "hi"}},
		[]chat.Tool{weatherTool(), {Name: "noop", Parameters: json.RawMessage(`{"type":"object"}`)}})
	assert.Equal(t, want, h.sampler.lastRequest(t).PromptIDs)
	assert.Equal(t, 4, rec.DroppedMessageTools())
}

func TestMessagesCountTokens(t *testing.T) {
	h := newHarness(t, nil)
	key, rec := h.open(t, "r")
	status, raw := h.postMessages(t, messagesPath("r")+"/count_tokens", key, map[string]any{"model": "m", "system": "Be brief.",
		"messages": []any{map[string]any{"role": "user", "content": "hi"}}, "tools": []json.RawMessage{anthWeatherTool}})
	require.Equal(t, http.StatusOK, status, string(raw))
	want := h.render(t, []chat.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "hi"}}, []chat.Tool{weatherTool()})
	assert.JSONEq(t, `{"input_tokens":`+strconv.Itoa(len(want))+`}`, string(raw))
	assert.Empty(t, rec.Calls(), "counting samples nothing")

	status, raw = h.postMessages(t, messagesPath("r")+"/count_tokens", key, map[string]any{"messages": []any{}})
	require.Equal(t, http.StatusBadRequest, status, string(raw))
	assert.Equal(t, 1, rec.Rejected())
}

// The single tenant (serve-engine) serves the same API at /v1 with no
// recorder: notes, dropped tools and refusals must not need one.
func TestMessagesSingleTenant(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.SingleTenant = &SingleTenant{APIKey: "k"} })
	body := map[string]any{"model": "m", "max_tokens": 20, "thinking": map[string]any{"type": "enabled", "budget_tokens": 1024},
		"tools":    []json.RawMessage{json.RawMessage(`{"type":"web_search_20250305","name":"web_search"}`)},
		"messages": []any{map[string]any{"role": "user", "content": "hi"}}}
	status, raw := h.postMessages(t, "/v1/messages?beta=true", "k", body)
	require.Equal(t, http.StatusOK, status, string(raw))
	delete(body, "max_tokens")
	status, raw = h.postMessages(t, "/v1/messages", "k", body)
	require.Equal(t, http.StatusBadRequest, status, string(raw))
	assert.Contains(t, string(raw), `"type":"invalid_request_error"`)
}
