package gateway

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// BenchmarkGatewayOverhead compares a call through HTTP (decode, render,
// encode, sample, stop scan, parse, record, encode the reply) with calling
// the fake sampler directly, both from 32 goroutines, for chat completions
// and for the Responses API (which also keeps each response for
// previous_response_id). It reports the ratio of their wall times and the
// overhead per call.
func BenchmarkGatewayOverhead(b *testing.B) {
	h := newHarness(b, func(o *Options) { o.Logger = zerolog.Nop() })
	h.sampler.setKeep(false)
	key, _ := h.open(b, "bench")
	cases := []struct {
		name, path string
		body       []byte
	}{
		{name: "chat", path: chatPath("bench"),
			body: []byte(`{"model":"tiny-policy","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Say hello."}],"max_tokens":64}`)},
		{name: "responses", path: responsesPath("bench"),
			body: []byte(`{"model":"tiny-policy","instructions":"Be brief.","input":[{"role":"user","content":[{"type":"input_text","text":"Say hello."}]}],"max_output_tokens":64}`)},
	}
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) { benchOverhead(b, h, key, bc.path, bc.body) })
	}
}

func benchOverhead(b *testing.B, h *harness, key, path string, body []byte) {
	url := h.url + path
	// Warm up: one call, which also gives the prompt the direct path sends.
	status, raw := h.post(b, path, key, string(body))
	if status != http.StatusOK {
		b.Fatalf("warm-up: %d %s", status, raw)
	}
	h.sampler.setKeep(true)
	h.post(b, path, key, string(body))
	direct := h.sampler.lastRequest(b)
	h.sampler.setKeep(false)

	const goroutines = 32
	b.SetParallelism(max(1, goroutines/runtime.GOMAXPROCS(0)))

	// The direct cost of the same number of calls, untimed by the framework.
	b.StopTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < b.N; i += goroutines {
				if _, err := h.sampler.Generate(context.Background(), direct); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	directElapsed := time.Since(start)
	b.StartTimer()

	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			req.Header.Set("Authorization", "Bearer "+key)
			resp, err := h.client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.StopTimer()
	httpElapsed := b.Elapsed()
	n := float64(b.N)
	b.ReportMetric(float64(directElapsed.Nanoseconds())/n, "direct-ns/op")
	b.ReportMetric(float64((httpElapsed-directElapsed).Nanoseconds())/n, "overhead-ns/op")
	b.ReportMetric(float64(httpElapsed)/float64(max(directElapsed, time.Nanosecond)), "http/direct")
}
