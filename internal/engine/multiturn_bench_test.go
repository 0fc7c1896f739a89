package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/worker"
)

// BenchmarkMultiTurnEcho compares the builtin engine's static batching
// (the engine before continuous batching) with continuous batching on the
// token flow of multi-turn echo rollouts: the tiny preset's byte-level chat
// template with the echo env's tools rendered (a prompt of about 860
// tokens), G samples of each task, 3 turns each, every turn's prompt the
// previous one plus the sampled turn and a tool result. A random tiny model
// never writes a tool call, so the turns are driven here (a length-stopped
// turn is closed with the end-of-turn token) rather than by the rollout
// loop; the engine sees what a real 3-turn rollout sends it. Rounds
// alternate the modes' order. Run it with
//
//	go test -run '^$' -bench MultiTurnEcho -benchtime 1x ./internal/engine/
//
// It prints one BENCH_MULTITURN JSON line per round and a summary line with
// min/median/max generation seconds per mode and of the speedup.
func BenchmarkMultiTurnEcho(b *testing.B) {
	const (
		tasks, G, turns, maxTokens, rounds = 4, 8, 3, 16, 3
	)
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
	m, err := lib.LoadModel(context.Background(), worker.ModelOptions{Dir: dir})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	tok, err := chat.LoadTokenizer(dir)
	if err != nil {
		b.Fatal(err)
	}
	tmpl, err := tok.Template("")
	if err != nil {
		b.Fatal(err)
	}
	var tools []chat.Tool
	for _, t := range envs.Echo().Tools {
		tools = append(tools, chat.Tool{Name: t.Name, Description: t.Description, Parameters: t.InputSchema})
	}
	hint := echoHintTool()
	tools = append(tools, chat.Tool{Name: hint.name, Description: hint.desc, Parameters: hint.params})
	end, ok := tok.TokenID("<|im_end|>")
	if !ok {
		b.Fatal("tiny tokenizer has no <|im_end|>")
	}
	targets := []string{"hello", "world", "trl", "openreward"}

	// rollouts runs tasks x G three-turn conversations through g and
	// returns the wall time, the first prompt's length and the tokens
	// generated.
	rollouts := func(g Generator) (time.Duration, int, int) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		promptLen, generated := 0, 0
		start := time.Now()
		for task := range tasks {
			for s := range G {
				wg.Go(func() {
					conv, err := chat.NewConversation(tok, tmpl, fmt.Sprintf("Call the `echo` tool with text='%s' to win.", targets[task]),
						chat.ConversationOptions{System: "Answer the user.", Tools: tools})
					if err != nil {
						b.Error(err)
						return
					}
					mu.Lock()
					promptLen = len(conv.IDs())
					mu.Unlock()
					key := fmt.Sprintf("bench-%d-%d-%d", task, s, time.Now().UnixNano())
					for turn := range turns {
						res, err := g.Generate(context.Background(), Request{PromptIDs: conv.IDs(), MaxTokens: maxTokens,
							Sampling: SamplingParams{Temperature: 1, TopP: 1}, StopIDs: []int32{end}, Seed: int64(1 + task*100 + s*10 + turn), SessionKey: key})
						if err != nil {
							b.Error(err)
							return
						}
						mu.Lock()
						generated += len(res.IDs)
						mu.Unlock()
						ids := res.IDs
						if res.StopReason == StopLength {
							ids = append(slices.Clone(ids), end)
						}
						_, _ = conv.AppendSampled(ids) // a random model's turn rarely parses; the tokens are what count
						if _, err := conv.AppendMessages([]chat.Message{{Role: "tool", Content: "no match (got 'nope')", Name: "echo"}}); err != nil {
							b.Error(err)
							return
						}
					}
					if e, ok := g.(SessionEnder); ok {
						_ = e.EndSession(context.Background(), key)
					}
				})
			}
		}
		wg.Wait()
		return time.Since(start), promptLen, generated
	}
	opts := BuiltinOptions{MaxBatch: 64, Linger: 5 * time.Millisecond, Timeout: 10 * time.Minute, Logger: zerolog.Nop()}
	run := func(mode string) (time.Duration, int, int, worker.DecoderStats) {
		if mode == "static" {
			s := NewBuiltin(WorkerSampler{Model: m}, opts)
			defer s.Close()
			d, p, n := rollouts(s)
			return d, p, n, worker.DecoderStats{}
		}
		dec, err := m.NewDecoder(context.Background(), worker.DecoderOptions{KVCacheBudget: 2 << 30})
		if err != nil {
			b.Fatal(err)
		}
		c := NewBuiltinContinuous(WorkerDecoder{Decoder: dec}, opts)
		d, p, n := rollouts(c)
		st, err := dec.Stats(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		_ = c.Close()
		return d, p, n, st
	}

	for b.Loop() {
		secs := map[string][]float64{}
		var speedups []float64
		for r := range rounds {
			order := []string{"static", "continuous"}
			if r%2 == 1 {
				order = []string{"continuous", "static"}
			}
			got := map[string]float64{}
			for _, mode := range order {
				d, p, n, st := run(mode)
				got[mode] = d.Seconds()
				secs[mode] = append(secs[mode], d.Seconds())
				line, _ := json.Marshal(map[string]any{
					"round": r + 1, "mode": mode, "gen_s": d.Seconds(), "prompt_tokens": p, "generated_tokens": n,
					"rollouts": tasks * G, "turns": turns, "prefill_tokens": st.PrefillTokens, "reused_tokens": st.ReusedTokens,
					"shared_tokens": st.SharedTokens,
				})
				fmt.Println("BENCH_MULTITURN " + string(line))
			}
			speedups = append(speedups, got["static"]/got["continuous"])
		}
		summary, _ := json.Marshal(map[string]any{
			"static_gen_s": minMedMax(secs["static"]), "continuous_gen_s": minMedMax(secs["continuous"]),
			"speedup": minMedMax(speedups), "rounds": rounds, "rollouts": tasks * G, "turns": turns, "max_tokens_per_turn": maxTokens,
		})
		fmt.Println("BENCH_MULTITURN_SUMMARY " + string(summary))
		b.ReportMetric(minMedMax(secs["static"])["median"], "static_gen_s")
		b.ReportMetric(minMedMax(secs["continuous"])["median"], "continuous_gen_s")
		b.ReportMetric(minMedMax(speedups)["median"], "speedup")
	}
}

type benchTool struct {
	name, desc string
	params     json.RawMessage
}

// echoHintTool is the echo env's task-scoped hint tool (listed by
// /task_tools), rendered with the shared echo tool as a rollout does.
func echoHintTool() benchTool {
	return benchTool{name: "hint", desc: "Get a hint about how to win.", params: json.RawMessage(`{"properties":{},"title":"HintParams","type":"object"}`)}
}

func minMedMax(xs []float64) map[string]float64 {
	s := slices.Clone(xs)
	sort.Float64s(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return map[string]float64{"min": s[0], "median": med, "max": s[len(s)-1]}
}
