// Command toyserver is a child process for the supervisor's tests where the
// libtorch worker is not built: the real serve-engine HTTP layer
// (engineserver.Server) over a tiny pure-Go sampler. It accepts the vllm serve
// command line the supervisor builds (MODEL --host H --port P ...) and the
// environment it sets (VLLM_SERVER_DEV_MODE, VLLM_ALLOW_RUNTIME_LORA_UPDATING,
// VLLM_API_KEY), ignoring flags it does not need, and exits on SIGTERM.
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
	opts := engineserver.Options{MaxModelLen: 1024, Batch: engine.BuiltinOptions{MaxBatch: 16}}
	host, port, err := parseArgs(os.Args[1:], &opts)
	if err == nil {
		// The supervisor's launch environment: dev mode, runtime LoRA, key.
		err = opts.ReadVLLMEnv(os.Getenv)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(2)
	}
	srv := engineserver.NewServer(uniformSampler{}, opts)
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

// parseArgs reads MODEL, --host, --port, --enable-lora and serve-engine's
// --emulate-vllm and --fault (through ExtraArgs); other flags are ignored.
func parseArgs(args []string, opts *engineserver.Options) (host, port string, err error) {
	host, port = "127.0.0.1", "8000"
	for i := 0; i < len(args); i++ {
		a := args[i]
		value := func() string {
			if i+1 < len(args) {
				i++
				return args[i]
			}
			return ""
		}
		switch {
		case a == "--host":
			host = value()
		case a == "--port":
			port = value()
		case a == "--enable-lora":
			opts.LoRA = true
		case a == "--emulate-vllm":
			opts.Version = value()
			if _, err := engineserver.LookupProfile(opts.Version); err != nil {
				return "", "", err
			}
		case a == "--fault":
			if err := opts.Faults.Set(value()); err != nil {
				return "", "", err
			}
		case opts.ModelName == "" && len(a) > 0 && a[0] != '-':
			opts.ModelName, opts.ModelRoot = a, a
		}
	}
	return host, port, nil
}
