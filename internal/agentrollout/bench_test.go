package agentrollout

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/gateway"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/worker"
)

// BenchmarkGatewayOverhead measures what an agent pays for the gateway:
// 32 concurrent agents each make chat calls, or Responses API calls,
// through HTTP (render, sample, parse, record, JSON) against the same calls
// made on the engine directly
// (the prompt ids rendered in-process, then Generate), on the real worker
// with the tiny model, greedy so both paths generate the same tokens.
// Rounds alternate the order; it prints BENCH_GATEWAY lines and the median
// overhead. Run it with
//
//	go test -run '^$' -bench GatewayOverhead -benchtime 1x ./internal/agentrollout/
func BenchmarkGatewayOverhead(b *testing.B) {
	const agents, callsPerAgent, maxTokens, rounds = 32, 4, 32, 9
	path, _, err := worker.FindLibrary("", os.Getenv)
	if err != nil {
		b.Skipf("worker library not built (run scripts/build-worker.sh): %v", err)
	}
	lib, err := worker.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lib.Close() })
	dir := filepath.Join(b.TempDir(), "tiny")
	preset, _ := model.PresetByName("tiny")
	if err := model.InitOverwrite(dir, preset, 1); err != nil {
		b.Fatal(err)
	}
	m, err := lib.LoadModel(context.Background(), worker.ModelOptions{Dir: dir, Threads: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	gen := engine.NewBuiltin(engine.WorkerSampler{Model: m}, engine.BuiltinOptions{MaxBatch: 64, Linger: 2 * time.Millisecond, Timeout: time.Minute, Logger: zerolog.Nop()})
	b.Cleanup(func() { gen.Close() })
	tok, err := chat.LoadTokenizer(dir)
	if err != nil {
		b.Fatal(err)
	}
	tmpl, err := tok.Template("")
	if err != nil {
		b.Fatal(err)
	}
	format, _ := chat.DetectToolCallFormat(tmpl.Source())
	greedy := engine.SamplingParams{Temperature: 0, TopP: 1}
	gw, err := gateway.New(gateway.Options{Model: "m", Tokenizer: tok, Template: tmpl, Format: format, Sampler: gen,
		Defaults: gateway.Defaults{MaxTokens: maxTokens, MaxTokensCap: maxTokens, Sampling: greedy, ForceSampling: true}, Logger: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: gw.Handler(), ReadHeaderTimeout: 10 * time.Second}
	ln, err := netListen()
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Close() })
	base := "http://" + ln.Addr().String()
	end, _ := tok.TokenID("<|im_end|>")
	prompt := func(a, c int) string { return fmt.Sprintf("Agent %d, call %d: what is the weather?", a, c) }
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: agents}}

	direct := func() (time.Duration, error) {
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, agents)
		for a := range agents {
			wg.Go(func() {
				for c := range callsPerAgent {
					text, err := tmpl.Render([]chat.Message{{Role: "user", Content: prompt(a, c)}}, nil, true, nil)
					if err != nil {
						errs <- err
						return
					}
					if _, err := gen.Generate(context.Background(), engine.Request{PromptIDs: tok.Encode(text), MaxTokens: maxTokens,
						Sampling: greedy, StopIDs: []int32{end}, SessionKey: fmt.Sprintf("d%d", a)}); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		return time.Since(start), <-errs
	}
	// bodies are the request each API sends for the same prompt.
	bodies := map[string]func(text string) (string, any){
		"chat": func(text string) (string, any) {
			return "/chat/completions", map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": text}}}
		},
		"responses": func(text string) (string, any) {
			return "/responses", map[string]any{"model": "m", "input": text}
		},
	}
	through := func(round int, api string) (time.Duration, error) {
		keys := make([]string, agents)
		for a := range agents {
			id := fmt.Sprintf("g%s%d-%d", api, round, a)
			key, _, err := gw.Open(id)
			if err != nil {
				return 0, err
			}
			keys[a] = key
			defer gw.Close(id)
		}
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, agents)
		for a := range agents {
			wg.Go(func() {
				for c := range callsPerAgent {
					route, v := bodies[api](prompt(a, c))
					body, _ := json.Marshal(v)
					req, _ := http.NewRequest(http.MethodPost, base+gateway.RolloutPath(fmt.Sprintf("g%s%d-%d", api, round, a))+route, bytes.NewReader(body))
					req.Header.Set("Authorization", "Bearer "+keys[a])
					req.Header.Set("Content-Type", "application/json")
					resp, err := client.Do(req)
					if err != nil {
						errs <- err
						return
					}
					var out struct{}
					_ = json.NewDecoder(resp.Body).Decode(&out)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						errs <- fmt.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		return time.Since(start), <-errs
	}

	overheads := map[string][]float64{}
	apis := []string{"chat", "responses"}
	for range b.N {
		for r := range rounds {
			for _, api := range apis {
				var d, g time.Duration
				var err1, err2 error
				if r%2 == 0 {
					d, err1 = direct()
					g, err2 = through(r, api)
				} else {
					g, err2 = through(r, api)
					d, err1 = direct()
				}
				if err1 != nil || err2 != nil {
					b.Fatal(err1, err2)
				}
				o := g.Seconds()/d.Seconds() - 1
				overheads[api] = append(overheads[api], o)
				fmt.Printf("BENCH_GATEWAY api=%s round=%d agents=%d calls=%d direct_s=%.3f gateway_s=%.3f overhead=%.1f%%\n",
					api, r, agents, agents*callsPerAgent, d.Seconds(), g.Seconds(), 100*o)
			}
		}
	}
	for _, api := range apis {
		list := overheads[api]
		sort.Float64s(list)
		med := list[len(list)/2]
		fmt.Printf("BENCH_GATEWAY %s median overhead %.1f%% (min %.1f%%, max %.1f%%) over %d rounds, 32 concurrent agents\n",
			api, 100*med, 100*list[0], 100*list[len(list)-1], len(list))
		b.ReportMetric(100*med, api+"_overhead_%")
	}
}

func netListen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }
