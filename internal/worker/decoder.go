//go:build cgo

package worker

/*
#include <stdlib.h>
#include "dlapi.h"
*/
import "C"

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"
)

// Decoder is a running batch of sequences over a Model (continuous
// batching): Add prefills new sequences, Step samples one token for every
// live one, and a finished sequence leaves at once. Tokens are sampled as
// Model.Sample samples them (the same request and seed give the same
// tokens). Calls take the model's lock, so training and decoding
// interleave between steps. A failed Add or Step drops every live sequence.
// Close it before its model.
type Decoder struct {
	m *Model
	h *C.ort_decoder
	// stepsPerCall is Advance's step count for its next call.
	stepsPerCall atomic.Int32
}

// Advance's pacing. Every call crosses to the worker's thread and back:
// tens of microseconds, more while libtorch's pool threads spin, which was a
// quarter of a tiny model's decode step. Advance runs as many steps in one
// call as fit in advanceBudget at the last call's pace, up to
// maxStepsPerCall; a step longer than the budget runs alone, as Step.
const (
	advanceBudget   = 4 * time.Millisecond
	maxStepsPerCall = 16
)

// NewDecoder creates a decoder over m.
func (m *Model) NewDecoder(ctx context.Context, o DecoderOptions) (*Decoder, error) {
	if o.KVCacheBudget < 0 {
		return nil, fmt.Errorf("new decoder: KV cache budget %d must be >= 0 bytes", o.KVCacheBudget)
	}
	unlock, err := m.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	opts := (*C.ort_decoder_options)(C.calloc(1, C.size_t(unsafe.Sizeof(C.ort_decoder_options{}))))
	defer C.free(unsafe.Pointer(opts))
	opts.kv_cache_budget = C.int64_t(o.KVCacheBudget)
	out := (**C.ort_decoder)(C.calloc(1, C.size_t(unsafe.Sizeof(uintptr(0)))))
	defer C.free(unsafe.Pointer(out))
	eb := newErrBuf()
	defer eb.free()
	if err := m.call(eb, "new decoder", func() C.int { return C.ort_call_decoder_new(m.api, m.h, opts, out, eb.p, errLen) }); err != nil {
		return nil, err
	}
	return &Decoder{m: m, h: *out}, nil
}

// begin locks the model for one decoder call.
func (d *Decoder) begin(ctx context.Context) (func(), error) {
	unlock, err := d.m.begin(ctx)
	if err != nil {
		return nil, err
	}
	if d.h == nil {
		unlock()
		return nil, ErrClosed
	}
	return unlock, nil
}

// Add prefills reqs and returns their sequence ids, aligned with reqs.
func (d *Decoder) Add(ctx context.Context, reqs []DecodeRequest) ([]int64, error) {
	if len(reqs) == 0 {
		return nil, fmt.Errorf("decoder add: %w", ErrEmptyBatch)
	}
	sreqs := make([]SampleRequest, len(reqs))
	for i, r := range reqs {
		sreqs[i] = r.SampleRequest
	}
	if err := d.m.checkRequestsWindow(sreqs); err != nil {
		return nil, fmt.Errorf("decoder add: %w", err)
	}
	unlock, err := d.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var ar arena
	defer ar.free()
	rp, creqs := carray[C.ort_sample_request](&ar, len(reqs))
	kp, keys := carray[*C.char](&ar, len(reqs))
	ip, ids := carray[int64](&ar, len(reqs))
	for i, r := range reqs {
		if r.MaxNewTokens < 1 {
			return nil, fmt.Errorf("decode request %d: MaxNewTokens %d must be >= 1", i, r.MaxNewTokens)
		}
		creqs[i] = csampleRequest(&ar, r.SampleRequest)
		if r.CacheKey != "" {
			keys[i] = ar.cstring(r.CacheKey)
		}
	}
	cf := watchCancel(ctx)
	defer cf.stop()
	eb := newErrBuf()
	defer eb.free()
	err = d.m.call(eb, "decoder add", func() C.int {
		return C.ort_call_decoder_add(d.m.api, d.h, (*C.ort_sample_request)(rp), (**C.char)(kp), C.int32_t(len(reqs)),
			(*C.int64_t)(ip), cf.p, eb.p, errLen)
	})
	if err := callErr(ctx, err); err != nil {
		return nil, err
	}
	return append([]int64(nil), ids...), nil
}

// Step samples one token for every live sequence; events for finished
// sequences carry their stop reason. With no live sequence it returns none.
func (d *Decoder) Step(ctx context.Context, live int) ([]DecodeEvent, error) {
	return d.steps(ctx, max(live, 1))
}

// Advance is Step repeated: it samples one or more tokens for every live
// sequence (events in step order) and returns after the first step in which
// a sequence finished, so a finished sequence is answered, and a new request
// admitted, as soon as Step would. Only requests that arrive during the call
// wait longer, by at most about advanceBudget. live is the live count.
func (d *Decoder) Advance(ctx context.Context, live int) ([]DecodeEvent, error) {
	live = max(live, 1)
	n := max(int(d.stepsPerCall.Load()), 1)
	start := time.Now()
	evs, err := d.steps(ctx, live*n)
	if err != nil || len(evs) == 0 {
		return evs, err
	}
	taken := max((len(evs)+live-1)/live, 1)
	perStep := time.Since(start) / time.Duration(taken)
	d.stepsPerCall.Store(int32(min(max(int(advanceBudget/max(perStep, 1)), 1), maxStepsPerCall)))
	return evs, nil
}

// steps runs the worker's decode steps while one more fits in room events.
func (d *Decoder) steps(ctx context.Context, room int) ([]DecodeEvent, error) {
	unlock, err := d.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var ar arena
	defer ar.free()
	ep, evs := carray[C.ort_decode_event](&ar, room)
	np, n := carray[int32](&ar, 1)
	cf := watchCancel(ctx)
	defer cf.stop()
	eb := newErrBuf()
	defer eb.free()
	err = d.m.call(eb, "decoder step", func() C.int {
		return C.ort_call_decoder_step(d.m.api, d.h, (*C.ort_decode_event)(ep), C.int32_t(room), (*C.int32_t)(np), cf.p, eb.p, errLen)
	})
	if err := callErr(ctx, err); err != nil {
		return nil, err
	}
	out := make([]DecodeEvent, n[0])
	for i := range out {
		e := evs[i]
		out[i] = DecodeEvent{Seq: int64(e.seq), Token: int32(e.token), Logprob: float32(e.logp), Stop: StopReason(e.stop_reason)}
	}
	return out, nil
}

// Release drops a live sequence (its caller gave up); unknown ids are ignored.
func (d *Decoder) Release(ctx context.Context, seq int64) error {
	unlock, err := d.begin(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	eb := newErrBuf()
	defer eb.free()
	return d.m.call(eb, "decoder release", func() C.int { return C.ort_call_decoder_release(d.m.api, d.h, C.int64_t(seq), eb.p, errLen) })
}

// Forget drops the keys/values parked under key, if any.
func (d *Decoder) Forget(ctx context.Context, key string) error {
	unlock, err := d.begin(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	ck := C.CString(key)
	defer C.free(unsafe.Pointer(ck))
	eb := newErrBuf()
	defer eb.free()
	return d.m.call(eb, "decoder forget", func() C.int { return C.ort_call_decoder_forget(d.m.api, d.h, ck, eb.p, errLen) })
}

// Stats reports the decoder's counters.
func (d *Decoder) Stats(ctx context.Context) (DecoderStats, error) {
	unlock, err := d.begin(ctx)
	if err != nil {
		return DecoderStats{}, err
	}
	defer unlock()
	cs := (*C.ort_decoder_stats)(C.calloc(1, C.size_t(unsafe.Sizeof(C.ort_decoder_stats{}))))
	defer C.free(unsafe.Pointer(cs))
	eb := newErrBuf()
	defer eb.free()
	if err := d.m.call(eb, "decoder stats", func() C.int { return C.ort_call_decoder_stats(d.m.api, d.h, cs, eb.p, errLen) }); err != nil {
		return DecoderStats{}, err
	}
	return DecoderStats{
		Live: int64(cs.live), CachedEntries: int64(cs.cached_entries), CachedBytes: int64(cs.cached_bytes),
		SlotBytes: int64(cs.slot_bytes), PrefillTokens: int64(cs.prefill_tokens), ReusedTokens: int64(cs.reused_tokens),
		SharedTokens: int64(cs.shared_tokens), Evictions: int64(cs.evictions),
	}, nil
}

// Close frees the decoder's keys/values. It is safe to call twice.
func (d *Decoder) Close() error {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	if d.h == nil {
		return nil
	}
	h := d.h
	d.h = nil
	_, err := d.m.lib.run(func() C.int { C.ort_call_decoder_free(d.m.api, h); return 0 })
	return err
}

// csampleRequest copies r into C memory owned by ar; TopP 0 means off.
func csampleRequest(ar *arena, r SampleRequest) C.ort_sample_request {
	topP := r.TopP
	if topP == 0 {
		topP = 1
	}
	return C.ort_sample_request{
		prompt: (*C.int32_t)(ccopy(ar, r.PromptIDs)), prompt_len: C.int32_t(len(r.PromptIDs)),
		max_new_tokens: C.int32_t(r.MaxNewTokens), temperature: C.double(r.Temperature), top_p: C.double(topP),
		top_k: C.int32_t(r.TopK), min_p: C.double(r.MinP), stop_ids: (*C.int32_t)(ccopy(ar, r.StopIDs)),
		n_stop: C.int32_t(len(r.StopIDs)), seed: C.int64_t(r.Seed),
	}
}
