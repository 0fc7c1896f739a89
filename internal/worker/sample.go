//go:build cgo

package worker

/*
#include "dlapi.h"
*/
import "C"

import (
	"context"
	"fmt"
	"unsafe"
)

// Sample generates completions for a batch of requests with a KV cache.
// Each request has its own seed, so a request's sample does not depend on
// the rest of the batch beyond floating-point batching effects.
func (m *Model) Sample(ctx context.Context, reqs []SampleRequest) ([]SampleResult, error) {
	rooms := make([]int, len(reqs))
	for i, r := range reqs {
		rooms[i] = r.MaxNewTokens
	}
	return m.sample(ctx, reqs, rooms)
}

// sample generates into result buffers with room for rooms[i] tokens for
// request i; the worker checks that they hold MaxNewTokens.
func (m *Model) sample(ctx context.Context, reqs []SampleRequest, rooms []int) ([]SampleResult, error) {
	if len(reqs) == 0 {
		return nil, fmt.Errorf("sample: %w", ErrEmptyBatch)
	}
	if err := m.checkRequestsWindow(reqs); err != nil {
		return nil, fmt.Errorf("sample: %w", err)
	}
	unlock, err := m.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var ar arena
	defer ar.free()
	rp, creqs := carray[C.ort_sample_request](&ar, len(reqs))
	op, couts := carray[C.ort_sample_result](&ar, len(reqs))
	ids := make([][]int32, len(reqs))
	lps := make([][]float32, len(reqs))
	for i, r := range reqs {
		if r.MaxNewTokens < 1 {
			return nil, fmt.Errorf("sample request %d: MaxNewTokens %d must be >= 1", i, r.MaxNewTokens)
		}
		creqs[i] = csampleRequest(&ar, r)
		var idp, lpp unsafe.Pointer
		idp, ids[i] = carray[int32](&ar, rooms[i])
		lpp, lps[i] = carray[float32](&ar, rooms[i])
		couts[i].ids, couts[i].logps, couts[i].cap = (*C.int32_t)(idp), (*C.float)(lpp), C.int32_t(rooms[i])
	}
	cf := watchCancel(ctx)
	defer cf.stop()
	eb := newErrBuf()
	defer eb.free()
	err = m.call(eb, "sample", func() C.int {
		return C.ort_call_sample(m.api, m.h, (*C.ort_sample_request)(rp), C.int32_t(len(reqs)), (*C.ort_sample_result)(op), cf.p, eb.p, errLen)
	})
	if err := callErr(ctx, err); err != nil {
		return nil, err
	}
	out := make([]SampleResult, len(reqs))
	for i := range reqs {
		n := int(couts[i].n)
		out[i] = SampleResult{
			IDs: append([]int32(nil), ids[i][:n]...), Logprobs: append([]float32(nil), lps[i][:n]...),
			StopReason: StopReason(couts[i].stop_reason),
		}
	}
	return out, nil
}
