package engine

import (
	"context"
	"crypto/rand"
	"encoding/binary"

	"github.com/ortrain/ortrain/internal/worker"
)

// WorkerSampler samples with a loaded worker model: the builtin backend's
// BatchSampler, and serve-engine's.
type WorkerSampler struct{ Model *worker.Model }

// SampleBatch converts requests to the worker's and back.
func (s WorkerSampler) SampleBatch(ctx context.Context, reqs []Request) ([]Result, error) {
	wr := make([]worker.SampleRequest, len(reqs))
	for i, r := range reqs {
		wr[i] = workerRequest(r)
	}
	res, err := s.Model.Sample(ctx, wr)
	if err != nil {
		return nil, err
	}
	out := make([]Result, len(res))
	for i, r := range res {
		out[i] = Result{IDs: r.IDs, Logprobs: r.Logprobs, StopReason: stopReason(r.StopReason)}
	}
	return out, nil
}

// WorkerDecoder is the continuous builtin backend's StepDecoder: a worker
// decoder, whose KV cache is kept per Request.SessionKey. Close frees it.
type WorkerDecoder struct{ Decoder *worker.Decoder }

// Add converts requests to the worker's and prefills them.
func (d WorkerDecoder) Add(ctx context.Context, reqs []Request) ([]int64, error) {
	wr := make([]worker.DecodeRequest, len(reqs))
	for i, r := range reqs {
		wr[i] = worker.DecodeRequest{SampleRequest: workerRequest(r), CacheKey: r.SessionKey}
	}
	return d.Decoder.Add(ctx, wr)
}

// Step samples one or more tokens for every live sequence
// (worker.Decoder.Advance: several short steps per call into the worker).
func (d WorkerDecoder) Step(ctx context.Context, live int) ([]TokenEvent, error) {
	evs, err := d.Decoder.Advance(ctx, live)
	if err != nil {
		return nil, err
	}
	out := make([]TokenEvent, len(evs))
	for i, e := range evs {
		out[i] = TokenEvent{Seq: e.Seq, Token: e.Token, Logprob: e.Logprob, Done: e.Stop != 0, Stop: stopReason(e.Stop)}
	}
	return out, nil
}

// Release drops a live sequence.
func (d WorkerDecoder) Release(ctx context.Context, seq int64) error {
	return d.Decoder.Release(ctx, seq)
}

// Forget drops a session's cached keys/values.
func (d WorkerDecoder) Forget(ctx context.Context, key string) error {
	return d.Decoder.Forget(ctx, key)
}

// Close frees the decoder.
func (d WorkerDecoder) Close() error { return d.Decoder.Close() }

func workerRequest(r Request) worker.SampleRequest {
	seed := r.Seed
	if seed == 0 {
		// "0 lets the backend choose": the worker would seed its generator
		// with 0 itself, so every unseeded request of one prompt would
		// sample the same tokens (vLLM draws a fresh seed instead).
		seed = randomSeed()
	}
	return worker.SampleRequest{
		PromptIDs: r.PromptIDs, MaxNewTokens: r.MaxTokens,
		Temperature: r.Sampling.Temperature, TopP: r.Sampling.TopP, TopK: r.Sampling.TopK, MinP: r.Sampling.MinP,
		StopIDs: r.StopIDs, Seed: seed,
	}
}

// randomSeed is a positive seed from crypto/rand.
func randomSeed() int64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails on supported platforms
	if s := int64(binary.LittleEndian.Uint64(b[:]) >> 1); s != 0 {
		return s
	}
	return 1
}

func stopReason(s worker.StopReason) StopReason {
	if s == worker.StopLength {
		return StopLength
	}
	return StopToken
}
