package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// BatchSampler is what the builtin backend needs from the worker: one call
// that samples a batch of requests. The results align with the requests.
type BatchSampler interface {
	SampleBatch(ctx context.Context, reqs []Request) ([]Result, error)
}

// BuiltinOptions configure request batching.
type BuiltinOptions struct {
	// MaxBatch bounds the requests merged into one worker call.
	MaxBatch int
	// Linger is how long the batcher waits for more requests once one has
	// arrived; it trades a little latency for fuller batches.
	Linger time.Duration
	// Timeout bounds one worker call.
	Timeout time.Duration
	Logger  zerolog.Logger
}

// Builtin generates with the in-process worker. Concurrent Generate calls
// from many rollouts are merged into batches; one worker call runs at a time
// (the worker is single-threaded at the API and parallel inside). Made by
// NewBuiltin it batches statically (a batch runs until its slowest request
// is done); made by NewBuiltinContinuous, requests join and leave a running
// decode batch between token steps.
type Builtin struct {
	sampler BatchSampler // static
	decoder StepDecoder  // continuous
	opts    BuiltinOptions
	queue   chan pending
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

type pending struct {
	ctx   context.Context
	req   Request
	reply chan reply
}

type reply struct {
	res Result
	err error
}

// ErrClosed is returned by Generate after Close.
var ErrClosed = errors.New("engine: generator closed")

// NewBuiltin starts the static batching loop over sampler.
func NewBuiltin(sampler BatchSampler, opts BuiltinOptions) *Builtin {
	b := newBuiltin(opts)
	b.sampler = sampler
	go b.loop()
	return b
}

func newBuiltin(opts BuiltinOptions) *Builtin {
	if opts.MaxBatch < 1 {
		opts.MaxBatch = 1
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Minute
	}
	return &Builtin{
		opts:  opts,
		queue: make(chan pending),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
}

// Generate queues req and waits for its batch to be sampled.
func (b *Builtin) Generate(ctx context.Context, req Request) (Result, error) {
	if err := req.Validate(); err != nil {
		return Result{}, err
	}
	p := pending{ctx: ctx, req: req, reply: make(chan reply, 1)}
	select {
	case b.queue <- p:
	case <-ctx.Done():
		return Result{}, ctx.Err()
	case <-b.stop:
		return Result{}, ErrClosed
	}
	select {
	case r := <-p.reply:
		return r.res, r.err
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
}

// SyncWeights is a no-op: the worker samples with the weights it trains.
func (b *Builtin) SyncWeights(ctx context.Context, step int) error { return nil }

// Close stops the batching loop; queued callers get ErrClosed.
func (b *Builtin) Close() error {
	b.once.Do(func() { close(b.stop) })
	<-b.done
	return nil
}

func (b *Builtin) loop() {
	defer close(b.done)
	for {
		var first pending
		select {
		case first = <-b.queue:
		case <-b.stop:
			return
		}
		batch := b.linger([]pending{first})
		b.run(batch)
	}
}

func (b *Builtin) run(batch []pending) {
	// Requests whose caller already gave up are dropped, not sampled.
	live := batch[:0]
	for _, p := range batch {
		if err := p.ctx.Err(); err != nil {
			p.reply <- reply{err: err}
			continue
		}
		live = append(live, p)
	}
	if len(live) == 0 {
		return
	}
	reqs := make([]Request, len(live))
	for i, p := range live {
		reqs[i] = p.req
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.Timeout)
	defer cancel()
	start := time.Now()
	res, err := b.sampler.SampleBatch(ctx, reqs)
	if err == nil && len(res) != len(reqs) {
		err = fmt.Errorf("engine: sampler returned %d results for %d requests", len(res), len(reqs))
	}
	b.opts.Logger.Debug().Int("batch", len(reqs)).Float64("took_s", time.Since(start).Round(time.Millisecond).Seconds()).Err(err).Msg("sampled batch")
	for i, p := range live {
		if err != nil {
			p.reply <- reply{err: fmt.Errorf("sample batch of %d: %w", len(reqs), err)}
			continue
		}
		p.reply <- reply{res: res[i]}
	}
}
