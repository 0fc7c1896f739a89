package gateway

import (
	"encoding/json"
	"net/http"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/chat"
)

func responsesPath(id string) string { return RolloutPath(id) + "/responses" }

// respWeatherTool is the weather tool as the Responses API takes it.
var respWeatherTool = json.RawMessage(`{"type":"function","name":"get_weather","description":"Current weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"strict":false}`)

var respIDPattern = regexp.MustCompile(`^resp_[0-9a-f]{32}$`)

// The client's view of a response, decoded independently of the server's
// types.
type clientResponse struct {
	ID                string  `json:"id"`
	Object            string  `json:"object"`
	Status            string  `json:"status"`
	Model             string  `json:"model"`
	Error             any     `json:"error"`
	Instructions      *string `json:"instructions"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	Output             []clientRespItem  `json:"output"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Store              bool              `json:"store"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	Tools              []json.RawMessage `json:"tools"`
	Text               json.RawMessage   `json:"text"`
	ParallelToolCalls  bool              `json:"parallel_tool_calls"`
	Temperature        float64           `json:"temperature"`
	TopP               float64           `json:"top_p"`
	MaxOutputTokens    int               `json:"max_output_tokens"`
	Usage              *struct {
		InputTokens        int `json:"input_tokens"`
		OutputTokens       int `json:"output_tokens"`
		TotalTokens        int `json:"total_tokens"`
		InputTokensDetails struct {
			CachedTokens *int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		OutputTokensDetails struct {
			ReasoningTokens *int `json:"reasoning_tokens"`
		} `json:"output_tokens_details"`
	} `json:"usage"`
}

type clientRespItem struct {
	Type    string `json:"type"`
	ID      string `json:"id"`
	Status  string `json:"status"`
	Role    string `json:"role,omitempty"`
	Content []struct {
		Type        string `json:"type"`
		Text        string `json:"text"`
		Annotations []any  `json:"annotations"`
	} `json:"content,omitempty"`
	CallID    string `json:"call_id,omitempty"`
	Name      string `json:"name,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Arguments string `json:"arguments,omitempty"`
}

// postResponse sends body and decodes a 200 reply.
func (h *harness) postResponse(tb testing.TB, id, key string, body any) (clientResponse, json.RawMessage) {
	tb.Helper()
	status, raw := h.post(tb, responsesPath(id), key, body)
	require.Equal(tb, http.StatusOK, status, string(raw))
	var resp clientResponse
	require.NoError(tb, json.Unmarshal(raw, &resp), string(raw))
	var output struct {
		Output json.RawMessage `json:"output"`
	}
	require.NoError(tb, json.Unmarshal(raw, &output))
	return resp, output.Output
}

func TestResponses(t *testing.T) {
	type wantItem struct{ typ, text, name, args string }
	user := []chat.Message{{Role: "user", Content: "Weather in Paris?"}}
	cases := []struct {
		name      string
		sample    string
		body      map[string]any
		prompt    []chat.Message
		tools     []chat.Tool
		status    string
		items     []wantItem
		finish    string
		malformed int
	}{
		{name: "string input", sample: "Hello there.", body: map[string]any{"input": "Weather in Paris?"},
			prompt: user, status: "completed", items: []wantItem{{typ: "message", text: "Hello there."}}, finish: "stop"},
		{name: "items with text parts", sample: "Hello there.", body: map[string]any{"input": []any{
			map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "Weather in"},
				map[string]any{"type": "input_text", "text": "Paris?"}}}}},
			prompt: []chat.Message{{Role: "user", Content: "Weather in\nParis?"}}, status: "completed",
			items: []wantItem{{typ: "message", text: "Hello there."}}, finish: "stop"},
		{name: "instructions, developer and skipped reasoning", sample: "Hello there.", body: map[string]any{
			"instructions": "You answer weather questions.", "input": []any{
				map[string]any{"role": "developer", "content": "Be brief."},
				map[string]any{"type": "reasoning", "id": "rs_1", "summary": []any{}, "encrypted_content": "xyz"},
				map[string]any{"role": "user", "content": "Weather in Paris?"}},
			"reasoning": map[string]any{"effort": "high"}, "include": []string{"reasoning.encrypted_content"}, "parallel_tool_calls": false,
			"store": true, "truncation": "auto", "metadata": map[string]string{"k": "v"}, "user": "u", "service_tier": "auto",
			"prompt_cache_key": "pk", "text": map[string]any{"format": map[string]any{"type": "text"}, "verbosity": "low"}},
			prompt: []chat.Message{{Role: "system", Content: "You answer weather questions."}, {Role: "system", Content: "Be brief."}, user[0]},
			status: "completed", items: []wantItem{{typ: "message", text: "Hello there."}}, finish: "stop"},
		{name: "function call", sample: weatherCall, body: map[string]any{"input": "Weather in Paris?", "tools": []any{respWeatherTool}},
			prompt: user, tools: []chat.Tool{weatherTool()}, status: "completed",
			items: []wantItem{{typ: "function_call", name: "get_weather", args: `{"city": "Paris"}`}}, finish: "tool_calls"},
		{name: "text then call", sample: "I will look it up.\n" + weatherCall, body: map[string]any{"input": "Weather in Paris?",
			"tools": []any{respWeatherTool}, "tool_choice": "required"}, prompt: user, tools: []chat.Tool{weatherTool()}, status: "completed",
			items:  []wantItem{{typ: "message", text: "I will look it up."}, {typ: "function_call", name: "get_weather", args: `{"city": "Paris"}`}},
			finish: "tool_calls"},
		{name: "tool_choice none returns the text", sample: weatherCall, body: map[string]any{"input": "Weather in Paris?",
			"tools": []any{respWeatherTool}, "tool_choice": "none"}, prompt: user, tools: []chat.Tool{weatherTool()}, status: "completed",
			items: []wantItem{{typ: "message", text: weatherCall}}, finish: "stop"},
		{name: "named function", sample: weatherCall, body: map[string]any{"input": "Weather in Paris?", "tools": []any{respWeatherTool},
			"tool_choice": map[string]any{"type": "function", "name": "get_weather"}}, prompt: user, tools: []chat.Tool{weatherTool()},
			status: "completed", items: []wantItem{{typ: "function_call", name: "get_weather", args: `{"city": "Paris"}`}}, finish: "tool_calls"},
		{name: "malformed call is returned whole", sample: "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\"\n</tool_call>",
			body: map[string]any{"input": "Weather in Paris?", "tools": []any{respWeatherTool}}, prompt: user, tools: []chat.Tool{weatherTool()},
			status: "completed", items: []wantItem{{typ: "message", text: "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\"\n</tool_call>"}},
			finish: "stop", malformed: 1},
		{name: "cut by max_output_tokens", sample: "Hello there, a long answer.", body: map[string]any{"input": "Weather in Paris?", "max_output_tokens": 5},
			prompt: user, status: "incomplete", items: []wantItem{{typ: "message", text: "Hello"}}, finish: "length"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			key, rec := h.open(t, "r")
			h.sampler.script(tc.sample, true)
			tc.body["model"] = "gpt-5-codex"
			resp, _ := h.postResponse(t, "r", key, tc.body)

			got := h.sampler.lastRequest(t)
			assert.Equal(t, h.render(t, tc.prompt, tc.tools), got.PromptIDs)
			assert.Regexp(t, respIDPattern, resp.ID)
			assert.Equal(t, "response", resp.Object)
			assert.Equal(t, "tiny-policy", resp.Model)
			assert.Nil(t, resp.Error)
			assert.Equal(t, tc.status, resp.Status)
			if tc.status == "incomplete" {
				require.NotNil(t, resp.IncompleteDetails)
				assert.Equal(t, "max_output_tokens", resp.IncompleteDetails.Reason)
			} else {
				assert.Nil(t, resp.IncompleteDetails)
			}
			require.Len(t, resp.Output, len(tc.items))
			for i, want := range tc.items {
				item := resp.Output[i]
				assert.Equal(t, want.typ, item.Type)
				switch want.typ {
				case "message":
					assert.Regexp(t, `^msg_`, item.ID)
					assert.Equal(t, "assistant", item.Role)
					assert.Equal(t, tc.status, item.Status)
					require.Len(t, item.Content, 1)
					assert.Equal(t, "output_text", item.Content[0].Type)
					assert.Equal(t, want.text, item.Content[0].Text)
					assert.NotNil(t, item.Content[0].Annotations)
				case "function_call":
					assert.Regexp(t, `^fc_`, item.ID)
					assert.Regexp(t, callIDPattern, item.CallID)
					assert.Equal(t, want.name, item.Name)
					assert.Empty(t, item.Namespace)
					assert.Equal(t, want.args, item.Arguments)
					assert.Equal(t, "completed", item.Status)
				}
			}
			calls := rec.Calls()
			require.Len(t, calls, 1)
			c := calls[0]
			assert.Equal(t, KindResponses, c.Kind)
			assert.Equal(t, got.PromptIDs, c.PromptIDs)
			assert.Equal(t, tc.finish, c.FinishReason)
			assert.Equal(t, tc.malformed, c.MalformedToolCalls)
			require.NotNil(t, resp.Usage)
			assert.Equal(t, len(c.PromptIDs), resp.Usage.InputTokens)
			assert.Equal(t, len(c.CompletionIDs), resp.Usage.OutputTokens)
			assert.Equal(t, len(c.PromptIDs)+len(c.CompletionIDs), resp.Usage.TotalTokens)
			assert.NotNil(t, resp.Usage.InputTokensDetails.CachedTokens)
			assert.NotNil(t, resp.Usage.OutputTokensDetails.ReasoningTokens)
			// The settings are echoed as the client's Response model needs them.
			assert.Equal(t, c.Sampling.Temperature, resp.Temperature)
			assert.Equal(t, c.Sampling.TopP, resp.TopP)
			assert.Len(t, resp.Tools, len(tc.tools))
			assert.NotEmpty(t, resp.ToolChoice)
			assert.NotEmpty(t, resp.Text)
			assert.True(t, resp.Store)
		})
	}
}

// An agent sends the output items back with the function's result; the
// second prompt continues the first prompt and completion token for
// token, so Assemble makes one segment.
func TestResponsesToolRoundTrip(t *testing.T) {
	cases := []struct {
		name, first string
		output      any // what function_call_output carries
	}{
		{name: "call only", first: weatherCall, output: "22C, sunny"},
		{name: "text before the call", first: "I will look it up.\n" + weatherCall, output: "22C, sunny"},
		{name: "thinking kept in the text", first: "<think>\nParis, so call the tool.\n</think>\n" + weatherCall, output: "22C, sunny"},
		{name: "output as text parts", first: weatherCall, output: []any{map[string]any{"type": "input_text", "text": "22C, sunny"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			key, rec := h.open(t, "agent")
			input := []any{map[string]any{"role": "user", "content": "Weather in Paris?"}}
			body := map[string]any{"model": "m", "instructions": "You answer weather questions.", "store": false,
				"tools": []any{respWeatherTool}, "input": input}
			h.sampler.script(tc.first, true)
			first, rawOutput := h.postResponse(t, "agent", key, body)
			call := first.Output[len(first.Output)-1]
			require.Equal(t, "function_call", call.Type)

			// The items go back as the client got them (ids, statuses,
			// annotations and all), then the result.
			var items []any
			require.NoError(t, json.Unmarshal(rawOutput, &items))
			h.sampler.script("It is 22C in Paris.", true)
			body["input"] = append(append(input, items...), map[string]any{"type": "function_call_output", "call_id": call.CallID, "output": tc.output})
			second, _ := h.postResponse(t, "agent", key, body)
			assert.Equal(t, "It is 22C in Paris.", second.Output[0].Content[0].Text)

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

// previous_response_id continues a kept conversation (its input and
// output, not its instructions); the continuation is one segment with it.
func TestResponsesPreviousResponseID(t *testing.T) {
	h := newHarness(t, nil)
	key, rec := h.open(t, "agent")
	body := map[string]any{"model": "m", "instructions": "Be brief.", "tools": []any{respWeatherTool}, "input": "Weather in Paris?"}
	h.sampler.script("I will look it up.\n"+weatherCall, true)
	first, _ := h.postResponse(t, "agent", key, body)
	call := first.Output[1]
	require.Equal(t, "function_call", call.Type)
	assert.Nil(t, first.PreviousResponseID)

	// The tool's result by previous_response_id: the tool message takes
	// its name from the kept call.
	h.sampler.script("It is 22C in Paris.", true)
	second, _ := h.postResponse(t, "agent", key, map[string]any{"model": "m", "instructions": "Be brief.", "tools": []any{respWeatherTool},
		"previous_response_id": first.ID, "input": []any{map[string]any{"type": "function_call_output", "call_id": call.CallID, "output": "22C"}}})
	require.NotNil(t, second.PreviousResponseID)
	assert.Equal(t, first.ID, *second.PreviousResponseID)

	h.sampler.script("Sunny.", true)
	third, _ := h.postResponse(t, "agent", key, map[string]any{"model": "m", "instructions": "Be brief.", "tools": []any{respWeatherTool},
		"previous_response_id": second.ID, "input": "And tomorrow?"})
	assert.Equal(t, "Sunny.", third.Output[0].Content[0].Text)

	want := h.render(t, []chat.Message{
		{Role: "system", Content: "Be brief."},
		{Role: "user", Content: "Weather in Paris?"},
		{Role: "assistant", Content: "I will look it up.", ToolCalls: []chat.ToolCall{
			{ID: call.CallID, Name: "get_weather", Arguments: json.RawMessage(`{"city": "Paris"}`)}}},
		{Role: "tool", ToolCallID: call.CallID, Name: "get_weather", Content: "22C"},
		{Role: "assistant", Content: "It is 22C in Paris."},
		{Role: "user", Content: "And tomorrow?"},
	}, []chat.Tool{weatherTool()})
	assert.Equal(t, want, h.sampler.lastRequest(t).PromptIDs)
	got := Assemble(rec.Calls())
	assert.Zero(t, got.PrefixBreaks)
	assert.Len(t, got.Segments, 1)

	// Instructions are not carried over: a continuation without them
	// renders no system message (and so starts a new segment).
	h.sampler.script("Ok.", true)
	h.postResponse(t, "agent", key, map[string]any{"model": "m", "previous_response_id": first.ID, "input": "Thanks."})
	assert.Equal(t, h.render(t, []chat.Message{
		{Role: "user", Content: "Weather in Paris?"},
		{Role: "assistant", Content: "I will look it up.", ToolCalls: []chat.ToolCall{
			{ID: call.CallID, Name: "get_weather", Arguments: json.RawMessage(`{"city": "Paris"}`)}}},
		{Role: "user", Content: "Thanks."},
	}, nil), h.sampler.lastRequest(t).PromptIDs)
}

// A response sent with store false is not kept: continuing it is OpenAI's
// previous_response_not_found, as is an id never served and one another
// rollout keeps (each tenant has its own responses).
func TestResponsesStoreFalse(t *testing.T) {
	h := newHarness(t, nil)
	key, rec := h.open(t, "r")
	first, _ := h.postResponse(t, "r", key, map[string]any{"model": "m", "input": "hi", "store": false})
	assert.False(t, first.Store)
	otherKey, _ := h.open(t, "other")
	other, _ := h.postResponse(t, "other", otherKey, map[string]any{"model": "m", "input": "hi"})
	assert.True(t, other.Store)
	for _, id := range []string{first.ID, "resp_unknown", other.ID} {
		status, raw := h.post(t, responsesPath("r"), key, map[string]any{"model": "m", "input": "again", "previous_response_id": id})
		require.Equal(t, http.StatusBadRequest, status, string(raw))
		var e clientError
		require.NoError(t, json.Unmarshal(raw, &e))
		require.NotNil(t, e.Error.Param)
		require.NotNil(t, e.Error.Code)
		assert.Equal(t, "previous_response_id", *e.Error.Param)
		assert.Equal(t, "previous_response_not_found", *e.Error.Code)
		assert.Contains(t, e.Error.Message, id)
	}
	assert.Equal(t, 3, rec.Rejected())
	assert.Len(t, rec.Calls(), 1)
}

// Hosted and custom tools are left out of the rendering and counted per
// served call; the response echoes every tool sent.
func TestResponsesDroppedTools(t *testing.T) {
	h := newHarness(t, nil)
	key, rec := h.open(t, "r")
	tools := []any{
		json.RawMessage(`{"type":"web_search","search_context_size":"low"}`),
		respWeatherTool,
		json.RawMessage(`{"type":"file_search","vector_store_ids":["vs_1"]}`),
		json.RawMessage(`{"type":"custom","name":"apply_patch","description":"Patch files","format":{"type":"grammar","syntax":"lark","definition":"start: /.+/"}}`),
		json.RawMessage(`{"type":"namespace","name":"crm","description":"CRM","tools":[{"type":"custom","name":"note","description":"n"}]}`),
		json.RawMessage(`{"type":"local_shell"}`),
	}
	body := map[string]any{"model": "m", "input": "hi", "tools": tools, "tool_choice": map[string]any{"type": "web_search_preview"}}
	var resp clientResponse
	for range 2 {
		resp, _ = h.postResponse(t, "r", key, body)
	}
	assert.Equal(t, h.render(t, []chat.Message{{Role: "user", Content: "hi"}}, []chat.Tool{weatherTool()}), h.sampler.lastRequest(t).PromptIDs)
	assert.Equal(t, 10, rec.DroppedResponseTools(), "5 per call")
	assert.Len(t, resp.Tools, len(tools))
}

// A namespace's functions (Codex's MCP tools) are offered under their
// flattened names; a call carries its namespace and own name back, and
// sent back so it renders as the model wrote it.
func TestResponsesNamespaceTools(t *testing.T) {
	h := newHarness(t, nil)
	key, rec := h.open(t, "r")
	readFile := `{"type":"function","name":"read_file","description":"Read a file","strict":false,"defer_loading":true,"parameters":{"type":"object","properties":{"path":{"type":"string"}}}}`
	tools := []any{
		json.RawMessage(`{"type":"namespace","name":"mcp__files__","description":"Files","tools":[` + readFile + `]}`),
		json.RawMessage(`{"type":"namespace","name":"crm","description":"CRM","tools":[{"type":"function","name":"lookup","parameters":null}]}`),
	}
	wantTools := []chat.Tool{
		{Name: "mcp__files__read_file", Description: "Read a file", Parameters: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}}}`)},
		{Name: "crm__lookup"},
	}
	input := []any{map[string]any{"role": "user", "content": "Read a."}}
	body := map[string]any{"model": "m", "input": input, "tools": tools}
	h.sampler.script("<tool_call>\n{\"name\": \"mcp__files__read_file\", \"arguments\": {\"path\": \"a\"}}\n</tool_call>", true)
	first, rawOutput := h.postResponse(t, "r", key, body)
	assert.Equal(t, h.render(t, []chat.Message{{Role: "user", Content: "Read a."}}, wantTools), h.sampler.lastRequest(t).PromptIDs)
	require.Len(t, first.Output, 1)
	call := first.Output[0]
	assert.Equal(t, "function_call", call.Type)
	assert.Equal(t, "read_file", call.Name)
	assert.Equal(t, "mcp__files__", call.Namespace)
	assert.JSONEq(t, `{"path": "a"}`, call.Arguments)

	var items []any
	require.NoError(t, json.Unmarshal(rawOutput, &items))
	h.sampler.script("It says hi.", true)
	body["input"] = append(append(input, items...), map[string]any{"type": "function_call_output", "call_id": call.CallID, "output": "hi"})
	h.postResponse(t, "r", key, body)
	assert.Equal(t, h.render(t, []chat.Message{
		{Role: "user", Content: "Read a."},
		{Role: "assistant", NullContent: true, ToolCalls: []chat.ToolCall{{ID: call.CallID, Name: "mcp__files__read_file", Arguments: json.RawMessage(`{"path": "a"}`)}}},
		{Role: "tool", ToolCallID: call.CallID, Name: "mcp__files__read_file", Content: "hi"},
	}, wantTools), h.sampler.lastRequest(t).PromptIDs)
	got := Assemble(rec.Calls())
	assert.Zero(t, got.PrefixBreaks)
	assert.Len(t, got.Segments, 1)
	assert.Zero(t, rec.DroppedResponseTools())
}
