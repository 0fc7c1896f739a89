package train

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/vllm"
	"github.com/ortrain/ortrain/internal/worker"
)

// startEngine builds the generation backend: the builtin worker (batched;
// an async run samples with a copy of the policy, samplercopy.go), or vLLM replicas launched on engine.vllm_gpus (or reached at
// engine.vllm_urls) that receive the policy's weights after every step.
func startEngine(ctx context.Context, cfg *config.Config, modelDir string, policy *workerPolicy, ro RunOptions) (engine.Generator, error) {
	log := ro.Logger.With().Str("component", "engine").Logger()
	if cfg.Engine.Kind != "vllm" && (cfg.Async.MaxOffPolicySteps > 0 || policy.params != nil) {
		// With parameters sharded no rank holds the policy whole, so it
		// samples with a copy too, synced a unit at a time.
		s, err := newSamplerCopy(ctx, cfg, modelDir, policy, log)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	if cfg.Engine.Kind != "vllm" {
		return newBuiltinEngine(ctx, cfg, policy.m, log)
	}
	v, _, err := startVLLM(ctx, cfg, modelDir, policy, ro, log)
	if err != nil {
		return nil, err
	}
	return v, nil
}

// startVLLM starts the vLLM backend and returns the API key the replicas
// take ("" for none).
func startVLLM(ctx context.Context, cfg *config.Config, modelDir string, policy *workerPolicy, ro RunOptions, log zerolog.Logger) (*engine.VLLM, string, error) {
	export := policy.m.SaveHF
	if cfg.GRPO.LoRA.Enabled {
		export = policy.m.SavePEFT
	}
	score := func(ctx context.Context, row grpo.Row) ([]float32, error) {
		lp, err := policy.Logprobs(ctx, []grpo.Row{row}, 1, false)
		if err != nil {
			return nil, err
		}
		return lp[0], nil
	}
	if policy.paramSync != nil {
		// Parameters sharded: the weights come from every rank's slices,
		// and the check's pass runs on every rank (paramsync.go).
		export = policy.paramSync.export
		score = scoreService{g: policy.params, policy: policy}.score
	}
	opts := vllmOptions(cfg, modelDir, export, ro, log)
	// Rank 0 alone pushes weights to the replicas all ranks share, and
	// verifies every push against its own log-probs.
	opts.Follower = !ro.rank0()
	if !opts.Follower && opts.SyncMode != engine.SyncNone {
		opts.Check = syncCheck(modelDir, score, log)
	}
	if len(opts.URLs) == 0 && opts.APIKey == "" && !vllm.IsLoopback(opts.Launch.Host) {
		// Replicas reachable from the network get a key only this run knows.
		key, err := randomKey()
		if err != nil {
			return nil, "", err
		}
		opts.APIKey, opts.Launch.APIKey = key, key
		log.Info().Str("host", opts.Launch.Host).Msg("replicas bind beyond loopback: launching them with a random API key (not shown; set engine.vllm_api_key to choose it)")
	}
	v, err := engine.NewVLLM(ctx, opts)
	if err != nil {
		return nil, "", fmt.Errorf("start vLLM engine: %w", err)
	}
	return v, opts.APIKey, nil
}

// vllmOptions is the vLLM setup of engine.kind vllm: replicas of modelDir
// (or the servers at engine.vllm_urls) that get the trainer's weights
// through export, full weights or, with grpo.lora, adapters. Replica logs
// and (unless engine.vllm_sync_dir) the synced weights live in output_dir.
func vllmOptions(cfg *config.Config, modelDir string, export engine.WeightExporter, ro RunOptions, log zerolog.Logger) engine.VLLMOptions {
	e := cfg.Engine
	opts := engine.VLLMOptions{
		URLs:   e.VLLMURLs,
		APIKey: e.VLLMAPIKey,
		Launch: vllm.LaunchConfig{Command: e.VLLMCommand, Self: ro.Executable, Model: modelDir, Host: e.VLLMHost, APIKey: e.VLLMAPIKey,
			TensorParallelSize:   e.VLLMTensorParSize,
			GPUMemoryUtilization: e.VLLMGPUMemoryUtilization, MaxModelLen: e.VLLMMaxModelLen, ExtraArgs: e.VLLMExtraArgs, Environ: ro.Environ},
		GPUs: vllm.GPUPlan{GPUs: e.VLLMGPUs, Replicas: e.VLLMReplicas, TensorParallelSize: e.VLLMTensorParSize,
			TrainerGPUs: cfg.Worker.GPUs, Colocate: e.VLLMColocate},
		BasePort: e.VLLMPort, LogDir: filepath.Join(cfg.OutputDir, "vllm-logs"), StartupTimeout: e.VLLMStartupTimeout,
		MaxRestarts: e.VLLMMaxRestarts,
		SyncMode:    engine.SyncFull, SyncDir: e.VLLMSyncDir, Export: export, SyncTimeout: e.VLLMSyncTimeout,
		Timeout: e.GenerateTimeout, Logger: log,
	}
	if opts.SyncDir == "" {
		opts.SyncDir = filepath.Join(cfg.OutputDir, "weight-sync")
	}
	if cfg.GRPO.LoRA.Enabled {
		opts.SyncMode = engine.SyncLoRA
		// MaxLoras 2: the adapter in use and the one being loaded.
		opts.Launch.LoRA = &vllm.LoRALaunch{MaxRank: vllm.LoRARank(cfg.GRPO.LoRA.Rank), MaxLoras: 2}
	}
	return opts
}

// newBuiltinEngine batches concurrent rollouts' requests into the worker:
// continuously (engine.batching continuous, keeping each rollout's KV cache
// between turns within engine.kv_cache_budget) or statically.
func newBuiltinEngine(ctx context.Context, cfg *config.Config, m *worker.Model, log zerolog.Logger) (*engine.Builtin, error) {
	opts := engine.BuiltinOptions{
		MaxBatch: cfg.Engine.MaxBatchSize, Linger: 5 * time.Millisecond, Timeout: cfg.Engine.GenerateTimeout, Logger: log,
	}
	if cfg.Engine.Batching == "static" {
		return engine.NewBuiltin(engine.WorkerSampler{Model: m}, opts), nil
	}
	budget, err := cfg.Engine.KVCacheBudgetBytes()
	if err != nil {
		return nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	dec, err := m.NewDecoder(dctx, worker.DecoderOptions{KVCacheBudget: budget})
	if err != nil {
		return nil, fmt.Errorf("start builtin engine: %w", err)
	}
	return engine.NewBuiltinContinuous(engine.WorkerDecoder{Decoder: dec}, opts), nil
}

// probeText is the sync check's prompt: ordinary text every tokenizer
// encodes into common tokens.
const probeText = "The weather report for tomorrow says that the morning will be"

// syncCheck verifies each weight push: the servers' log-probs of a probe
// completion against the policy's own, from score (engine.SyncCheck).
func syncCheck(modelDir string, score func(context.Context, grpo.Row) ([]float32, error), log zerolog.Logger) *engine.SyncCheck {
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8}
	if tok, err := chat.LoadTokenizer(modelDir); err == nil {
		if ids := tok.Encode(probeText); len(ids) > 0 {
			prompt = ids
		}
	} else {
		log.Debug().Err(err).Msg("sync check: no tokenizer, probing with token ids 1-8")
	}
	return &engine.SyncCheck{Prompt: prompt, Tokens: 16, Score: func(ctx context.Context, p, completion []int32) ([]float32, error) {
		row := grpo.Row{Tokens: append(append([]int32{}, p...), completion...), PromptLen: len(p), LossMask: make([]uint8, len(completion))}
		for i := range row.LossMask {
			row.LossMask[i] = 1
		}
		return score(ctx, row)
	}}
}

// randomKey is a 256-bit API key, hex encoded.
func randomKey() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate a replica API key: %w", err)
	}
	return hex.EncodeToString(b), nil
}
