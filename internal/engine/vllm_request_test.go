package engine

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestVLLMRequestShape checks the JSON ortrain sends against the fields
// vllm-integration.md §2.1 names: token-id prompt, every sampling field
// explicit, logprobs 0, return_token_ids, stop ids, n.
func TestVLLMRequestShape(t *testing.T) {
	v := &VLLM{model: "policy"}
	body := v.completionRequest(Request{PromptIDs: []int32{5, 6}, MaxTokens: 32, Seed: 9, StopIDs: []int32{2},
		Sampling: SamplingParams{Temperature: 0.7, TopP: 0.9, TopK: 0, MinP: 0.05}})
	b, err := json.Marshal(body)
	require.NoError(t, err)
	assert.JSONEq(t, `{"model":"policy","prompt":[5,6],"max_tokens":32,"n":1,"temperature":0.7,"top_p":0.9,"top_k":-1,"min_p":0.05,
		"repetition_penalty":1,"presence_penalty":0,"frequency_penalty":0,"seed":9,"stop_token_ids":[2],"stop":[],
		"ignore_eos":true,"logprobs":0,"return_token_ids":true,"skip_special_tokens":false,"stream":false}`, string(b))

	// No seed: the field is left out (the server draws one); no stop ids: [].
	b, err = json.Marshal(v.completionRequest(Request{PromptIDs: []int32{1}, MaxTokens: 1, Sampling: SamplingParams{Temperature: 1, TopP: 1, TopK: 20}}))
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	assert.NotContains(t, m, "seed")
	assert.Equal(t, []any{}, m["stop_token_ids"])
	assert.Equal(t, 20.0, m["top_k"])
}
