package engine

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/worker"
)

// countingDecoder is a pure-Go StepDecoder: each sequence emits its prompt
// ids in turn (cycling) until MaxTokens, one per Step, after delay.
type countingDecoder struct {
	mu       sync.Mutex
	next     int64
	seqs     map[int64]*fakeSeq
	released []int64
	forgot   []string
	maxLive  int
	delay    time.Duration
	stepErr  error
	closed   bool
	addSizes []int
}

type fakeSeq struct {
	req Request
	n   int
}

func newCountingDecoder(delay time.Duration) *countingDecoder {
	return &countingDecoder{seqs: map[int64]*fakeSeq{}, delay: delay}
}

func (d *countingDecoder) Add(ctx context.Context, reqs []Request) ([]int64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.addSizes = append(d.addSizes, len(reqs))
	ids := make([]int64, len(reqs))
	for i, r := range reqs {
		d.next++
		d.seqs[d.next] = &fakeSeq{req: r}
		ids[i] = d.next
	}
	d.maxLive = max(d.maxLive, len(d.seqs))
	return ids, nil
}

func (d *countingDecoder) Step(ctx context.Context, live int) ([]TokenEvent, error) {
	select {
	case <-time.After(d.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stepErr != nil {
		d.seqs = map[int64]*fakeSeq{}
		return nil, d.stepErr
	}
	if live != len(d.seqs) {
		return nil, errors.New("engine's live count differs from the decoder's")
	}
	var evs []TokenEvent
	for id, s := range d.seqs {
		tok := s.req.PromptIDs[s.n%len(s.req.PromptIDs)]
		s.n++
		done := s.n >= s.req.MaxTokens
		evs = append(evs, TokenEvent{Seq: id, Token: tok, Logprob: -float32(s.n), Done: done, Stop: StopLength})
		if done {
			delete(d.seqs, id)
		}
	}
	return evs, nil
}

func (d *countingDecoder) Release(ctx context.Context, seq int64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.seqs, seq)
	d.released = append(d.released, seq)
	return nil
}

func (d *countingDecoder) Forget(ctx context.Context, key string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.forgot = append(d.forgot, key)
	return nil
}

func (d *countingDecoder) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	return nil
}

func countReq(maxTokens int, ids ...int32) Request {
	return Request{PromptIDs: ids, MaxTokens: maxTokens, Sampling: SamplingParams{Temperature: 1, TopP: 1}}
}

// TestContinuousShortRequestDoesNotWaitForLongOne: a request that joins a
// running batch gets its answer while a long request is still decoding.
func TestContinuousShortRequestDoesNotWaitForLongOne(t *testing.T) {
	d := newCountingDecoder(time.Millisecond)
	b := NewBuiltinContinuous(d, BuiltinOptions{MaxBatch: 4, Linger: time.Millisecond, Logger: zerolog.Nop()})
	t.Cleanup(func() { _ = b.Close() })

	longDone := make(chan Result, 1)
	go func() {
		r, err := b.Generate(context.Background(), countReq(400, 7))
		assert.NoError(t, err)
		longDone <- r
	}()
	time.Sleep(20 * time.Millisecond)
	short, err := b.Generate(context.Background(), countReq(3, 1, 2))
	require.NoError(t, err)
	assert.Equal(t, []int32{1, 2, 1}, short.IDs)
	assert.Equal(t, []float32{-1, -2, -3}, short.Logprobs)
	select {
	case <-longDone:
		t.Fatal("the long request finished first: the short one waited for it")
	default:
	}
	long := <-longDone
	assert.Len(t, long.IDs, 400)
	assert.Equal(t, StopLength, long.StopReason)
}

// TestContinuousManyConcurrentRequests: every caller gets its own result,
// and no more than MaxBatch sequences decode at once.
func TestContinuousManyConcurrentRequests(t *testing.T) {
	d := newCountingDecoder(0)
	b := NewBuiltinContinuous(d, BuiltinOptions{MaxBatch: 5, Linger: 5 * time.Millisecond, Logger: zerolog.Nop()})
	const n = 24
	var wg sync.WaitGroup
	res := make([]Result, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { res[i], errs[i] = b.Generate(context.Background(), countReq(1+i%7, int32(i), 1000)) })
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		want := []int32{int32(i), 1000, int32(i), 1000, int32(i), 1000, int32(i)}[:1+i%7]
		assert.Equal(t, want, res[i].IDs, "request %d", i)
	}
	require.NoError(t, b.Close())
	d.mu.Lock()
	defer d.mu.Unlock()
	assert.LessOrEqual(t, d.maxLive, 5)
	assert.True(t, d.closed, "Close closes the decoder")
}

// TestContinuousCancelDropsOnlyThatRow: a caller that gives up is released
// from the batch; the others finish.
func TestContinuousCancelDropsOnlyThatRow(t *testing.T) {
	d := newCountingDecoder(2 * time.Millisecond)
	b := NewBuiltinContinuous(d, BuiltinOptions{MaxBatch: 4, Linger: 5 * time.Millisecond, Logger: zerolog.Nop()})
	t.Cleanup(func() { _ = b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	var cancelledErr error
	wg.Go(func() { _, cancelledErr = b.Generate(ctx, countReq(10000, 3)) })
	other, err := b.Generate(context.Background(), countReq(50, 4))
	require.NoError(t, err)
	assert.Len(t, other.IDs, 50)
	wg.Wait()
	require.ErrorIs(t, cancelledErr, context.DeadlineExceeded)
	require.Eventually(t, func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return len(d.released) == 1 && len(d.seqs) == 0
	}, 5*time.Second, 5*time.Millisecond)
}

// TestContinuousStepErrorFailsLiveRequests: a failed step fails the rows
// it dropped; later requests are served.
func TestContinuousStepErrorFailsLiveRequests(t *testing.T) {
	boom := errors.New("worker exploded")
	d := newCountingDecoder(0)
	d.stepErr = boom
	b := NewBuiltinContinuous(d, BuiltinOptions{MaxBatch: 2, Logger: zerolog.Nop()})
	t.Cleanup(func() { _ = b.Close() })
	_, err := b.Generate(context.Background(), countReq(3, 1))
	require.ErrorIs(t, err, boom)
	d.mu.Lock()
	d.stepErr = nil
	d.mu.Unlock()
	r, err := b.Generate(context.Background(), countReq(2, 8))
	require.NoError(t, err)
	assert.Equal(t, []int32{8, 8}, r.IDs)

	require.NoError(t, b.EndSession(context.Background(), "rollout-1"))
	d.mu.Lock()
	assert.Equal(t, []string{"rollout-1"}, d.forgot)
	d.mu.Unlock()
	require.NoError(t, b.Close())
	_, err = b.Generate(context.Background(), countReq(2, 8))
	require.ErrorIs(t, err, ErrClosed)
}

// TestContinuousMatchesStaticOnTheWorker: over the real worker, the
// continuous engine returns the static engine's tokens for the same
// requests and seeds, greedy and sampled, with requests arriving at
// different times and sessions spanning two turns.
func TestContinuousMatchesStaticOnTheWorker(t *testing.T) {
	path, _, err := worker.FindLibrary("", os.Getenv)
	if err != nil {
		if os.Getenv("ORTRAIN_REQUIRE_WORKER") != "" {
			t.Fatalf("ORTRAIN_REQUIRE_WORKER is set but the worker library is missing: %v", err)
		}
		t.Skipf("worker library not built (run scripts/build-worker.sh): %v", err)
	}
	lib, err := worker.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { lib.Close() })
	m := loadWorkerModel(t, lib, worker.ModelOptions{Dir: tinyModel(t, 3)})
	static := NewBuiltin(WorkerSampler{Model: m}, BuiltinOptions{MaxBatch: 16, Linger: 5 * time.Millisecond, Logger: zerolog.Nop()})
	t.Cleanup(func() { _ = static.Close() })
	dec, err := m.NewDecoder(context.Background(), worker.DecoderOptions{KVCacheBudget: 1 << 30})
	require.NoError(t, err)
	cont := NewBuiltinContinuous(WorkerDecoder{Decoder: dec}, BuiltinOptions{MaxBatch: 16, Linger: 5 * time.Millisecond, Logger: zerolog.Nop()})
	t.Cleanup(func() { _ = cont.Close() })

	requests := func(rollout int, prompt []int32) Request {
		s := SamplingParams{Temperature: 1, TopP: 1}
		switch rollout % 3 {
		case 1:
			s = SamplingParams{Temperature: 0, TopP: 1}
		case 2:
			s = SamplingParams{Temperature: 0.8, TopP: 0.9, TopK: 40}
		}
		return Request{PromptIDs: prompt, MaxTokens: 6 + rollout%5, Sampling: s, StopIDs: []int32{10}, Seed: int64(1000 + rollout),
			SessionKey: "rollout-" + string(rune('a'+rollout))}
	}
	// Two turns per rollout: the second prompt extends the first turn's
	// prompt and completion with a "tool result".
	run := func(g Generator) [][]Result {
		out := make([][]Result, 8)
		var wg sync.WaitGroup
		for r := range 8 {
			wg.Go(func() {
				time.Sleep(time.Duration(r%3) * 3 * time.Millisecond)
				prompt := []int32{1, 40, 41, 42, int32(50 + r%2)}
				for turn := range 2 {
					res, err := g.Generate(context.Background(), requests(r, prompt))
					if !assert.NoError(t, err) {
						return
					}
					out[r] = append(out[r], res)
					prompt = append(append(append([]int32{}, prompt...), res.IDs...), 60, 61, int32(turn))
				}
			})
		}
		wg.Wait()
		return out
	}
	want, got := run(static), run(cont)
	for r := range want {
		for turn := range want[r] {
			assert.Equal(t, want[r][turn].IDs, got[r][turn].IDs, "rollout %d turn %d", r, turn)
			assert.Equal(t, want[r][turn].StopReason, got[r][turn].StopReason, "rollout %d turn %d", r, turn)
			assert.InDeltaSlice(t, want[r][turn].Logprobs, got[r][turn].Logprobs, 1e-5, "rollout %d turn %d", r, turn)
		}
	}
	st, err := dec.Stats(context.Background())
	require.NoError(t, err)
	assert.Positive(t, st.ReusedTokens, "second turns reused their first turn's keys/values")
	assert.Positive(t, st.SharedTokens, "identical prompts were prefilled once")
}
