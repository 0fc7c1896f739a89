package engine

import (
	"context"

	"github.com/ortrain/ortrain/internal/worker"
)

// WorkerSampler samples with a loaded worker model: the builtin backend's
// BatchSampler, and serve-engine's.
type WorkerSampler struct{ Model *worker.Model }

// SampleBatch converts requests to the worker's and back.
func (s WorkerSampler) SampleBatch(ctx context.Context, reqs []Request) ([]Result, error) {
	wr := make([]worker.SampleRequest, len(reqs))
	for i, r := range reqs {
		wr[i] = worker.SampleRequest{
			PromptIDs: r.PromptIDs, MaxNewTokens: r.MaxTokens,
			Temperature: r.Sampling.Temperature, TopP: r.Sampling.TopP, TopK: r.Sampling.TopK, MinP: r.Sampling.MinP,
			StopIDs: r.StopIDs, Seed: r.Seed,
		}
	}
	res, err := s.Model.Sample(ctx, wr)
	if err != nil {
		return nil, err
	}
	out := make([]Result, len(res))
	for i, r := range res {
		stop := StopToken
		if r.StopReason == worker.StopLength {
			stop = StopLength
		}
		out[i] = Result{IDs: r.IDs, Logprobs: r.Logprobs, StopReason: stop}
	}
	return out, nil
}
