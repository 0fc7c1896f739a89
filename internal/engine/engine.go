// Package engine defines how rollouts ask for tokens: the Generator
// interface (token ids in; sampled ids, sampler log-probs and a stop reason
// out) and its backends. The builtin backend batches concurrent requests from
// many rollouts into one call of the in-process worker; the vLLM backend
// sends them to vLLM servers (or serve-engine replicas, package
// engine/serve) and pushes the trainer's weights to them.
package engine

import (
	"context"
	"fmt"
)

// SamplingParams are sent with every request, explicitly, so no server-side
// generation config can change them.
type SamplingParams struct {
	Temperature float64
	TopP        float64
	TopK        int // 0 = off
	MinP        float64
}

// Request asks for one completion continuing PromptIDs.
type Request struct {
	PromptIDs []int32
	MaxTokens int
	Sampling  SamplingParams
	// StopIDs end the completion; the stop token is included in the result.
	StopIDs []int32
	// Seed makes the request reproducible; 0 lets the backend choose.
	Seed int64
	// SessionKey (optional) names the rollout the request belongs to, the
	// same for all its turns: the builtin continuous backend keeps the
	// rollout's KV cache under it, so the next turn, whose prompt extends
	// this one's prompt and completion, prefills only the new tokens; the
	// vLLM backend sends all of them to one replica (its prefix cache).
	SessionKey string
}

// StopReason says why a completion ended.
type StopReason int

const (
	// StopToken: the model sampled one of the stop ids (it is the last id).
	StopToken StopReason = iota
	// StopLength: the completion hit MaxTokens.
	StopLength
)

func (r StopReason) String() string {
	if r == StopLength {
		return "length"
	}
	return "stop"
}

// Result is the sampled completion. Logprobs are the sampler's processed
// log-probs of each sampled id (after temperature and truncation).
type Result struct {
	IDs        []int32
	Logprobs   []float32
	StopReason StopReason
}

// InvalidResultError is a completion a server answered but that cannot be
// trained on: a null or missing log-prob or token id, a missing finish
// reason. It is never retried as a number: rollouts that meet it end with
// their own outcome (generation_invalid), counted, out of the loss.
type InvalidResultError struct {
	Server  string // the server's base URL
	Request string // which request (model, prompt length, seed, session)
	Err     error  // what was wrong (a *vllm.ResponseError)
}

func (e *InvalidResultError) Error() string {
	return fmt.Sprintf("%s answered %s with a completion ortrain cannot train on: %v", e.Server, e.Request, e.Err)
}

func (e *InvalidResultError) Unwrap() error { return e.Err }

// Generator produces completions. Implementations are safe for concurrent
// use; each call is bounded by its context.
type Generator interface {
	Generate(ctx context.Context, req Request) (Result, error)
	// SyncWeights makes the next generations use the trainer's newest
	// weights (builtin: nothing to do; vLLM: reload or load an adapter).
	SyncWeights(ctx context.Context, step int) error
	Close() error
}

// Validate checks a request before it reaches a backend.
func (r Request) Validate() error {
	switch {
	case len(r.PromptIDs) == 0:
		return fmt.Errorf("generate: empty prompt")
	case r.MaxTokens < 1:
		return fmt.Errorf("generate: max tokens %d must be at least 1", r.MaxTokens)
	case r.Sampling.Temperature < 0:
		return fmt.Errorf("generate: temperature %v must be >= 0", r.Sampling.Temperature)
	case !(r.Sampling.TopP > 0 && r.Sampling.TopP <= 1):
		return fmt.Errorf("generate: top_p %v must be in (0, 1]", r.Sampling.TopP)
	}
	return nil
}
