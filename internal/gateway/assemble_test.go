package gateway

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAssemble(t *testing.T) {
	cases := []struct {
		name   string
		calls  []Call
		want   []Segment
		breaks int
	}{
		{name: "no calls"},
		{
			name: "two calls that extend",
			calls: []Call{
				{PromptIDs: []int32{1, 2}, CompletionIDs: []int32{3, 4}, Logprobs: []float32{-.3, -.4}, WeightVersion: 1},
				{PromptIDs: []int32{1, 2, 3, 4, 5, 6}, CompletionIDs: []int32{7}, Logprobs: []float32{-.7}, WeightVersion: 2},
			},
			want: []Segment{{Tokens: []int32{1, 2, 3, 4, 5, 6, 7}, PromptLen: 2,
				LossMask: []uint8{1, 1, 0, 0, 1}, Logprobs: []float32{-.3, -.4, 0, 0, -.7}, WeightVersions: []int{1, 2}, Calls: 2}},
		},
		{
			name: "a prompt that is exactly the previous call's tokens extends with no glue",
			calls: []Call{
				{PromptIDs: []int32{1}, CompletionIDs: []int32{2}, Logprobs: []float32{-.2}},
				{PromptIDs: []int32{1, 2}, CompletionIDs: []int32{3}, Logprobs: []float32{-.3}},
			},
			want: []Segment{{Tokens: []int32{1, 2, 3}, PromptLen: 1, LossMask: []uint8{1, 1}, Logprobs: []float32{-.2, -.3},
				WeightVersions: []int{0, 0}, Calls: 2}},
		},
		{
			name: "history rewritten",
			calls: []Call{
				{PromptIDs: []int32{1, 2}, CompletionIDs: []int32{3, 4}, Logprobs: []float32{-.3, -.4}, WeightVersion: 1},
				{PromptIDs: []int32{1, 2, 3, 9, 5}, CompletionIDs: []int32{6}, Logprobs: []float32{-.6}, WeightVersion: 1},
			},
			want: []Segment{
				{Tokens: []int32{1, 2, 3, 4}, PromptLen: 2, LossMask: []uint8{1, 1}, Logprobs: []float32{-.3, -.4}, WeightVersions: []int{1}, Calls: 1},
				{Tokens: []int32{1, 2, 3, 9, 5, 6}, PromptLen: 5, LossMask: []uint8{1}, Logprobs: []float32{-.6}, WeightVersions: []int{1}, Calls: 1},
			},
			breaks: 1,
		},
		{
			name: "three calls, break in the middle",
			calls: []Call{
				{PromptIDs: []int32{1}, CompletionIDs: []int32{2}, Logprobs: []float32{-.2}, WeightVersion: 1},
				{PromptIDs: []int32{1, 2, 3}, CompletionIDs: []int32{4}, Logprobs: []float32{-.4}, WeightVersion: 2},
				{PromptIDs: []int32{1, 5}, CompletionIDs: []int32{6, 7}, Logprobs: []float32{-.6, -.7}, WeightVersion: 3},
			},
			want: []Segment{
				{Tokens: []int32{1, 2, 3, 4}, PromptLen: 1, LossMask: []uint8{1, 0, 1}, Logprobs: []float32{-.2, 0, -.4}, WeightVersions: []int{1, 2}, Calls: 2},
				{Tokens: []int32{1, 5, 6, 7}, PromptLen: 2, LossMask: []uint8{1, 1}, Logprobs: []float32{-.6, -.7}, WeightVersions: []int{3}, Calls: 1},
			},
			breaks: 1,
		},
		{
			name: "a shorter prompt (the agent dropped the last turn) breaks",
			calls: []Call{
				{PromptIDs: []int32{1, 2}, CompletionIDs: []int32{3}, Logprobs: []float32{-.3}},
				{PromptIDs: []int32{1, 2}, CompletionIDs: []int32{4}, Logprobs: []float32{-.4}},
			},
			want: []Segment{
				{Tokens: []int32{1, 2, 3}, PromptLen: 2, LossMask: []uint8{1}, Logprobs: []float32{-.3}, WeightVersions: []int{0}, Calls: 1},
				{Tokens: []int32{1, 2, 4}, PromptLen: 2, LossMask: []uint8{1}, Logprobs: []float32{-.4}, WeightVersions: []int{0}, Calls: 1},
			},
			breaks: 1,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Assemble(tc.calls)
			assert.Equal(t, tc.want, got.Segments)
			assert.Equal(t, tc.breaks, got.PrefixBreaks)
			for _, s := range got.Segments {
				assert.Len(t, s.LossMask, len(s.Tokens)-s.PromptLen)
				assert.Len(t, s.Logprobs, len(s.Tokens)-s.PromptLen)
			}
		})
	}
	// The calls' slices are not aliased by the segments.
	calls := cases[1].calls
	seg := Assemble(calls).Segments[0]
	seg.Tokens[0] = 99
	assert.Equal(t, int32(1), calls[0].PromptIDs[0])
}

// An agent's loop through the real HTTP handler: the second request sends
// back the assistant message the gateway returned plus a tool result, and
// the template re-renders it. With the Qwen2.5 hermes template the
// re-rendering is the sampled ids whenever the model wrote its call the way
// the template writes calls (tojson: ", " and ": " separators, keys in
// order); compact JSON is re-rendered with spaces, so the prompt breaks.
func TestMultiTurnThroughHandler(t *testing.T) {
	const thinking = "<think>\nParis, so call the tool.\n</think>\n"
	cases := []struct {
		name  string
		first string // what the model samples on the first call
		// edit, if set, changes the returned message before the agent sends it back.
		edit func(msg map[string]any)
		// rerendered is "" when the history must extend token for token, else
		// the start of the re-rendered text where it leaves the sampled ids.
		rerendered string
	}{
		{name: "call written as the template writes it", first: weatherCall},
		{name: "content before the call", first: "I will look it up.\n" + weatherCall},
		{name: "thinking kept in content", first: thinking + weatherCall},
		{name: "compact JSON is canonicalized", first: "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>",
			rerendered: ` "get_weather"`},
		{name: "number re-rendered (1.50 → 1.5)", first: "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 1.50}}\n</tool_call>",
			rerendered: "}}\n</tool_call>"},
		{name: "blank line before the call is trimmed", first: "Checking.\n\n" + weatherCall, rerendered: "<tool_call>"},
		{name: "the agent drops the thinking", first: thinking + weatherCall, rerendered: "<tool_call>",
			edit: func(msg map[string]any) { msg["content"] = nil }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			key, rec := h.open(t, "agent-1")
			messages := []any{
				map[string]any{"role": "system", "content": "You answer weather questions."},
				map[string]any{"role": "user", "content": "Weather in Paris?"},
			}
			body := map[string]any{"model": "tiny-policy", "tools": []json.RawMessage{weatherToolJSON}, "messages": messages}

			h.version.Store(1)
			h.sampler.script(tc.first, true)
			status, raw := h.post(t, chatPath("agent-1"), key, body)
			require.Equal(t, http.StatusOK, status, string(raw))
			var first struct {
				Choices []struct {
					Message map[string]any `json:"message"`
				} `json:"choices"`
			}
			require.NoError(t, json.Unmarshal(raw, &first))
			reply := first.Choices[0].Message
			// What openai-python's message.model_dump() adds.
			reply["refusal"], reply["function_call"], reply["audio"] = nil, nil, nil
			if tc.edit != nil {
				tc.edit(reply)
			}
			calls := reply["tool_calls"].([]any)
			require.Len(t, calls, 1)
			callID := calls[0].(map[string]any)["id"].(string)

			h.version.Store(2)
			h.sampler.script("It is 22C in Paris.", true)
			body["messages"] = append(messages, reply, map[string]any{"role": "tool", "tool_call_id": callID, "content": "22C, sunny"})
			status, raw = h.post(t, chatPath("agent-1"), key, body)
			require.Equal(t, http.StatusOK, status, string(raw))

			recorded := rec.Calls()
			require.Len(t, recorded, 2)
			c1, c2 := recorded[0], recorded[1]
			got := Assemble(recorded)
			held := append(append([]int32{}, c1.PromptIDs...), c1.CompletionIDs...)
			if tc.rerendered != "" {
				assert.Equal(t, 1, got.PrefixBreaks)
				require.Len(t, got.Segments, 2)
				at := 0
				for at < len(held) && at < len(c2.PromptIDs) && held[at] == c2.PromptIDs[at] {
					at++
				}
				sampledText, rerenderedText := h.tok.Decode(held[at:], false), h.tok.Decode(c2.PromptIDs[at:], false)
				t.Logf("diverges at token %d: sampled %.24q, re-rendered %.24q", at, sampledText, rerenderedText)
				assert.True(t, strings.HasPrefix(rerenderedText, tc.rerendered), "re-rendered %.40q", rerenderedText)
				assert.Equal(t, c1.CompletionIDs, got.Segments[0].Tokens[got.Segments[0].PromptLen:], "the first segment keeps the sampled ids")
				return
			}
			require.Zero(t, got.PrefixBreaks, "the re-rendered history must be the sampled ids")
			require.Len(t, got.Segments, 1)
			seg := got.Segments[0]
			assert.Equal(t, append(append([]int32{}, c2.PromptIDs...), c2.CompletionIDs...), seg.Tokens)
			assert.Equal(t, len(c1.PromptIDs), seg.PromptLen)
			glue := c2.PromptIDs[len(held):]
			assert.Equal(t, "\n<|im_start|>user\n<tool_response>\n22C, sunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
				h.tok.Decode(glue, false), "the agent added only the tool turn and the next assistant header")
			var wantMask []uint8
			var wantLogprobs []float32
			for _, part := range []struct {
				n       int
				sampled []float32
			}{{len(c1.CompletionIDs), c1.Logprobs}, {len(glue), nil}, {len(c2.CompletionIDs), c2.Logprobs}} {
				for i := range part.n {
					if part.sampled == nil {
						wantMask, wantLogprobs = append(wantMask, 0), append(wantLogprobs, 0)
					} else {
						wantMask, wantLogprobs = append(wantMask, 1), append(wantLogprobs, part.sampled[i])
					}
				}
			}
			assert.Equal(t, wantMask, seg.LossMask)
			assert.Equal(t, wantLogprobs, seg.Logprobs)
			assert.Equal(t, []int{1, 2}, seg.WeightVersions)
			assert.Equal(t, 2, seg.Calls)
		})
	}
}
