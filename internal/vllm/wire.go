// Package vllm launches and supervises vLLM servers (one child process per
// replica, on its assigned GPUs), talks to them over the HTTP subset ortrain
// uses (health, models, token-in/token-out completions, pause/resume,
// collective_rpc reload_weights, prefix-cache reset, LoRA adapters), and
// pushes new weights after each optimizer step. The same subset is served by
// `ortrain serve-engine`, so everything here is tested without vLLM.
//
// The wire types below follow vLLM's OpenAI-compatible server
// (vllm-integration.md §2.1, §3); the server side in internal/engine uses the
// same types so both ends agree field by field.
package vllm

import (
	"encoding/json"
	"fmt"
)

// CompletionRequest is the body of POST /v1/completions. ortrain always sends
// token ids and every sampling field, so the server's generation config can
// change nothing.
type CompletionRequest struct {
	Model  string  `json:"model"`
	Prompt []int32 `json:"prompt"`
	// MaxTokens bounds the completion length.
	MaxTokens         int      `json:"max_tokens"`
	N                 int      `json:"n"`
	Temperature       float64  `json:"temperature"`
	TopP              float64  `json:"top_p"`
	TopK              int      `json:"top_k"` // -1 = off
	MinP              float64  `json:"min_p"`
	RepetitionPenalty float64  `json:"repetition_penalty"`
	PresencePenalty   float64  `json:"presence_penalty"`
	FrequencyPenalty  float64  `json:"frequency_penalty"`
	Seed              *int64   `json:"seed,omitempty"`
	StopTokenIDs      []int32  `json:"stop_token_ids"`
	Stop              []string `json:"stop"`
	// IgnoreEOS makes stop_token_ids the only stop ids, as in the builtin
	// engine; callers that want EOS to stop put it in StopTokenIDs.
	IgnoreEOS bool `json:"ignore_eos"`
	// Logprobs 0 returns the sampled token's log-prob only.
	Logprobs       *int `json:"logprobs"`
	ReturnTokenIDs bool `json:"return_token_ids"`
	// SkipSpecialTokens only shapes the text, never token_ids.
	SkipSpecialTokens bool `json:"skip_special_tokens"`
	Stream            bool `json:"stream"`
	// ReturnTokensAsTokenIDs makes logprob token strings "token_id:N".
	ReturnTokensAsTokenIDs bool `json:"return_tokens_as_token_ids,omitempty"`
}

// CompletionResponse is the non-streaming body of POST /v1/completions.
type CompletionResponse struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"` // "text_completion"
	Created int64    `json:"created"`
	Model   string   `json:"model"`
	Choices []Choice `json:"choices"`
	Usage   Usage    `json:"usage"`
}

// Choice is one sampled completion; choices come prompt-major (all n samples
// of prompt 0, then prompt 1).
type Choice struct {
	Index int    `json:"index"`
	Text  string `json:"text"`
	// Logprobs is null unless the request asked for them.
	Logprobs       *ChoiceLogprobs `json:"logprobs"`
	FinishReason   *string         `json:"finish_reason"` // "stop", "length", "abort"
	StopReason     json.RawMessage `json:"stop_reason"`   // null, a stop token id, or a stop string
	TokenIDs       []int32         `json:"token_ids"`
	PromptTokenIDs []int32         `json:"prompt_token_ids"`
	PromptLogprobs json.RawMessage `json:"prompt_logprobs"`
}

// ChoiceLogprobs are parallel arrays, one entry per generated token.
type ChoiceLogprobs struct {
	TextOffset    []int                `json:"text_offset"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	Tokens        []string             `json:"tokens"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
}

// Usage counts tokens of one completion request.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// ModelList is the body of GET /v1/models.
type ModelList struct {
	Object string      `json:"object"` // "list"
	Data   []ModelCard `json:"data"`
}

// ModelCard describes the base model or one loaded LoRA adapter (Parent is
// the base model's name for adapters).
type ModelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"` // "model"
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len,omitempty"`
}

// LoadLoRARequest is the body of POST /v1/load_lora_adapter.
type LoadLoRARequest struct {
	LoRAName    string `json:"lora_name"`
	LoRAPath    string `json:"lora_path"`
	LoadInplace bool   `json:"load_inplace,omitempty"`
}

// UnloadLoRARequest is the body of POST /v1/unload_lora_adapter.
type UnloadLoRARequest struct {
	LoRAName string `json:"lora_name"`
}

// CollectiveRPCRequest is the body of POST /collective_rpc: a worker method
// run on every worker of the server.
type CollectiveRPCRequest struct {
	Method  string         `json:"method"`
	Args    []any          `json:"args,omitempty"`
	Kwargs  map[string]any `json:"kwargs,omitempty"`
	Timeout float64        `json:"timeout,omitempty"` // seconds
}

// CollectiveRPCResponse holds one result per worker.
type CollectiveRPCResponse struct {
	Results []json.RawMessage `json:"results"`
}

// PauseResponse is the body of POST /pause and POST /resume.
type PauseResponse struct {
	Status string `json:"status"` // "paused", "resumed"
}

// IsPausedResponse is the body of GET /is_paused.
type IsPausedResponse struct {
	IsPaused bool `json:"is_paused"`
}

// ErrorResponse is vLLM's JSON error body.
type ErrorResponse struct {
	Error ErrorInfo `json:"error"`
}

// ErrorInfo describes one failed request.
type ErrorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// Pause modes of POST /pause?mode=.
const (
	PauseAbort = "abort" // abort in-flight requests (finish_reason "abort")
	PauseWait  = "wait"  // drain in-flight requests, then pause
	PauseKeep  = "keep"  // freeze in-flight requests; resume continues them
)

// Finish reasons of a Choice.
const (
	FinishStop   = "stop"
	FinishLength = "length"
	FinishAbort  = "abort"
)

// StopTokenID returns the stop token id in a choice's stop_reason, if it is
// one (it is null for EOS and a string for stop strings).
func (c Choice) StopTokenID() (int32, bool) {
	var id int32
	if len(c.StopReason) == 0 || json.Unmarshal(c.StopReason, &id) != nil {
		return 0, false
	}
	return id, true
}

// Validate checks the parts of a response ortrain relies on, so a server
// that ignores return_token_ids or logprobs fails loudly instead of yielding
// empty trajectories.
func (r *CompletionResponse) Validate(wantChoices int) error {
	if len(r.Choices) != wantChoices {
		return fmt.Errorf("completion response has %d choices, want %d", len(r.Choices), wantChoices)
	}
	for i, c := range r.Choices {
		if c.Index != i {
			return fmt.Errorf("completion choice %d has index %d", i, c.Index)
		}
		if c.FinishReason == nil {
			return fmt.Errorf("completion choice %d has no finish_reason", i)
		}
		if c.TokenIDs == nil {
			return fmt.Errorf("completion choice %d has no token_ids: the server ignored return_token_ids (vLLM >= 0.10.2 is needed)", i)
		}
		if c.Logprobs == nil || len(c.Logprobs.TokenLogprobs) != len(c.TokenIDs) {
			return fmt.Errorf("completion choice %d has log-probs for %d of %d tokens", i, lenLogprobs(c.Logprobs), len(c.TokenIDs))
		}
	}
	return nil
}

func lenLogprobs(l *ChoiceLogprobs) int {
	if l == nil {
		return 0
	}
	return len(l.TokenLogprobs)
}
