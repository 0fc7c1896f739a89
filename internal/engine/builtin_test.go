package engine

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// echoSampler answers each request with its prompt reversed and records
// batch sizes; it is a pure-Go stand-in for the worker.
type echoSampler struct {
	mu      sync.Mutex
	batches []int
	delay   time.Duration
	err     error
}

func (s *echoSampler) SampleBatch(ctx context.Context, reqs []Request) ([]Result, error) {
	s.mu.Lock()
	s.batches = append(s.batches, len(reqs))
	s.mu.Unlock()
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if s.err != nil {
		return nil, s.err
	}
	out := make([]Result, len(reqs))
	for i, r := range reqs {
		ids := make([]int32, len(r.PromptIDs))
		for j, id := range r.PromptIDs {
			ids[len(ids)-1-j] = id
		}
		out[i] = Result{IDs: ids, Logprobs: make([]float32, len(ids)), StopReason: StopLength}
	}
	return out, nil
}

func req(ids ...int32) Request {
	return Request{PromptIDs: ids, MaxTokens: 4, Sampling: SamplingParams{Temperature: 1, TopP: 1}}
}

func TestBuiltinBatchesConcurrentRequests(t *testing.T) {
	s := &echoSampler{delay: 20 * time.Millisecond}
	b := NewBuiltin(s, BuiltinOptions{MaxBatch: 8, Linger: 50 * time.Millisecond, Logger: zerolog.Nop()})
	t.Cleanup(func() { _ = b.Close() })

	const n = 16
	var wg sync.WaitGroup
	results := make([]Result, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = b.Generate(context.Background(), req(int32(i), 100, 200))
		}()
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		assert.Equal(t, []int32{200, 100, int32(i)}, results[i].IDs, "request %d got its own result", i)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	total := 0
	for _, sz := range s.batches {
		assert.LessOrEqual(t, sz, 8)
		total += sz
	}
	assert.Equal(t, n, total)
	assert.Less(t, len(s.batches), n, "requests were merged into batches")
}

func TestBuiltinErrorsAndCancel(t *testing.T) {
	boom := errors.New("worker exploded")
	b := NewBuiltin(&echoSampler{err: boom}, BuiltinOptions{MaxBatch: 4})
	_, err := b.Generate(context.Background(), req(1))
	require.ErrorIs(t, err, boom)

	_, err = b.Generate(context.Background(), Request{MaxTokens: 1, Sampling: SamplingParams{TopP: 1}})
	require.ErrorContains(t, err, "empty prompt")
	require.NoError(t, b.Close())
	_, err = b.Generate(context.Background(), req(1))
	require.ErrorIs(t, err, ErrClosed)

	slow := NewBuiltin(&echoSampler{delay: time.Second}, BuiltinOptions{MaxBatch: 1})
	t.Cleanup(func() { _ = slow.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = slow.Generate(ctx, req(1))
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestBuiltinCallTimeout(t *testing.T) {
	b := NewBuiltin(&echoSampler{delay: time.Second}, BuiltinOptions{MaxBatch: 1, Timeout: 30 * time.Millisecond})
	t.Cleanup(func() { _ = b.Close() })
	_, err := b.Generate(context.Background(), req(1))
	require.ErrorIs(t, err, context.DeadlineExceeded)
}
