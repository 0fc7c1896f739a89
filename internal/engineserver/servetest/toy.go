// Package servetest is a pure-Go engineserver.Backend for tests of serve-engine's
// HTTP layer and of the vLLM backend that talks to it: a softmax over Vocab
// logits (logit(j) = slope·j) sampled with the request's seed, so log-probs
// are exact and move when the weights or the adapter change. Weights live
// in weights.json files, so reloads and adapters go through real
// directories. It imports engine only, so serve's own tests can use it.
package servetest

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/engine"
)

// Vocab is the toy model's vocabulary size.
const Vocab = 8

// Weights are the toy model's "weights": logit(j) = Slope·j (an adapter's
// Slope adds to the base's).
type Weights struct {
	Slope float64 `json:"slope"`
}

// WriteWeights writes w as dir/weights.json.
func WriteWeights(t testing.TB, dir string, w Weights) {
	t.Helper()
	b, err := json.Marshal(w)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "weights.json"), b, 0o644))
}

func readWeights(dir string) (Weights, error) {
	var w Weights
	b, err := os.ReadFile(filepath.Join(dir, "weights.json"))
	if err == nil {
		err = json.Unmarshal(b, &w)
	}
	return w, err
}

// Backend is the toy engineserver.Backend. Set Delay before requests arrive.
type Backend struct {
	// Delay holds every batch this long, to keep requests in flight.
	Delay time.Duration
	// Batches counts SampleBatch calls.
	Batches atomic.Int64

	mu       sync.Mutex
	base     Weights
	adapters map[string]Weights
	reloads  []string
}

// NewBackend returns a backend whose base weights have slope.
func NewBackend(slope float64) *Backend {
	return &Backend{base: Weights{Slope: slope}, adapters: map[string]Weights{}}
}

// SampleBatch samples every request with Sample under the base slope plus
// the adapter's.
func (b *Backend) SampleBatch(ctx context.Context, adapter string, reqs []engine.Request) ([]engine.Result, error) {
	b.Batches.Add(1)
	if b.Delay > 0 {
		select {
		case <-time.After(b.Delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	b.mu.Lock()
	slope := b.base.Slope
	if adapter != "" {
		a, ok := b.adapters[adapter]
		if !ok {
			b.mu.Unlock()
			return nil, fmt.Errorf("no adapter %q", adapter)
		}
		slope += a.Slope
	}
	b.mu.Unlock()
	out := make([]engine.Result, len(reqs))
	for i, r := range reqs {
		out[i] = Sample(r, slope)
	}
	return out, nil
}

// Sample is the toy model's reference sampler (what the builtin engine
// would return for r under slope).
func Sample(r engine.Request, slope float64) engine.Result {
	rng := rand.New(rand.NewPCG(uint64(r.Seed), 7))
	logits := make([]float64, Vocab)
	var z float64
	for j := range logits {
		logits[j] = slope * float64(j) / math.Max(r.Sampling.Temperature, 1e-6)
		z += math.Exp(logits[j])
	}
	res := engine.Result{StopReason: engine.StopLength}
	for len(res.IDs) < r.MaxTokens {
		u, acc, id := rng.Float64()*z, 0.0, Vocab-1
		for j, l := range logits {
			if acc += math.Exp(l); u < acc {
				id = j
				break
			}
		}
		res.IDs = append(res.IDs, int32(id))
		res.Logprobs = append(res.Logprobs, float32(logits[id]-math.Log(z)))
		if slices.Contains(r.StopIDs, int32(id)) {
			res.StopReason = engine.StopToken
			break
		}
	}
	return res
}

// Logprob is the toy model's log-prob of id at temperature 1.
func Logprob(slope float64, id int32) float32 {
	var z float64
	for j := range Vocab {
		z += math.Exp(slope * float64(j))
	}
	return float32(slope*float64(id) - math.Log(z))
}

// ReloadWeights replaces the base weights with dir's.
func (b *Backend) ReloadWeights(ctx context.Context, dir string) error {
	w, err := readWeights(dir)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.base = w
	b.reloads = append(b.reloads, dir)
	return nil
}

// LoadAdapter reads dir's weights as adapter name.
func (b *Backend) LoadAdapter(ctx context.Context, name, dir string) error {
	w, err := readWeights(dir)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.adapters[name] = w
	return nil
}

// UnloadAdapter forgets adapter name.
func (b *Backend) UnloadAdapter(ctx context.Context, name string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.adapters, name)
	return nil
}

// Detokenize renders id j as the letter 'a'+j.
func (b *Backend) Detokenize(ids []int32) string {
	var sb strings.Builder
	for _, id := range ids {
		sb.WriteByte(byte('a' + id))
	}
	return sb.String()
}

// Reloads are the directories ReloadWeights loaded, in order.
func (b *Backend) Reloads() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.reloads)
}

// Slope is the base weights' slope.
func (b *Backend) Slope() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.base.Slope
}

// Adapters are the names of the loaded adapters, sorted.
func (b *Backend) Adapters() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	names := make([]string, 0, len(b.adapters))
	for n := range b.adapters {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
