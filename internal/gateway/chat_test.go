package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/engine"
)

var callIDPattern = regexp.MustCompile(`^call_[0-9a-f]{24}$`)

const weatherCall = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"

func TestChatCompletion(t *testing.T) {
	type wantCall struct{ name, args string }
	cases := []struct {
		name       string
		sample     string // what the fake model writes
		endTurn    bool
		extra      map[string]any // request fields
		content    *string
		calls      []wantCall
		finish     string
		malformed  int
		completion int // completion tokens; 0: all sampled ids
	}{
		{name: "text", sample: "Hello there.", endTurn: true, content: ptr("Hello there."), finish: "stop"},
		{name: "tool call", sample: weatherCall, endTurn: true,
			calls: []wantCall{{"get_weather", `{"city": "Paris"}`}}, finish: "tool_calls"},
		{name: "content and two calls", sample: "Let me check.\n" + weatherCall + "\n" + weatherCall, endTurn: true,
			content: ptr("Let me check."), calls: []wantCall{{"get_weather", `{"city": "Paris"}`}, {"get_weather", `{"city": "Paris"}`}}, finish: "tool_calls"},
		{name: "tool_choice none returns the call as text", sample: weatherCall, endTurn: true,
			extra: map[string]any{"tool_choice": "none"}, content: ptr(weatherCall), finish: "stop"},
		{name: "named tool_choice is accepted", sample: weatherCall, endTurn: true,
			extra:  map[string]any{"tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}}},
			calls:  []wantCall{{"get_weather", `{"city": "Paris"}`}},
			finish: "tool_calls"},
		{name: "malformed call is content", sample: "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>", endTurn: true,
			content: ptr("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>"), finish: "stop", malformed: 1},
		{name: "length", sample: "A long answer that does not fit.", endTurn: true,
			extra: map[string]any{"max_completion_tokens": 6}, content: ptr("A long"), finish: "length", completion: 6},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			key, rec := h.open(t, "r-1")
			h.sampler.script(tc.sample, tc.endTurn)
			h.version.Store(7)
			body := map[string]any{"model": "anything", "messages": []any{
				map[string]any{"role": "system", "content": "Be brief."},
				map[string]any{"role": "user", "content": "Weather in Paris?"}},
				"tools": []json.RawMessage{weatherToolJSON}, "logprobs": true, "top_logprobs": 2}
			for k, v := range tc.extra {
				body[k] = v
			}

			status, raw := h.post(t, chatPath("r-1"), key, body)
			require.Equal(t, http.StatusOK, status, string(raw))
			var resp clientCompletion
			require.NoError(t, json.Unmarshal(raw, &resp))
			require.Len(t, resp.Choices, 1)
			got := resp.Choices[0]
			assert.Equal(t, "chat.completion", resp.Object)
			assert.Equal(t, "tiny-policy", resp.Model)
			assert.Equal(t, "assistant", got.Message.Role)
			assert.Equal(t, tc.content, got.Message.Content)
			assert.Equal(t, tc.finish, got.FinishReason)
			require.Len(t, got.Message.ToolCalls, len(tc.calls))
			for i, want := range tc.calls {
				c := got.Message.ToolCalls[i]
				assert.Regexp(t, callIDPattern, c.ID)
				assert.Equal(t, "function", c.Type)
				assert.Equal(t, want.name, c.Function.Name)
				assert.JSONEq(t, want.args, c.Function.Arguments)
				assert.Nil(t, c.Index, "index is for stream deltas only")
			}

			// The engine got the template's rendering, encoded as rollouts encode it.
			req := h.sampler.lastRequest(t)
			wantPrompt := h.render(t, []chat.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Weather in Paris?"}},
				[]chat.Tool{weatherTool()})
			assert.Equal(t, wantPrompt, req.PromptIDs)
			assert.Equal(t, "r-1", req.SessionKey)
			assert.Equal(t, h.tok.Special().EndOfTurn, req.StopIDs)

			// The call is recorded token-exact.
			calls := rec.Calls()
			require.Len(t, calls, 1)
			call := calls[0]
			sampled := h.tok.Encode(tc.sample)
			if tc.endTurn {
				sampled = append(sampled, h.sampler.imEnd)
			}
			if tc.completion > 0 {
				sampled = sampled[:tc.completion]
			}
			assert.Equal(t, KindChat, call.Kind)
			assert.Equal(t, wantPrompt, call.PromptIDs)
			assert.Equal(t, sampled, call.CompletionIDs)
			assert.Equal(t, fakeLogprobs(len(sampled)), call.Logprobs)
			assert.Equal(t, 7, call.WeightVersion)
			assert.Equal(t, tc.finish, call.FinishReason)
			assert.Equal(t, tc.malformed, call.MalformedToolCalls)
			assert.False(t, call.End.Before(call.Start))
			require.NotNil(t, resp.Usage)
			assert.Equal(t, clientUsage{PromptTokens: len(wantPrompt), CompletionTokens: len(sampled), TotalTokens: len(wantPrompt) + len(sampled)}, *resp.Usage)
			require.NotNil(t, got.Logprobs)
			require.Len(t, got.Logprobs.Content, len(sampled))
			assert.InDelta(t, -0.01, got.Logprobs.Content[0].Logprob, 1e-6)
			assert.Equal(t, h.tok.Decode(sampled[:1], false), got.Logprobs.Content[0].Token)
			assert.NotNil(t, got.Logprobs.Content[0].TopLogprobs, "top_logprobs is an (empty) list")

			// Streamed, the same request reassembles to the same message.
			body["stream"] = true
			body["stream_options"] = map[string]any{"include_usage": true}
			status, raw = h.post(t, chatPath("r-1"), key, body)
			require.Equal(t, http.StatusOK, status, string(raw))
			s := readChatStream(t, raw)
			assert.True(t, s.done, "the stream ends with [DONE]")
			assert.Equal(t, tc.finish, s.finish)
			require.NotNil(t, s.usage)
			assert.Equal(t, *resp.Usage, *s.usage)
			assert.Equal(t, len(sampled), s.logprobs)
			require.Len(t, s.message.ToolCalls, len(got.Message.ToolCalls))
			for i := range s.message.ToolCalls {
				assert.Regexp(t, callIDPattern, s.message.ToolCalls[i].ID, "the id is sent once")
				s.message.ToolCalls[i].ID = got.Message.ToolCalls[i].ID // ids are fresh per reply
			}
			assert.Equal(t, got.Message, s.message)
			assert.Len(t, rec.Calls(), 2)
		})
	}
}

func TestChatStreamWithoutUsage(t *testing.T) {
	h := newHarness(t, nil)
	key, _ := h.open(t, "r")
	status, raw := h.post(t, chatPath("r"), key, map[string]any{"stream": true,
		"messages": []any{map[string]any{"role": "user", "content": "hi"}}})
	require.Equal(t, http.StatusOK, status)
	s := readChatStream(t, raw)
	assert.Nil(t, s.usage)
	assert.True(t, s.done)
	assert.Equal(t, "Hello there.", *s.message.Content)
	assert.Equal(t, 3, s.chunks, "role, content, finish")
}

// An agent's history comes back in OpenAI's shapes: content parts, an
// assistant turn of only tool calls with arguments as a JSON string, a tool
// message without a name, a developer message. The engine must get the
// same ids as the template's rendering of the equivalent messages.
func TestToolMessagesRoundTrip(t *testing.T) {
	h := newHarness(t, nil)
	key, _ := h.open(t, "r")
	body := `{"model":"m","tools":[` + string(weatherToolJSON) + `],"messages":[
		{"role":"developer","content":"Be brief."},
		{"role":"user","content":[{"type":"text","text":"Weather in"},{"type":"text","text":"Paris and Rome?"}]},
		{"role":"assistant","content":null,"refusal":null,"tool_calls":[
			{"id":"call_a","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},
			{"id":"call_b","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Rome\",\"units\":\"C\"}"}}]},
		{"role":"tool","tool_call_id":"call_a","content":"22C"},
		{"role":"tool","tool_call_id":"call_b","name":"get_weather","content":[{"type":"text","text":"25C"}]}],
		"some_future_field":{"x":1}}`
	status, raw := h.post(t, chatPath("r"), key, body)
	require.Equal(t, http.StatusOK, status, string(raw))
	want := h.render(t, []chat.Message{
		{Role: "system", Content: "Be brief."},
		{Role: "user", Content: "Weather in\nParis and Rome?"},
		{Role: "assistant", NullContent: true, ToolCalls: []chat.ToolCall{
			{ID: "call_a", Name: "get_weather", Arguments: json.RawMessage(`{"city": "Paris"}`)},
			{ID: "call_b", Name: "get_weather", Arguments: json.RawMessage(`{"city":"Rome","units":"C"}`)}}},
		{Role: "tool", ToolCallID: "call_a", Name: "get_weather", Content: "22C"},
		{Role: "tool", ToolCallID: "call_b", Name: "get_weather", Content: "25C"},
	}, []chat.Tool{weatherTool()})
	got := h.sampler.lastRequest(t).PromptIDs
	assert.Equal(t, want, got)
	// Arguments are rendered as objects (tojson), not as quoted strings.
	assert.Contains(t, h.tok.Decode(got, false), `{"name": "get_weather", "arguments": {"city": "Rome", "units": "C"}}`)
}

func TestConvertMessagesFillsToolNames(t *testing.T) {
	msgs, err := convertMessages([]wireMessage{
		{Role: "assistant", ToolCalls: []wireToolCallIn{{ID: "c1", Function: struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		}{Name: "f", Arguments: json.RawMessage(`"{}"`)}}}},
		{Role: "tool", ToolCallID: "c1", Content: json.RawMessage(`"x"`)},
		{Role: "tool", ToolCallID: "unknown", Content: json.RawMessage(`"y"`)},
	})
	require.Nil(t, err)
	assert.Equal(t, "f", msgs[1].Name)
	assert.Equal(t, "", msgs[2].Name, "a call id answered by no assistant turn leaves the name empty")
	assert.True(t, msgs[0].NullContent)
}

func TestStopStrings(t *testing.T) {
	cases := []struct {
		name    string
		stop    any
		content string
		keep    int // completion ids kept
	}{
		{name: "string", stop: "STOP", content: "abc", keep: len("abc STOP")},
		{name: "earliest of a list", stop: []string{"def", " ST"}, content: "abc", keep: len("abc ST")},
		{name: "absent", stop: []string{"zzz"}, content: "abc STOP def", keep: len("abc STOP def") + 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			key, rec := h.open(t, "r")
			h.sampler.script("abc STOP def", true)
			status, raw := h.post(t, chatPath("r"), key, map[string]any{"stop": tc.stop,
				"messages": []any{map[string]any{"role": "user", "content": "go"}}})
			require.Equal(t, http.StatusOK, status, string(raw))
			var resp clientCompletion
			require.NoError(t, json.Unmarshal(raw, &resp))
			assert.Equal(t, tc.content, *resp.Choices[0].Message.Content)
			assert.Equal(t, "stop", resp.Choices[0].FinishReason)
			call := rec.Calls()[0]
			full := append(h.tok.Encode("abc STOP def"), h.sampler.imEnd)
			assert.Equal(t, full[:tc.keep], call.CompletionIDs)
			assert.Equal(t, fakeLogprobs(tc.keep), call.Logprobs)
			assert.Equal(t, tc.keep, resp.Usage.CompletionTokens)
		})
	}
}

func ptr[T any](v T) *T { return &v }

// Concurrent calls from many rollouts share the template and tokenizer;
// within a rollout, calls are kept in dispatch order even when an earlier
// one finishes last.
func TestConcurrentCalls(t *testing.T) {
	h := newHarness(t, nil)
	release := make(chan struct{})
	h.sampler.mu.Lock()
	h.sampler.reply = func(req engine.Request) (string, bool) {
		if strings.Contains(h.tok.Decode(req.PromptIDs, false), "slow") {
			<-release
			return "slow reply", true
		}
		return "fast reply", true
	}
	h.sampler.mu.Unlock()

	key, rec := h.open(t, "ordered")
	slowDone := h.postAsync(chatPath("ordered"), key, `{"messages":[{"role":"user","content":"slow"}]}`)
	require.Eventually(t, func() bool {
		h.sampler.mu.Lock()
		defer h.sampler.mu.Unlock()
		return len(h.sampler.requests) == 1
	}, 5*time.Second, 5*time.Millisecond)
	status, _ := h.post(t, chatPath("ordered"), key, `{"messages":[{"role":"user","content":"fast"}]}`)
	require.Equal(t, http.StatusOK, status)

	const rollouts = 16
	var pending []<-chan postResult
	for i := range rollouts {
		id := fmt.Sprintf("par-%d", i)
		k, _ := h.open(t, id)
		pending = append(pending, h.postAsync(chatPath(id), k, `{"tools":[`+string(weatherToolJSON)+`],"messages":[{"role":"user","content":"hi"}]}`))
	}
	for _, p := range pending {
		res := <-p
		require.NoError(t, res.err)
		assert.Equal(t, http.StatusOK, res.status, string(res.body))
	}
	close(release)
	slow := <-slowDone
	require.NoError(t, slow.err)
	require.Equal(t, http.StatusOK, slow.status)
	calls := rec.Calls()
	require.Len(t, calls, 2)
	assert.Equal(t, h.tok.Encode("slow reply"), calls[0].CompletionIDs[:len("slow reply")], "dispatch order, not finish order")
	assert.Equal(t, h.tok.Encode("fast reply"), calls[1].CompletionIDs[:len("fast reply")])
}

// TestForceSampling: with Defaults.ForceSampling the trainer's settings
// reach the engine whatever the agent sends, and the calls that asked for
// something else are marked.
func TestForceSampling(t *testing.T) {
	trainer := engine.SamplingParams{Temperature: 1, TopP: 1, MinP: 0.1}
	cases := []struct {
		name       string
		extra      map[string]any
		overridden bool
	}{
		{name: "agent asks for greedy", extra: map[string]any{"temperature": 0}, overridden: true},
		{name: "agent asks for top_p", extra: map[string]any{"top_p": 0.5}, overridden: true},
		{name: "agent leaves sampling out", extra: map[string]any{}, overridden: false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *Options) {
				o.Defaults.Sampling = trainer
				o.Defaults.ForceSampling = true
			})
			key, rec := h.open(t, "r-1")
			h.sampler.script("Hi.", true)
			body := map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": "Hello"}}}
			for k, v := range tc.extra {
				body[k] = v
			}
			status, out := h.post(t, chatPath("r-1"), key, body)
			require.Equal(t, 200, status, string(out))
			assert.Equal(t, trainer, h.sampler.lastRequest(t).Sampling)
			calls := rec.Calls()
			require.Len(t, calls, 1)
			assert.Equal(t, trainer, calls[0].Sampling)
			assert.Equal(t, tc.overridden, calls[0].SamplingOverridden)
		})
	}
}
