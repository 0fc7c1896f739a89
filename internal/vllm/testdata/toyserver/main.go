// Command toyserver is a child process for the supervisor's tests where the
// libtorch worker is not built: the real serve-engine HTTP layer
// (engineserver.Server) over a tiny pure-Go sampler. It accepts the vllm serve
// command line the supervisor builds (MODEL --host H --port P ...), ignoring
// flags it does not need, and exits on SIGTERM.
package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/engineserver"
)

const vocab = 64

// uniformSampler draws ids uniformly from a seeded generator, so its
// log-probs are exact (-ln 64) and its output depends only on the seed.
type uniformSampler struct{}

func (uniformSampler) SampleBatch(ctx context.Context, adapter string, reqs []engine.Request) ([]engine.Result, error) {
	out := make([]engine.Result, len(reqs))
	for i, r := range reqs {
		rng := rand.New(rand.NewPCG(uint64(r.Seed), uint64(len(r.PromptIDs))))
		res := engine.Result{StopReason: engine.StopLength}
		for len(res.IDs) < r.MaxTokens {
			id := int32(rng.IntN(vocab))
			res.IDs = append(res.IDs, id)
			res.Logprobs = append(res.Logprobs, float32(-math.Log(vocab)))
			if containsID(r.StopIDs, id) {
				res.StopReason = engine.StopToken
				break
			}
		}
		out[i] = res
	}
	return out, nil
}

func containsID(ids []int32, id int32) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func (uniformSampler) ReloadWeights(ctx context.Context, dir string) error     { return nil }
func (uniformSampler) LoadAdapter(ctx context.Context, name, dir string) error { return nil }
func (uniformSampler) UnloadAdapter(ctx context.Context, name string) error    { return nil }
func (uniformSampler) Detokenize(ids []int32) string                           { return fmt.Sprint(ids) }

func main() {
	args := os.Args[1:]
	model, host, port := "", "127.0.0.1", "8000"
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "--host" && i+1 < len(args):
			host, i = args[i+1], i+1
		case a == "--port" && i+1 < len(args):
			port, i = args[i+1], i+1
		case model == "" && len(a) > 0 && a[0] != '-':
			model = a
		}
	}
	srv := engineserver.NewServer(uniformSampler{}, engineserver.Options{ModelName: model, ModelRoot: model, MaxModelLen: 1024,
		Batch: engine.BuiltinOptions{MaxBatch: 16}})
	l, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		fmt.Fprintln(os.Stderr, "Error: listen:", err)
		os.Exit(1)
	}
	fmt.Println("Application startup complete.")
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	hs := &http.Server{Handler: srv}
	go hs.Serve(l)
	<-ctx.Done()
	hs.Close()
}
