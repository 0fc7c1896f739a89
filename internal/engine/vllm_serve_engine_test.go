package engine

import (
	"context"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/vllm"
	"github.com/ortrain/ortrain/internal/worker"
)

// These tests run the vLLM backend against real `ortrain serve-engine`
// replicas launched by the supervisor, and compare with the builtin engine
// over the worker in this process. They need the worker library: without it
// they skip, unless ORTRAIN_REQUIRE_WORKER is set (CI), where they fail.

var (
	ortrainOnce sync.Once
	ortrainPath string
	ortrainErr  error
)

// workerEnv builds ortrain once and opens the worker library.
func workerEnv(t testing.TB) (bin string, lib *worker.Library, libPath string) {
	t.Helper()
	path, searched, err := worker.FindLibrary("", os.Getenv)
	if err != nil {
		if os.Getenv("ORTRAIN_REQUIRE_WORKER") != "" {
			t.Fatalf("ORTRAIN_REQUIRE_WORKER is set but the worker library is missing: %v (searched %v)", err, searched)
		}
		t.Skipf("worker library not built (run scripts/build-worker.sh): %v", err)
	}
	ortrainOnce.Do(func() {
		dir, err := os.MkdirTemp("", "ortrain-engine-test-")
		if err != nil {
			ortrainErr = err
			return
		}
		ortrainPath = filepath.Join(dir, "ortrain")
		if out, err := exec.Command("go", "build", "-o", ortrainPath, "../../cmd/ortrain").CombinedOutput(); err != nil {
			ortrainErr = &buildError{string(out), err}
		}
	})
	require.NoError(t, ortrainErr)
	lib, err = worker.Open(path)
	require.NoError(t, err)
	return ortrainPath, lib, path
}

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return "build ortrain: " + e.err.Error() + "\n" + e.out }

func tinyModel(t *testing.T, seed int64) string {
	dir := filepath.Join(t.TempDir(), "tiny")
	p, ok := model.PresetByName("tiny")
	require.True(t, ok)
	require.NoError(t, model.InitOverwrite(dir, p, seed))
	return dir
}

func loadWorkerModel(t *testing.T, lib *worker.Library, o worker.ModelOptions) *worker.Model {
	o.Threads = 1
	m, err := lib.LoadModel(context.Background(), o)
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	return m
}

func engineRequest(seed int64) Request {
	return Request{PromptIDs: []int32{10, 20, 30, 40}, MaxTokens: 8, Seed: seed, StopIDs: []int32{5},
		Sampling: SamplingParams{Temperature: 0.9, TopP: 0.95, TopK: 50}}
}

// assertSameSamples compares the vLLM path with the builtin engine for
// several seeds: identical ids, log-probs equal to float32 rounding.
func assertSameSamples(t *testing.T, v *VLLM, ref Generator, what string) []Result {
	t.Helper()
	var out []Result
	for seed := int64(1); seed <= 6; seed++ {
		want, err := ref.Generate(context.Background(), engineRequest(seed))
		require.NoError(t, err)
		got, err := v.Generate(context.Background(), engineRequest(seed))
		require.NoError(t, err)
		require.Equal(t, want.IDs, got.IDs, "%s: seed %d ids", what, seed)
		assert.Equal(t, want.StopReason, got.StopReason, "%s: seed %d", what, seed)
		require.Len(t, got.Logprobs, len(want.Logprobs))
		for i := range want.Logprobs {
			assert.InDelta(t, want.Logprobs[i], got.Logprobs[i], 1e-5, "%s: seed %d token %d", what, seed, i)
		}
		out = append(out, got)
	}
	return out
}

func launchServeEngine(t *testing.T, bin, libPath, modelDir string, replicas int, lora *vllm.LoRALaunch, mode SyncMode, export WeightExporter) *VLLM {
	t.Helper()
	return launchServeEngineChecked(t, bin, libPath, modelDir, replicas, lora, mode, export, nil)
}

// launchServeEngineChecked is launchServeEngine with pushes verified by check.
func launchServeEngineChecked(t *testing.T, bin, libPath, modelDir string, replicas int, lora *vllm.LoRALaunch, mode SyncMode, export WeightExporter, check *SyncCheck) *VLLM {
	t.Helper()
	logger := zerolog.New(zerolog.NewTestWriter(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v, err := NewVLLM(ctx, VLLMOptions{
		Launch: vllm.LaunchConfig{Command: []string{bin, "serve-engine", "--threads", "1"}, Model: modelDir, LoRA: lora,
			Environ: []string{"PATH=" + os.Getenv("PATH"), "ORTRAIN_WORKER_LIB=" + libPath}},
		GPUs: vllm.GPUPlan{Replicas: replicas}, LogDir: t.TempDir(), StartupTimeout: time.Minute, MaxRestarts: 3, StopGrace: 5 * time.Second,
		SyncMode: mode, SyncDir: t.TempDir(), Export: export, Timeout: time.Minute, Check: check,
		RetryBase: 20 * time.Millisecond, RetryCap: 200 * time.Millisecond, Logger: logger})
	require.NoError(t, err)
	t.Cleanup(func() {
		pids := []int{}
		for _, r := range v.Supervisor().Replicas() {
			pids = append(pids, r.PID())
		}
		v.Close()
		for _, pid := range pids {
			assert.Error(t, syscall.Kill(-pid, 0), "replica group %d survived Close", pid)
		}
	})
	return v
}

// TestServeEngineFullSync: token ids and log-probs through two supervised
// serve-engine replicas equal the builtin engine's; after a full-weight
// sync they equal the new weights' values; requests issued during the sync
// wait; a replica killed with SIGKILL comes back with the newest weights and
// no request fails meanwhile.
func TestServeEngineFullSync(t *testing.T) {
	bin, lib, libPath := workerEnv(t)
	dir1, dir2 := tinyModel(t, 1), tinyModel(t, 2)
	initial := loadWorkerModel(t, lib, worker.ModelOptions{Dir: dir1}) // the trainer at the start
	trainer := loadWorkerModel(t, lib, worker.ModelOptions{Dir: dir2}) // holds the "new" weights
	hold := make(chan struct{})
	var holdOnce sync.Once
	var exports atomic.Int32
	current := func() *worker.Model {
		if exports.Load() <= 1 {
			return initial
		}
		return trainer
	}
	export := func(ctx context.Context, dir string) error {
		if exports.Add(1) == 1 {
			return initial.SaveHF(ctx, dir) // the push at start
		}
		<-hold
		return trainer.SaveHF(ctx, dir)
	}
	check := &SyncCheck{Prompt: []int32{10, 20, 30}, Tokens: 8, Score: func(ctx context.Context, prompt, completion []int32) ([]float32, error) {
		row := grpo.Row{Tokens: append(append([]int32{}, prompt...), completion...), PromptLen: len(prompt), LossMask: make([]uint8, len(completion))}
		lp, _, err := current().Logprobs(ctx, []grpo.Row{row}, 1, false)
		if err != nil {
			return nil, err
		}
		return lp[0], nil
	}}
	v := launchServeEngineChecked(t, bin, libPath, dir1, 2, nil, SyncFull, export, check)
	t.Cleanup(func() { holdOnce.Do(func() { close(hold) }) })

	ref1 := NewBuiltin(WorkerSampler{Model: loadWorkerModel(t, lib, worker.ModelOptions{Dir: dir1})}, BuiltinOptions{MaxBatch: 1})
	defer ref1.Close()
	ref2 := NewBuiltin(WorkerSampler{Model: loadWorkerModel(t, lib, worker.ModelOptions{Dir: dir2})}, BuiltinOptions{MaxBatch: 1})
	defer ref2.Close()
	before := assertSameSamples(t, v, ref1, "initial weights")

	syncErr := make(chan error, 1)
	go func() { syncErr <- v.SyncWeights(context.Background(), 1) }()
	require.Eventually(t, func() bool { return v.SyncPaused() }, 10*time.Second, time.Millisecond)
	during := make(chan Result, 1)
	go func() {
		res, err := v.Generate(context.Background(), engineRequest(1))
		assert.NoError(t, err)
		during <- res
	}()
	time.Sleep(200 * time.Millisecond)
	assert.Empty(t, during, "a request issued during the sync waits")
	holdOnce.Do(func() { close(hold) })
	require.NoError(t, <-syncErr)
	want, err := ref2.Generate(context.Background(), engineRequest(1))
	require.NoError(t, err)
	assert.Equal(t, want.IDs, (<-during).IDs, "the waiting request was served by the new weights")

	after := assertSameSamples(t, v, ref2, "after full sync")
	assert.NotEqual(t, before[0].Logprobs, after[0].Logprobs, "log-probs changed with the weights")
	assert.Greater(t, v.LastSync().Duration, time.Duration(0))
	assert.True(t, v.LastSync().Probed, "the push was verified on every replica")
	assert.Less(t, v.LastSync().ProbeDiff, 1e-4, "the replicas serve the trainer's weights")

	// kill -9 replica 0 while requests flow: none fails, and the restarted
	// replica serves the synced weights (pushed by the restart hook).
	r0 := v.Supervisor().Replicas()[0]
	require.NoError(t, syscall.Kill(r0.PID(), syscall.SIGKILL))
	var wg sync.WaitGroup
	for seed := int64(1); seed <= 6; seed++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := v.Generate(context.Background(), engineRequest(seed))
			assert.NoError(t, err, "seed %d during a replica restart", seed)
		}()
	}
	wg.Wait()
	require.Eventually(t, func() bool { return r0.Restarts() == 1 && r0.Ready() }, time.Minute, 20*time.Millisecond)
	c, err := vllm.NewClient(r0.URL(), nil)
	require.NoError(t, err)
	zero, seed := 0, int64(3)
	req := engineRequest(3)
	resp, err := c.Complete(context.Background(), &vllm.CompletionRequest{Model: v.Model(), Prompt: req.PromptIDs, MaxTokens: req.MaxTokens, N: 1,
		Temperature: req.Sampling.Temperature, TopP: req.Sampling.TopP, TopK: req.Sampling.TopK, RepetitionPenalty: 1, Seed: &seed,
		StopTokenIDs: req.StopIDs, IgnoreEOS: true, Logprobs: &zero, ReturnTokenIDs: true})
	require.NoError(t, err)
	want, err = ref2.Generate(context.Background(), req)
	require.NoError(t, err)
	assert.Equal(t, want.IDs, resp.Choices[0].TokenIDs, "the restarted replica has the newest weights")
}

// TestServeEngineLoRASync: each sync loads the trainer's PEFT adapter as
// policy-vN; generation switches to it and matches the builtin engine over
// a model holding that adapter.
func TestServeEngineLoRASync(t *testing.T) {
	bin, lib, libPath := workerEnv(t)
	dir := tinyModel(t, 1)
	loraOpts := &worker.LoRAOptions{Rank: 4, Alpha: 8}
	trainer := loadWorkerModel(t, lib, worker.ModelOptions{Dir: dir, LoRA: loraOpts})
	// Set up as `ortrain run` sets it up for grpo.lora rank 4 (train's
	// vllmOptions): adapters served under vLLM's next allowed rank, logs and
	// synced weights in the run directory.
	runDir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v, err := NewVLLM(ctx, VLLMOptions{
		Launch: vllm.LaunchConfig{Command: []string{"ortrain", "serve-engine", "--threads", "1"}, Self: bin, Model: dir, TensorParallelSize: 1,
			LoRA: &vllm.LoRALaunch{MaxRank: vllm.LoRARank(4), MaxLoras: 2}, Environ: []string{"PATH=" + os.Getenv("PATH"), "ORTRAIN_WORKER_LIB=" + libPath}},
		GPUs: vllm.GPUPlan{Replicas: 1, TensorParallelSize: 1}, LogDir: filepath.Join(runDir, "vllm-logs"), StartupTimeout: time.Minute,
		SyncMode: SyncLoRA, SyncDir: filepath.Join(runDir, "weight-sync"), Export: trainer.SavePEFT, Timeout: time.Minute,
		Logger: zerolog.New(zerolog.NewTestWriter(t)),
	})
	require.NoError(t, err)
	defer v.Close()
	assert.FileExists(t, filepath.Join(runDir, "vllm-logs", "replica-0.log"))

	base := NewBuiltin(WorkerSampler{Model: loadWorkerModel(t, lib, worker.ModelOptions{Dir: dir})}, BuiltinOptions{MaxBatch: 1})
	defer base.Close()
	before := assertSameSamples(t, v, base, "base model")

	rng := rand.New(rand.NewPCG(7, 7))
	for version := 1; version <= 2; version++ {
		randomizeLoRA(t, trainer, rng)
		require.NoError(t, v.SyncWeights(context.Background(), version))
		assert.Equal(t, "policy-v"+itoa(version), v.Model())
		ref := NewBuiltin(WorkerSampler{Model: trainer}, BuiltinOptions{MaxBatch: 1})
		after := assertSameSamples(t, v, ref, "adapter v"+itoa(version))
		ref.Close()
		assert.NotEqual(t, before[0].Logprobs, after[0].Logprobs)
	}
	c, err := vllm.NewClient(v.Supervisor().URLs()[0], nil)
	require.NoError(t, err)
	models, err := c.Models(context.Background())
	require.NoError(t, err)
	require.Len(t, models.Data, 2, "policy-v1 was unloaded")
	assert.Equal(t, "policy-v2", models.Data[1].ID)
	assert.DirExists(t, filepath.Join(runDir, "weight-sync", "policy-v2"))
	logData, err := os.ReadFile(filepath.Join(runDir, "vllm-logs", "replica-0.log"))
	require.NoError(t, err)
	assert.Contains(t, string(logData), "--enable-lora --max-lora-rank 8 --max-loras 2", "rank 4 is served under vLLM's next allowed --max-lora-rank")
}

// randomizeLoRA gives every LoRA tensor random values, as training would.
func randomizeLoRA(t *testing.T, m *worker.Model, rng *rand.Rand) {
	infos, err := m.Tensors(worker.KindLoRA)
	require.NoError(t, err)
	require.NotEmpty(t, infos)
	for _, info := range infos {
		n := 1
		for _, d := range info.Shape {
			n *= int(d)
		}
		vals := make([]float32, n)
		for i := range vals {
			vals[i] = float32(rng.NormFloat64() * 0.2)
		}
		require.Equal(t, model.F32, info.DType)
		require.NoError(t, m.WriteTensor(worker.KindLoRA, model.Tensor{Name: info.Name, DType: info.DType, Shape: info.Shape, Data: model.EncodeF32(vals)}))
	}
}

func itoa(n int) string { return string(rune('0' + n)) }

// BenchmarkServeEngineFullSync measures a full-weight sync of the tiny model
// (SaveHF by the trainer, reload on two serve-engine replicas).
func BenchmarkServeEngineFullSync(b *testing.B) {
	bin, lib, libPath := workerEnv(b)
	dir := filepath.Join(b.TempDir(), "tiny")
	p, _ := model.PresetByName("tiny")
	require.NoError(b, model.InitOverwrite(dir, p, 1))
	trainer, err := lib.LoadModel(context.Background(), worker.ModelOptions{Dir: dir, Threads: 1})
	require.NoError(b, err)
	defer trainer.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v, err := NewVLLM(ctx, VLLMOptions{
		Launch: vllm.LaunchConfig{Command: []string{bin, "serve-engine", "--threads", "1"}, Model: dir,
			Environ: []string{"PATH=" + os.Getenv("PATH"), "ORTRAIN_WORKER_LIB=" + libPath}},
		GPUs: vllm.GPUPlan{Replicas: 2}, LogDir: b.TempDir(), StopGrace: 5 * time.Second,
		SyncMode: SyncFull, SyncDir: b.TempDir(), Export: trainer.SaveHF})
	require.NoError(b, err)
	defer v.Close()
	b.ResetTimer()
	for i := range b.N {
		require.NoError(b, v.SyncWeights(context.Background(), i+1))
	}
}

// TestServeEngineBeyondLoopbackNeedsKey: a replica bound to 0.0.0.0 is
// refused without an API key; with one, the stand-in (strict as vLLM: its
// key guards /v1 only) listens on loopback behind ortrain's guard, which
// requires the key on every route, and serves the trainer over loopback.
func TestServeEngineBeyondLoopbackNeedsKey(t *testing.T) {
	bin, lib, libPath := workerEnv(t)
	dir := tinyModel(t, 1)
	opts := func(key string) VLLMOptions {
		return VLLMOptions{
			Launch: vllm.LaunchConfig{Command: []string{bin, "serve-engine", "--threads", "1"}, Model: dir, Host: "0.0.0.0", APIKey: key,
				Environ: []string{"PATH=" + os.Getenv("PATH"), "ORTRAIN_WORKER_LIB=" + libPath}},
			GPUs: vllm.GPUPlan{Replicas: 1}, LogDir: t.TempDir(), StartupTimeout: time.Minute, StopGrace: 5 * time.Second,
			SyncMode: SyncNone, APIKey: key, Timeout: time.Minute, Logger: zerolog.New(zerolog.NewTestWriter(t))}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := NewVLLM(ctx, opts(""))
	var ee *vllm.ExposedError
	require.ErrorAs(t, err, &ee)

	v, err := NewVLLM(ctx, opts("replica-key"))
	require.NoError(t, err)
	defer v.Close()
	ref := NewBuiltin(WorkerSampler{Model: loadWorkerModel(t, lib, worker.ModelOptions{Dir: dir})}, BuiltinOptions{MaxBatch: 1})
	defer ref.Close()
	assertSameSamples(t, v, ref, "keyed replica")
	c, err := vllm.NewClient(v.Supervisor().URLs()[0], nil)
	require.NoError(t, err)
	_, err = c.Models(ctx)
	var se *vllm.StatusError
	require.ErrorAs(t, err, &se, "no key, no models")
	assert.Equal(t, 401, se.Code)
	_, err = c.WithAPIKey("replica-key").Models(ctx)
	assert.NoError(t, err)

	// What the network sees is the guard: every route needs the key, the
	// control routes included, which the stand-in itself (as vLLM) leaves open.
	public, err := url.Parse(v.Supervisor().PublicURLs()[0])
	require.NoError(t, err)
	require.NotEqual(t, v.Supervisor().URLs()[0], public.String())
	// A 0.0.0.0 bind is named by the hostname; reach it over loopback.
	pc, err := vllm.NewClient("http://127.0.0.1:"+public.Port(), nil)
	require.NoError(t, err)
	open, err := vllm.OpenRoutes(ctx, pc)
	require.NoError(t, err)
	assert.Empty(t, open, "the guard leaves no control route open")
	_, err = pc.WithAPIKey("replica-key").IsPaused(ctx)
	assert.NoError(t, err, "with the key the guard forwards")
}
