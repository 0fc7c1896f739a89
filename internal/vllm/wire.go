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
	"math"
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
	TextOffset []int `json:"text_offset"`
	// TokenLogprobs is vLLM's list[float | None]: a null entry is a
	// log-prob the server did not compute, never a 0.
	TokenLogprobs []*float64           `json:"token_logprobs"`
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

// ResponseError is a 2xx completion answer that lacks what training needs:
// a choice, its token ids, its finish reason, or a log-prob per token (a
// null log-prob included). Callers must not train on such a sample.
type ResponseError struct {
	// Choice is the choice at fault (-1: the choices list itself).
	Choice int
	// Field is the response field at fault ("choices", "token_ids",
	// "finish_reason", "logprobs.token_logprobs").
	Field string
	// Token is the first token at fault (-1: the field as a whole).
	Token   int
	Problem string
}

func (e *ResponseError) Error() string {
	switch {
	case e.Choice < 0:
		return fmt.Sprintf("completion answer: %s: %s", e.Field, e.Problem)
	case e.Token < 0:
		return fmt.Sprintf("completion answer: choice %d: %s: %s", e.Choice, e.Field, e.Problem)
	}
	return fmt.Sprintf("completion answer: choice %d: %s[%d]: %s", e.Choice, e.Field, e.Token, e.Problem)
}

// Validate checks the parts of a response ortrain relies on, so a server
// that ignores return_token_ids or logprobs, or leaves a log-prob null,
// fails loudly (a *ResponseError) instead of yielding empty trajectories
// or log p = 0.
func (r *CompletionResponse) Validate(wantChoices int) error {
	if len(r.Choices) != wantChoices {
		return &ResponseError{Choice: -1, Field: "choices", Token: -1, Problem: fmt.Sprintf("%d choices, want %d", len(r.Choices), wantChoices)}
	}
	for i, c := range r.Choices {
		bad := func(field string, tok int, format string, args ...any) error {
			return &ResponseError{Choice: i, Field: field, Token: tok, Problem: fmt.Sprintf(format, args...)}
		}
		switch {
		case c.Index != i:
			return bad("index", -1, "is %d", c.Index)
		case c.FinishReason == nil:
			return bad("finish_reason", -1, "missing")
		case c.TokenIDs == nil:
			return bad("token_ids", -1, "missing: the server ignored return_token_ids (vLLM 0.10.2 or newer returns them)")
		case c.Logprobs == nil || c.Logprobs.TokenLogprobs == nil:
			return bad("logprobs.token_logprobs", -1, "missing: the server ignored logprobs=0")
		case len(c.Logprobs.TokenLogprobs) != len(c.TokenIDs):
			return bad("logprobs.token_logprobs", -1, "log-probs for %d of %d tokens", len(c.Logprobs.TokenLogprobs), len(c.TokenIDs))
		}
		for j, lp := range c.Logprobs.TokenLogprobs {
			if lp == nil {
				return bad("logprobs.token_logprobs", j, "null (token id %d): the server did not compute its log-prob", c.TokenIDs[j])
			}
			if math.IsNaN(*lp) || *lp > 0 {
				return bad("logprobs.token_logprobs", j, "%v is not a log-probability (token id %d)", *lp, c.TokenIDs[j])
			}
		}
	}
	return nil
}
