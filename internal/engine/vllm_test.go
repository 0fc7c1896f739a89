package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/engineserver"
	"github.com/ortrain/ortrain/internal/engineserver/servetest"
	"github.com/ortrain/ortrain/internal/vllm"
)

// flakyHandler fails the first n completions with 500, then passes through.
type flakyHandler struct {
	next  http.Handler
	fails atomic.Int64
	hits  atomic.Int64
}

func (f *flakyHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/completions" {
		f.hits.Add(1)
		if f.fails.Add(-1) >= 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			_ = json.NewEncoder(w).Encode(vllm.ErrorResponse{Error: vllm.ErrorInfo{Message: "engine hiccup", Type: "InternalServerError", Code: 500}})
			return
		}
	}
	f.next.ServeHTTP(w, r)
}

// toyReplica is an in-process serve-engine over the toy backend, behind a
// handler that can inject 500s, with a switchable readiness. It runs as
// ortrain launches replicas: dev mode on, runtime LoRA updating with LoRA.
type toyReplica struct {
	*httptest.Server
	backend *servetest.Backend
	flaky   *flakyHandler
	ready   atomic.Bool
}

func (r *toyReplica) URL() string { return r.Server.URL }
func (r *toyReplica) Ready() bool { return r.ready.Load() }

func startToyReplica(t testing.TB, slope float64, lora bool) *toyReplica {
	backend := servetest.NewBackend(slope)
	srv := engineserver.NewServer(backend, engineserver.Options{ModelName: "toy", ModelRoot: "/models/toy", MaxModelLen: 256, LoRA: lora,
		RuntimeLoRA: lora, DevMode: true, Batch: engine.BuiltinOptions{MaxBatch: 16, Linger: time.Millisecond}})
	r := &toyReplica{backend: backend, flaky: &flakyHandler{next: srv}}
	r.Server = httptest.NewServer(r.flaky)
	r.ready.Store(true)
	t.Cleanup(func() { r.Server.Close(); srv.Close() })
	return r
}

func toyRequest(seed int64) engine.Request {
	return engine.Request{PromptIDs: []int32{1, 2}, MaxTokens: 6, Seed: seed, Sampling: engine.SamplingParams{Temperature: 1, TopP: 1}}
}

func newTestVLLM(t *testing.T, mode engine.SyncMode, export engine.WeightExporter, eps ...vllm.Endpoint) *engine.VLLM {
	t.Helper()
	v, err := engine.NewVLLM(context.Background(), engine.VLLMOptions{Endpoints: eps, SyncMode: mode, SyncDir: t.TempDir(), Export: export,
		Timeout: 20 * time.Second, RetryBase: 5 * time.Millisecond, RetryCap: 50 * time.Millisecond,
		Logger: zerolog.New(zerolog.NewTestWriter(t))})
	require.NoError(t, err)
	t.Cleanup(func() { v.Close() })
	return v
}

// TestVLLMGenerateMatchesReferenceAndBalances: results equal the reference
// sampler for the same seed, and concurrent requests spread over replicas.
func TestVLLMGenerateMatchesReferenceAndBalances(t *testing.T) {
	r0, r1 := startToyReplica(t, 0.4, false), startToyReplica(t, 0.4, false)
	v := newTestVLLM(t, engine.SyncNone, nil, r0, r1)
	assert.Equal(t, "toy", v.Model())
	r0.backend.Delay, r1.backend.Delay = 20*time.Millisecond, 20*time.Millisecond
	var wg sync.WaitGroup
	for seed := int64(1); seed <= 40; seed++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := v.Generate(context.Background(), toyRequest(seed))
			require.NoError(t, err)
			assert.Equal(t, servetest.Sample(toyRequest(seed), 0.4), got, "seed %d", seed)
		}()
	}
	wg.Wait()
	h0, h1 := r0.flaky.hits.Load(), r1.flaky.hits.Load()
	assert.Equal(t, int64(40), h0+h1-2, "40 requests plus one probe each")
	assert.Greater(t, h0, int64(8), "replica 0 got a share")
	assert.Greater(t, h1, int64(8), "replica 1 got a share")
}

// TestVLLMRetries: 5xx answers, a dead replica and a replica that is
// restarting (not ready) do not fail a request.
func TestVLLMRetries(t *testing.T) {
	r0, r1 := startToyReplica(t, 0.2, false), startToyReplica(t, 0.2, false)
	v := newTestVLLM(t, engine.SyncNone, nil, r0, r1)
	r0.flaky.fails.Store(3)
	r1.flaky.fails.Store(3)
	got, err := v.Generate(context.Background(), toyRequest(5))
	require.NoError(t, err)
	assert.Equal(t, servetest.Sample(toyRequest(5), 0.2), got)

	// Replica 1 dies (connection refused) while still marked ready.
	r1.Server.Close()
	for seed := int64(1); seed <= 5; seed++ {
		_, err := v.Generate(context.Background(), toyRequest(seed))
		require.NoError(t, err)
	}

	// No replica ready: requests wait for one to come back.
	r0.ready.Store(false)
	r1.ready.Store(false)
	go func() { time.Sleep(200 * time.Millisecond); r0.ready.Store(true) }()
	start := time.Now()
	_, err = v.Generate(context.Background(), toyRequest(9))
	require.NoError(t, err)
	assert.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond)

	// A 400 is not retried.
	_, err = v.Generate(context.Background(), engine.Request{PromptIDs: []int32{1}, MaxTokens: 1000, Sampling: engine.SamplingParams{Temperature: 1, TopP: 1}})
	var se *vllm.StatusError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, 400, se.Code)

	// The deadline bounds retries.
	r0.flaky.fails.Store(1 << 30)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = v.Generate(ctx, toyRequest(1))
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "engine hiccup")
}

// exportSlope returns an exporter that writes weights.json with the slope
// of the version: 0 for the push at start (the trainer's initial weights,
// which the replicas already hold), then 1.0, 2.0, ...; a sync (not the
// push at start) can be held to keep it busy.
func exportSlope(hold chan struct{}) (engine.WeightExporter, *atomic.Int64) {
	var n atomic.Int64
	return func(ctx context.Context, dir string) error {
		k := n.Add(1) - 1
		if hold != nil && k > 0 {
			<-hold
		}
		b, _ := json.Marshal(servetest.Weights{Slope: float64(k)})
		return os.WriteFile(filepath.Join(dir, "weights.json"), b, 0o644)
	}, &n
}

// TestVLLMSyncFull: after a sync every replica has reloaded the new
// directory and log-probs are the new weights'; requests issued during the
// sync wait and are served with the new weights; old versions are pruned.
func TestVLLMSyncFull(t *testing.T) {
	r0, r1 := startToyReplica(t, 0, false), startToyReplica(t, 0, false)
	hold := make(chan struct{})
	export, _ := exportSlope(hold)
	v := newTestVLLM(t, engine.SyncFull, export, r0, r1)

	before, err := v.Generate(context.Background(), toyRequest(3))
	require.NoError(t, err)
	assert.Equal(t, servetest.Sample(toyRequest(3), 0), before)

	syncDone := make(chan error, 1)
	go func() { syncDone <- v.SyncWeights(context.Background(), 1) }()
	require.Eventually(t, func() bool { return v.SyncPaused() }, 5*time.Second, time.Millisecond)
	results := make(chan engine.Result, 8)
	for seed := int64(10); seed < 18; seed++ {
		go func() {
			res, err := v.Generate(context.Background(), toyRequest(seed))
			assert.NoError(t, err)
			results <- res
		}()
	}
	time.Sleep(100 * time.Millisecond)
	assert.Empty(t, results, "requests wait while weights are pushed")
	close(hold)
	require.NoError(t, <-syncDone)
	for range 8 {
		res := <-results
		// Served by the new weights (slope 1): log-probs of slope 1.
		assert.InDelta(t, float64(servetest.Logprob(1, res.IDs[0])), float64(res.Logprobs[0]), 1e-6)
	}
	after, err := v.Generate(context.Background(), toyRequest(3))
	require.NoError(t, err)
	assert.Equal(t, servetest.Sample(toyRequest(3), 1), after)
	assert.NotEqual(t, before.Logprobs, after.Logprobs)

	st := v.LastSync()
	assert.Equal(t, 1, st.Version)
	assert.Equal(t, "toy", st.Model)
	assert.Greater(t, st.Duration, 100*time.Millisecond)
	for _, r := range []*toyReplica{r0, r1} {
		assert.Equal(t, []string{filepath.Join(v.SyncDir(), "policy-v0"), st.Dir}, r.backend.Reloads(), "the push at start, then step 1's")
		paused, err := vllmClient(t, r.URL()).IsPaused(context.Background())
		require.NoError(t, err)
		assert.False(t, paused, "replicas are resumed")
	}

	for step := 2; step <= 4; step++ {
		require.NoError(t, v.SyncWeights(context.Background(), step))
	}
	assert.Equal(t, []string{"policy-v3", "policy-v4"}, dirNames(t, v.SyncDir()), "older versions and temp dirs are removed")
	got, err := v.Generate(context.Background(), toyRequest(3))
	require.NoError(t, err)
	assert.Equal(t, servetest.Sample(toyRequest(3), 4), got)
}

func dirNames(t *testing.T, dir string) []string {
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

func vllmClient(t *testing.T, url string) *vllm.Client {
	c, err := vllm.NewClient(url, nil)
	require.NoError(t, err)
	return c
}

// TestVLLMSyncLoRA: each sync loads a fresh policy-vN on every replica,
// generation switches to it, and the previous adapter is unloaded.
func TestVLLMSyncLoRA(t *testing.T) {
	r0, r1 := startToyReplica(t, 0.5, true), startToyReplica(t, 0.5, true)
	export, _ := exportSlope(nil)
	v := newTestVLLM(t, engine.SyncLoRA, export, r0, r1)
	require.NoError(t, v.SyncWeights(context.Background(), 1))
	assert.Equal(t, "policy-v1", v.Model())
	got, err := v.Generate(context.Background(), toyRequest(4))
	require.NoError(t, err)
	assert.Equal(t, servetest.Sample(toyRequest(4), 0.5+1), got, "base + adapter v1")

	require.NoError(t, v.SyncWeights(context.Background(), 2))
	assert.Equal(t, "policy-v2", v.Model())
	got, err = v.Generate(context.Background(), toyRequest(4))
	require.NoError(t, err)
	assert.Equal(t, servetest.Sample(toyRequest(4), 0.5+2), got, "base + adapter v2")
	for _, r := range []*toyReplica{r0, r1} {
		models, err := vllmClient(t, r.URL()).Models(context.Background())
		require.NoError(t, err)
		var ids []string
		for _, c := range models.Data {
			ids = append(ids, c.ID)
		}
		assert.Equal(t, []string{"toy", "policy-v2"}, ids, "policy-v1 was unloaded")
	}
}

// TestVLLMRestartHookPushesNewestWeights: a replica that restarts from the
// original model gets the newest version before it serves.
func TestVLLMRestartHookPushesNewestWeights(t *testing.T) {
	for _, mode := range []engine.SyncMode{engine.SyncFull, engine.SyncLoRA} {
		r0 := startToyReplica(t, 0, mode == engine.SyncLoRA)
		export, _ := exportSlope(nil)
		v := newTestVLLM(t, mode, export, r0)
		fresh := startToyReplica(t, 0, mode == engine.SyncLoRA)
		require.NoError(t, v.AfterStart(context.Background(), 0, vllmClient(t, fresh.URL())), "before the first sync: the weights pushed at start")
		if mode == engine.SyncFull {
			assert.Equal(t, []string{filepath.Join(v.SyncDir(), "policy-v0")}, fresh.backend.Reloads())
		} else {
			assert.Contains(t, fresh.backend.Adapters(), "policy-v0")
		}
		require.NoError(t, v.SyncWeights(context.Background(), 1))
		require.NoError(t, v.AfterStart(context.Background(), 0, vllmClient(t, fresh.URL())))
		if mode == engine.SyncFull {
			assert.Equal(t, v.LastSync().Dir, fresh.backend.Reloads()[len(fresh.backend.Reloads())-1])
		} else {
			assert.Contains(t, fresh.backend.Adapters(), "policy-v1")
		}
	}
}

func TestVLLMProbeRefusesMissingCapabilities(t *testing.T) {
	r := startToyReplica(t, 0, false)
	_, err := engine.NewVLLM(context.Background(), engine.VLLMOptions{Endpoints: []vllm.Endpoint{r}, SyncMode: engine.SyncLoRA, SyncDir: t.TempDir(),
		Export: func(context.Context, string) error { return nil }})
	var ce *vllm.CapabilityError
	require.ErrorAs(t, err, &ce)
	assert.Contains(t, err.Error(), "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1")

	// A server that ignores return_token_ids (vLLM older than 0.10.2).
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case "/v1/models":
			_ = json.NewEncoder(w).Encode(vllm.ModelList{Object: "list", Data: []vllm.ModelCard{{ID: "old"}}})
		case "/v1/completions":
			w.Write([]byte(`{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":"length","logprobs":{"tokens":["x"],"token_logprobs":[-1],"text_offset":[0],"top_logprobs":[{"x":-1}]}}]}`))
		}
	}))
	t.Cleanup(old.Close)
	_, err = engine.NewVLLM(context.Background(), engine.VLLMOptions{Endpoints: []vllm.Endpoint{vllm.StaticEndpoint(old.URL)}, SyncMode: engine.SyncNone})
	require.ErrorAs(t, err, &ce)
	assert.Contains(t, err.Error(), "0.10.2")

	_, err = engine.NewVLLM(context.Background(), engine.VLLMOptions{SyncMode: engine.SyncFull})
	assert.Error(t, err)
	_, err = engine.NewVLLM(context.Background(), engine.VLLMOptions{GPUs: vllm.GPUPlan{GPUs: []int{1}, TrainerGPUs: []int{1}}, SyncMode: engine.SyncNone})
	var ge *vllm.GPUAssignmentError
	require.ErrorAs(t, err, &ge)
	_, err = engine.NewVLLM(context.Background(), engine.VLLMOptions{URLs: []string{"localhost:8000"}, SyncMode: engine.SyncNone})
	assert.ErrorContains(t, err, "engine.vllm_urls[0]")
	assert.False(t, errors.Is(err, context.Canceled))
}

// TestVLLMSyncWhileReplicaRestarts: a request in flight waits for a
// restarting replica while a sync drains requests; the replica's restart
// hook must not wait for that sync (which would deadlock until timeouts).
func TestVLLMSyncWhileReplicaRestarts(t *testing.T) {
	r0 := startToyReplica(t, 0, false)
	export, _ := exportSlope(nil)
	v := newTestVLLM(t, engine.SyncFull, export, r0)
	r0.ready.Store(false) // restarting
	genDone := make(chan error, 1)
	go func() { _, err := v.Generate(context.Background(), toyRequest(1)); genDone <- err }()
	time.Sleep(50 * time.Millisecond)
	syncDone := make(chan error, 1)
	go func() { syncDone <- v.SyncWeights(context.Background(), 1) }()
	require.Eventually(t, func() bool { return v.SyncPaused() }, 5*time.Second, time.Millisecond)

	hookDone := make(chan error, 1)
	go func() { hookDone <- v.AfterStart(context.Background(), 0, vllmClient(t, r0.URL())) }()
	select {
	case err := <-hookDone:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("restart hook blocked behind a draining sync")
	}
	r0.ready.Store(true) // the supervisor marks it ready after the hook
	require.NoError(t, <-genDone)
	require.NoError(t, <-syncDone)
	got, err := v.Generate(context.Background(), toyRequest(2))
	require.NoError(t, err)
	assert.Equal(t, servetest.Sample(toyRequest(2), 1), got)
}

// BenchmarkVLLMGenerateToy measures the HTTP path's overhead per request
// (two in-process replicas over the toy sampler, requests in parallel).
func BenchmarkVLLMGenerateToy(b *testing.B) {
	r0, r1 := startToyReplica(b, 0.3, false), startToyReplica(b, 0.3, false)
	v, err := engine.NewVLLM(context.Background(), engine.VLLMOptions{Endpoints: []vllm.Endpoint{r0, r1}, SyncMode: engine.SyncNone})
	require.NoError(b, err)
	defer v.Close()
	var seed atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := v.Generate(context.Background(), toyRequest(seed.Add(1))); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkVLLMSyncFullToy measures one full sync round (export, pause,
// reload, reset, resume on two replicas) without model I/O.
func BenchmarkVLLMSyncFullToy(b *testing.B) {
	r0, r1 := startToyReplica(b, 0, false), startToyReplica(b, 0, false)
	export, _ := exportSlope(nil)
	v, err := engine.NewVLLM(context.Background(), engine.VLLMOptions{Endpoints: []vllm.Endpoint{r0, r1}, SyncMode: engine.SyncFull, SyncDir: b.TempDir(), Export: export})
	require.NoError(b, err)
	defer v.Close()
	b.ResetTimer()
	for i := range b.N {
		require.NoError(b, v.SyncWeights(context.Background(), i+1))
	}
}
