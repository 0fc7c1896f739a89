package engine

import (
	"context"
	"fmt"
	"io"
	"time"
)

// StepDecoder is what the continuous builtin backend needs from the worker:
// a running batch that sequences join (Add) and leave (when an event says
// they stopped, or Release) between token steps.
type StepDecoder interface {
	// Add prefills reqs and returns their sequence ids, aligned with reqs.
	// A failed Add drops every live sequence.
	Add(ctx context.Context, reqs []Request) ([]int64, error)
	// Step samples one or more tokens for each of the live sequences (live
	// is their count), events in step order, and returns after a step in
	// which a sequence finished. A failed Step drops every live sequence.
	Step(ctx context.Context, live int) ([]TokenEvent, error)
	// Release drops one live sequence.
	Release(ctx context.Context, seq int64) error
	// Forget drops what is cached under a session key.
	Forget(ctx context.Context, key string) error
}

// TokenEvent is one sampled token of a live sequence; Done says it was the
// sequence's last, and Stop why.
type TokenEvent struct {
	Seq     int64
	Token   int32
	Logprob float32
	Done    bool
	Stop    StopReason
}

// SessionEnder is implemented by generators that keep state per
// Request.SessionKey (the builtin continuous backend keeps a rollout's KV
// cache between turns); a rollout calls EndSession when it ends.
type SessionEnder interface {
	EndSession(ctx context.Context, key string) error
}

// NewBuiltinContinuous starts continuous batching over dec: requests join
// the running decode batch between token steps and leave as soon as they
// finish, so no request waits for the slowest one. Up to opts.MaxBatch
// sequences decode at once; more wait their turn. When the batch is idle,
// the first request waits opts.Linger for others (a group's samples arrive
// together and share one prefill). opts.Timeout bounds each Add and Step.
// Close closes dec when it is an io.Closer.
func NewBuiltinContinuous(dec StepDecoder, opts BuiltinOptions) *Builtin {
	b := newBuiltin(opts)
	b.decoder = dec
	go b.continuousLoop()
	return b
}

// EndSession drops the KV cache kept for a rollout's session key.
func (b *Builtin) EndSession(ctx context.Context, key string) error {
	if b.decoder == nil || key == "" {
		return nil
	}
	if err := b.decoder.Forget(ctx, key); err != nil {
		return fmt.Errorf("end session %s: %w", key, err)
	}
	return nil
}

// running is a request in the decode batch and what it has so far.
type running struct {
	p   pending
	res Result
}

func (b *Builtin) continuousLoop() {
	defer close(b.done)
	live := map[int64]*running{}
	var waiting []pending
	defer func() {
		for _, r := range live {
			r.p.reply <- reply{err: ErrClosed}
		}
		for _, p := range waiting {
			p.reply <- reply{err: ErrClosed}
		}
		if c, ok := b.decoder.(io.Closer); ok {
			if err := c.Close(); err != nil {
				b.opts.Logger.Warn().Err(err).Msg("close decoder")
			}
		}
	}()
	for {
		if len(live) == 0 && len(waiting) == 0 {
			select {
			case p := <-b.queue:
				waiting = b.linger(append(waiting, p))
			case <-b.stop:
				return
			}
		}
		select {
		case <-b.stop:
			return
		default:
		}
		waiting = b.drain(waiting)
		b.dropCancelled(live)
		waiting = b.admit(live, waiting)
		if len(live) > 0 {
			b.step(live)
		}
	}
}

// linger waits up to Linger for more requests (until MaxBatch) after the
// first of an idle spell, so that a group's samples are batched (static) or
// admitted and prefilled (continuous) together.
func (b *Builtin) linger(waiting []pending) []pending {
	timer := time.NewTimer(b.opts.Linger)
	defer timer.Stop()
	for len(waiting) < b.opts.MaxBatch {
		select {
		case p := <-b.queue:
			waiting = append(waiting, p)
		case <-timer.C:
			return waiting
		case <-b.stop:
			return waiting
		}
	}
	return waiting
}

// drain takes every request already queued, without waiting.
func (b *Builtin) drain(waiting []pending) []pending {
	for {
		select {
		case p := <-b.queue:
			waiting = append(waiting, p)
		default:
			return waiting
		}
	}
}

// dropCancelled releases the rows whose caller gave up; the others go on.
func (b *Builtin) dropCancelled(live map[int64]*running) {
	for seq, r := range live {
		if err := r.p.ctx.Err(); err != nil {
			r.p.reply <- reply{err: err}
			delete(live, seq)
			ctx, cancel := context.WithTimeout(context.Background(), b.opts.Timeout)
			if err := b.decoder.Release(ctx, seq); err != nil {
				b.opts.Logger.Warn().Err(err).Int64("seq", seq).Msg("release cancelled sequence")
			}
			cancel()
		}
	}
}

// admit adds waiting requests to the batch up to MaxBatch live rows.
func (b *Builtin) admit(live map[int64]*running, waiting []pending) []pending {
	var batch []pending
	rest := waiting[:0]
	for _, p := range waiting {
		switch {
		case p.ctx.Err() != nil:
			p.reply <- reply{err: p.ctx.Err()}
		case len(live)+len(batch) < b.opts.MaxBatch:
			batch = append(batch, p)
		default:
			rest = append(rest, p)
		}
	}
	if len(batch) == 0 {
		return rest
	}
	reqs := make([]Request, len(batch))
	for i, p := range batch {
		reqs[i] = p.req
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.Timeout)
	defer cancel()
	start := time.Now()
	ids, err := b.decoder.Add(ctx, reqs)
	if err == nil && len(ids) != len(reqs) {
		err = fmt.Errorf("engine: decoder returned %d ids for %d requests", len(ids), len(reqs))
	}
	b.opts.Logger.Debug().Int("admitted", len(reqs)).Int("live", len(live)).Float64("took_s", time.Since(start).Round(time.Millisecond).Seconds()).Err(err).Msg("prefilled")
	if err != nil {
		for _, p := range batch {
			p.reply <- reply{err: fmt.Errorf("prefill %d requests: %w", len(batch), err)}
		}
		b.failLive(live, fmt.Errorf("prefill of %d other requests failed: %w", len(batch), err))
		return rest
	}
	for i, p := range batch {
		live[ids[i]] = &running{p: p}
	}
	return rest
}

// step advances every live row by one or more tokens and answers the
// finished ones.
func (b *Builtin) step(live map[int64]*running) {
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.Timeout)
	defer cancel()
	evs, err := b.decoder.Step(ctx, len(live))
	if err != nil {
		b.failLive(live, fmt.Errorf("decode step of %d sequences: %w", len(live), err))
		return
	}
	for _, e := range evs {
		r, ok := live[e.Seq]
		if !ok { // released after its caller gave up
			continue
		}
		r.res.IDs = append(r.res.IDs, e.Token)
		r.res.Logprobs = append(r.res.Logprobs, e.Logprob)
		if e.Done {
			r.res.StopReason = e.Stop
			r.p.reply <- reply{res: r.res}
			delete(live, e.Seq)
		}
	}
}

func (b *Builtin) failLive(live map[int64]*running, err error) {
	for seq, r := range live {
		r.p.reply <- reply{err: err}
		delete(live, seq)
	}
}
