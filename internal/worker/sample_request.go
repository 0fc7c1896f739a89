package worker

import "fmt"

// SampleRequest is one completion to generate.
type SampleRequest struct {
	PromptIDs    []int32
	MaxNewTokens int
	// Temperature 0 is greedy.
	Temperature float64
	TopP        float64 // 0 or 1 = off
	TopK        int     // 0 = off
	MinP        float64 // 0 = off
	StopIDs     []int32
	// Seed defines the request's own random stream, so its tokens do not
	// depend on the other requests of a batch: the k-th sampled token uses
	// u = (x >> 11) / 2^53, x the k-th 64-bit output of an mt19937 seeded
	// with Seed, and takes the smallest token id whose cumulative processed
	// probability exceeds u times the total. Sample and Decoder draw alike.
	Seed int64
}

// StopReason says why generation ended.
type StopReason int

const (
	StopToken  StopReason = 1 // a stop id was sampled (and is included)
	StopLength StopReason = 2 // MaxNewTokens reached
)

func (s StopReason) String() string {
	switch s {
	case StopToken:
		return "stop"
	case StopLength:
		return "length"
	}
	return fmt.Sprintf("StopReason(%d)", int(s))
}

// SampleResult is one generated completion: the sampled ids and the
// sampler's log-prob of each (after temperature/top-k/top-p/min-p, as
// vLLM's processed_logprobs).
type SampleResult struct {
	IDs        []int32
	Logprobs   []float32
	StopReason StopReason
}
