// Command benchworker measures the libtorch worker on one model directory:
// training-step and sampling throughput and peak RSS, printed as one JSON
// line. With --logprobs it instead prints the worker's log-probs for rows
// read from a JSON file (used by scripts/check-transformers); with --init it
// writes a random model from a preset (with --vocab, a vocabulary of that
// size) into --model. It is run by scripts/bench-worker, one process per
// model so peak RSS is per model. With --world-size N it is one rank of N
// data-parallel processes (start each with its --rank): every step
// reduces the gradients, and the JSON adds the reduce time per step and
// its fraction of the step. --shard optimizer|gradients shards the AdamW
// state (ZeRO-1) and also the gradients (ZeRO-2) over the ranks; the JSON
// then adds the sharded step's all-gather time and every kind's bytes held
// (scripts/bench-zero). --grad-accum N runs N micro-batches of --rows rows
// per step.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"syscall"
	"time"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/worker"
)

type options struct {
	model, device, dtype, logprobs string
	rows, promptLen, complLen      int
	steps, newTokens, threads      int
	checkpointing, sampleOnly      bool
	repeats                        int
	// Data-parallel: with worldSize > 1 each step all-reduces the gradients
	// with the other ranks (started the same way) and sampling is skipped.
	worldSize, rank int
	masterAddr      string
	masterPort      int
	bucketMiB       float64
	shard           string
	loraRank        int
	gradAccum       int
	initPreset      string
	vocab           int
	logprobPath     string
	chunkRows       int
	decodeKernels   string
	kernelCache     string
}

type result struct {
	Model             string  `json:"model"`
	Device            string  `json:"device"`
	DType             string  `json:"dtype"`
	Threads           int     `json:"threads"`
	Libtorch          string  `json:"libtorch"`
	Params            int64   `json:"params"`
	Vocab             int     `json:"vocab"`
	LogprobPath       string  `json:"logprob_path"`
	Rows              int     `json:"rows"`
	SeqLen            int     `json:"seq_len"`
	TrainTokensPerSec float64 `json:"train_tokens_per_s"`
	TrainStepSeconds  float64 `json:"train_step_s"`
	TrainStepCPU      float64 `json:"train_step_cpu_s"`     // process CPU time per step: stable on a shared machine
	TrainStepSys      float64 `json:"train_step_sys_s"`     // of which system time: page faults on fresh memory, mostly
	TrainStepFaults   float64 `json:"train_step_minflt"`    // minor page faults per step
	FwdBwdTokensPerS  float64 `json:"fwd_bwd_tokens_per_s"` // forward+backward only, without the optimizer step
	FwdBwdCPU         float64 `json:"fwd_bwd_cpu_s"`        // process CPU time per forward+backward
	SampleTokensPerS  float64 `json:"sample_tokens_per_s"`
	// DecodeTokensPerS is the continuous-batching decoder on the same
	// requests as sample_tokens_per_s (the static sampler).
	DecodeTokensPerS float64 `json:"decode_tokens_per_s"`
	PeakRSSMiB       float64 `json:"peak_rss_mib"`
	// With --world-size > 1: the gradient all-reduce per step (inside
	// train_step_s), its bytes and buckets, and its share of the step.
	WorldSize         int     `json:"world_size,omitempty"`
	Rank              int     `json:"rank,omitempty"`
	Backend           string  `json:"backend,omitempty"`
	AllReduceSeconds  float64 `json:"allreduce_s,omitempty"`
	AllReduceBytes    int64   `json:"allreduce_bytes,omitempty"`
	AllReduceBuckets  int     `json:"allreduce_buckets,omitempty"`
	AllReduceFraction float64 `json:"allreduce_fraction,omitempty"`
	// With --world-size > 1: the sharding's keys (dist.go).
	*shardResult
	// GradAccum is the micro-batches per step (each of Rows rows). The
	// bytes each kind held after the timed steps (this rank's slices under
	// a shard): parameters, gradients, optimizer state (AdamW's moments).
	GradAccum      int   `json:"grad_accum,omitempty"`
	ParamBytes     int64 `json:"param_bytes,omitempty"`
	GradBytes      int64 `json:"grad_bytes,omitempty"`
	OptimizerBytes int64 `json:"optimizer_bytes,omitempty"`
	// PeakGatheredBytes is the most a ZeRO-3 rank held gathered at once
	// (full units, prefetch and gradients awaiting reduce-scatter).
	PeakGatheredBytes int64 `json:"peak_gathered_bytes,omitempty"`
	// CPU is the processor and its ISA; DecodeKernels the CPU decode
	// kernels chosen at load (their summary and the choice itself).
	CPU                 worker.CPU            `json:"cpu"`
	DecodeKernels       string                `json:"decode_kernels"`
	DecodeKernelsChoice *worker.DecodeKernels `json:"decode_kernels_choice,omitempty"`
	// TrainGFLOPS is the model FLOPs of a training step's forward and
	// backward (3x the forward's matmuls and attention, no recompute) per
	// second of forward+backward; SgemmPeakGFLOPS the fastest float32
	// matmul measured here on the step's own shapes and a square one (the
	// faster of oneDNN's sgemm and at::mm, PeakKernel), PeakShare their ratio.
	TrainGFLOPS     float64 `json:"train_gflops,omitempty"`
	SgemmPeakGFLOPS float64 `json:"sgemm_peak_gflops,omitempty"`
	PeakKernel      string  `json:"sgemm_peak_kernel,omitempty"`
	PeakShare       float64 `json:"train_peak_share,omitempty"`
	// PeakRSSLoadMiB is the peak RSS before the first step (the model
	// loaded, the group joined): peak_rss_mib above it is training's.
	PeakRSSLoadMiB float64 `json:"peak_rss_load_mib,omitempty"`
}

func main() {
	var o options
	flag.StringVar(&o.model, "model", "", "Hugging Face model directory")
	flag.StringVar(&o.device, "device", "cpu", "cpu or cuda:N")
	flag.StringVar(&o.dtype, "dtype", "", "float32, bfloat16, float16 (default: float32 on CPU)")
	flag.StringVar(&o.logprobs, "logprobs", "", "print log-probs for the rows in this JSON file and exit")
	flag.IntVar(&o.rows, "rows", 4, "rows per training micro-batch and sampling batch")
	flag.IntVar(&o.promptLen, "prompt", 32, "prompt tokens per row")
	flag.IntVar(&o.complLen, "completion", 96, "completion tokens per row (training)")
	flag.IntVar(&o.steps, "steps", 3, "timed training steps (after one warm-up step)")
	flag.IntVar(&o.newTokens, "new-tokens", 64, "tokens sampled per row")
	flag.IntVar(&o.repeats, "repeats", 1, "time sampling this many times and report the median tokens/s (a short run is mostly jitter)")
	flag.IntVar(&o.threads, "threads", runtime.NumCPU(), "libtorch intra-op threads")
	flag.BoolVar(&o.checkpointing, "checkpointing", false, "activation recomputation")
	flag.BoolVar(&o.sampleOnly, "sample-only", false, "measure sampling only (train keys are 0)")
	flag.IntVar(&o.worldSize, "world-size", 1, "data-parallel ranks; > 1 all-reduces gradients every step (start one process per rank)")
	flag.IntVar(&o.rank, "rank", 0, "this process's rank (with --world-size)")
	flag.StringVar(&o.masterAddr, "master-addr", "127.0.0.1", "rendezvous address, served by rank 0 (with --world-size)")
	flag.IntVar(&o.masterPort, "master-port", 29500, "rendezvous port (with --world-size)")
	flag.Float64Var(&o.bucketMiB, "bucket-mb", 25, "gradient all-reduce bucket size in MiB (with --world-size)")
	flag.StringVar(&o.shard, "shard", "none", "none, optimizer (ZeRO-1), gradients (ZeRO-2) or parameters (ZeRO-3): shard the optimizer, the gradients and the parameters over the ranks (with --world-size)")
	flag.IntVar(&o.loraRank, "lora", 0, "train LoRA adapters of this rank on every projection instead of every weight (0: full fine-tuning)")
	flag.IntVar(&o.gradAccum, "grad-accum", 1, "micro-batches of --rows rows per training step")
	flag.StringVar(&o.initPreset, "init", "", "write a random model of this preset into --model and exit")
	flag.IntVar(&o.vocab, "vocab", 0, "with --init: vocabulary size (0 = the preset's)")
	flag.StringVar(&o.logprobPath, "logprob-path", "auto", "auto, fused or recompute: how the loss gradient crosses the vocab projection")
	flag.IntVar(&o.chunkRows, "logprob-chunk-rows", 0, "token rows per vocab-projection chunk (0 = the worker's choice)")
	flag.StringVar(&o.decodeKernels, "decode-kernels", "auto", "auto, torch or onednn: the CPU decode kernels (worker.decode_kernels)")
	flag.StringVar(&o.kernelCache, "kernel-cache", "", "directory of the decode-kernel measurements (default: ortrain's cache)")
	flag.Parse()
	if err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "benchworker:", err)
		os.Exit(1)
	}
}

var logprobPaths = map[string]worker.LogprobPath{"auto": worker.LogprobAuto, "fused": worker.LogprobFused, "recompute": worker.LogprobRecompute}

func run(ctx context.Context, o options) error {
	if o.initPreset != "" {
		return initModel(o)
	}
	lpPath, ok := logprobPaths[o.logprobPath]
	if !ok {
		return fmt.Errorf("--logprob-path %q is unknown (auto, fused, recompute)", o.logprobPath)
	}
	shard, err := worker.ParseShardStage(o.shard)
	switch {
	case err != nil:
		return fmt.Errorf("--shard: %w", err)
	case shard != worker.ShardNone && o.worldSize < 2:
		return fmt.Errorf("--shard %s needs --world-size > 1", shard)
	case o.gradAccum < 1:
		return fmt.Errorf("--grad-accum %d must be >= 1", o.gradAccum)
	}
	path, _, err := worker.FindLibrary("", os.Getenv)
	if err != nil {
		return err
	}
	lib, err := worker.Open(path)
	if err != nil {
		return err
	}
	mo := worker.ModelOptions{Dir: o.model, Device: o.device, DType: o.dtype, Threads: o.threads,
		GradientCheckpointing: o.checkpointing, LogprobPath: lpPath, LogprobChunkRows: o.chunkRows,
		DecodeKernels: o.decodeKernels, KernelCacheDir: o.kernelCache}
	if o.loraRank > 0 {
		mo.LoRA = &worker.LoRAOptions{Rank: o.loraRank, Alpha: 2 * float64(o.loraRank)}
	}
	m, err := lib.LoadModel(ctx, mo)
	if err != nil {
		return err
	}
	defer m.Close()
	if o.logprobs != "" {
		return printLogprobs(ctx, m, o.logprobs)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	V := m.Config().VocabSize
	rows := make([]grpo.Row, o.rows)
	for i := range rows {
		toks := make([]int32, o.promptLen+o.complLen)
		for j := range toks {
			toks[j] = int32(rng.IntN(V))
		}
		mask := make([]uint8, o.complLen)
		for j := range mask {
			mask[j] = 1
		}
		rows[i] = grpo.Row{Tokens: toks, PromptLen: o.promptLen, LossMask: mask, Advantage: float32(rng.NormFloat64())}
	}
	mb := grpo.MicroBatch{Rows: rows, RoundTokens: float64(o.rows * o.complLen), GradAccumSteps: o.gradAccum}
	cfg := grpo.DefaultLossConfig()
	cfg.ISCorrection = grpo.ISCorrectionOff
	var group *worker.Group
	if o.worldSize > 1 {
		group, err = m.JoinGroup(ctx, worker.DistOptions{Addr: o.masterAddr, Port: o.masterPort, Rank: o.rank,
			WorldSize: o.worldSize, BucketBytes: int64(o.bucketMiB * (1 << 20)), Shard: shard})
		if err != nil {
			return err
		}
		defer group.Close()
		if err := group.BroadcastTrainable(ctx); err != nil {
			return err
		}
	}
	loadRSS := peakRSSMiB()
	var t trainTimes
	if !o.sampleOnly {
		if t, err = timedSteps(ctx, m, group, mb, cfg, o); err != nil {
			return err
		}
	}
	seq := o.promptLen + o.complLen
	res := result{
		Model: o.model, Device: o.device, DType: string(m.DType()), Threads: o.threads, Libtorch: lib.Info().LibtorchVersion,
		Params: m.Config().NumParams(), Vocab: V, LogprobPath: o.logprobPath, Rows: o.rows, SeqLen: seq,
		PeakRSSLoadMiB: loadRSS, CPU: worker.HostCPU(),
	}
	if k := m.DecodeKernels(); k.Applies {
		res.DecodeKernels, res.DecodeKernelsChoice = k.Summary(), &k
	}
	if !o.sampleOnly && o.steps > 0 {
		n := float64(o.steps)
		tokens := float64(o.rows * seq * o.gradAccum * o.steps)
		res.TrainTokensPerSec = tokens / t.elapsed.Seconds()
		res.TrainStepSeconds = t.elapsed.Seconds() / n
		res.TrainStepCPU = t.cpu / n
		res.TrainStepSys = t.sys / n
		res.TrainStepFaults = t.faults / n
		res.FwdBwdTokensPerS = tokens / t.fwdBwd.Seconds()
		res.FwdBwdCPU = t.fbCPU / n
		if o.device == "cpu" {
			if err := setPeakShare(&res, lib, m.Config(), seq, tokens/t.fwdBwd.Seconds(), o); err != nil {
				return err
			}
		}
		res.GradAccum = o.gradAccum
		held, err := m.ShardMemory(ctx, false)
		if err != nil {
			return err
		}
		res.ParamBytes, res.GradBytes, res.OptimizerBytes = held.ParamBytes, held.GradBytes, held.OptimBytes
		res.PeakGatheredBytes = held.PeakGatheredBytes
	}
	if group != nil { // the step's time includes waiting for the slowest rank
		res.WorldSize, res.Rank, res.Backend = o.worldSize, o.rank, group.Backend()
		res.shardResult = &shardResult{Shard: shard.String()}
		if !o.sampleOnly && o.steps > 0 {
			setDist(&res, t, o)
		}
		res.PeakRSSMiB = peakRSSMiB()
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	reqs := make([]worker.SampleRequest, o.rows)
	for i := range reqs {
		reqs[i] = worker.SampleRequest{PromptIDs: rows[i].Tokens[:o.promptLen], MaxNewTokens: o.newTokens, Temperature: 1, Seed: int64(i)}
	}
	if _, err := m.Sample(ctx, reqs[:1]); err != nil { // warm-up
		return err
	}
	var static, decoded []float64 // tokens/s per repeat
	for range max(o.repeats, 1) {
		start := time.Now()
		out, err := m.Sample(ctx, reqs)
		if err != nil {
			return err
		}
		sampleTime := time.Since(start)
		var sampled int
		for _, r := range out {
			sampled += len(r.IDs)
		}
		static = append(static, float64(sampled)/sampleTime.Seconds())
	}
	for range max(o.repeats, 1) {
		decodeTime, n, err := decode(ctx, m, reqs)
		if err != nil {
			return err
		}
		decoded = append(decoded, float64(n)/decodeTime.Seconds())
	}
	res.SampleTokensPerS, res.DecodeTokensPerS = median(static), median(decoded)
	res.PeakRSSMiB = peakRSSMiB()
	return json.NewEncoder(os.Stdout).Encode(res)
}

// median of xs (not empty); xs is sorted in place.
func median(xs []float64) float64 {
	slices.Sort(xs)
	if n := len(xs); n%2 == 0 {
		return (xs[n/2-1] + xs[n/2]) / 2
	}
	return xs[len(xs)/2]
}

// peakRSSMiB is the process's peak resident set so far (getrusage's
// ru_maxrss: a high-water mark over the process's whole life, not the
// current RSS), in MiB.
func peakRSSMiB() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Maxrss) / 1024
}

// decode generates reqs with the continuous-batching decoder (all rows
// joining at once, after a one-row warm-up) and returns the time and the
// tokens generated.
func decode(ctx context.Context, m *worker.Model, reqs []worker.SampleRequest) (time.Duration, int, error) {
	d, err := m.NewDecoder(ctx, worker.DecoderOptions{})
	if err != nil {
		return 0, 0, err
	}
	defer d.Close()
	dreqs := make([]worker.DecodeRequest, len(reqs))
	for i, r := range reqs {
		dreqs[i] = worker.DecodeRequest{SampleRequest: r}
	}
	run := func(rs []worker.DecodeRequest) (int, error) {
		if _, err := d.Add(ctx, rs); err != nil {
			return 0, err
		}
		tokens := 0
		for live := len(rs); live > 0; {
			evs, err := d.Advance(ctx, live) // as the builtin engine steps it
			if err != nil {
				return 0, err
			}
			for _, e := range evs {
				tokens++
				if e.Stop != 0 {
					live--
				}
			}
		}
		return tokens, nil
	}
	if _, err := run(dreqs[:1]); err != nil {
		return 0, 0, err
	}
	start := time.Now()
	n, err := run(dreqs)
	return time.Since(start), n, err
}

// initModel writes a random model from a preset, with o.vocab tokens when
// set (ids past the byte tokenizer's are never produced by it, but the
// vocab projection costs what a real vocabulary of that size costs).
func initModel(o options) error {
	p, ok := model.PresetByName(o.initPreset)
	if !ok {
		return fmt.Errorf("--init %q: no such preset (have %v)", o.initPreset, model.PresetNames())
	}
	if o.vocab < 0 || o.vocab > 0 && o.vocab < model.ByteVocabSize() {
		return fmt.Errorf("--vocab %d must be 0 or at least the byte tokenizer's %d", o.vocab, model.ByteVocabSize())
	}
	if o.vocab > 0 {
		p.Config.VocabSize = o.vocab
	}
	if o.model == "" {
		return fmt.Errorf("--init needs --model, the directory to write")
	}
	return model.Init(o.model, p, 1)
}

// printLogprobs reads [{"tokens":[...],"prompt_len":P}] and prints the
// completion log-probs per row at temperature 1.
func printLogprobs(ctx context.Context, m *worker.Model, path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var in []struct {
		Tokens    []int32 `json:"tokens"`
		PromptLen int     `json:"prompt_len"`
	}
	if err := json.Unmarshal(raw, &in); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	rows := make([]grpo.Row, len(in))
	for i, r := range in {
		rows[i] = grpo.Row{Tokens: r.Tokens, PromptLen: r.PromptLen, LossMask: make([]uint8, len(r.Tokens)-r.PromptLen)}
	}
	lp, _, err := m.Logprobs(ctx, rows, 1, false)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(lp)
}

// cpuSeconds is the process's user + system CPU time.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

// sysSecondsAndFaults is the process's system CPU time and its count of
// minor page faults.
func sysSecondsAndFaults() (float64, float64) {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Stime.Sec) + float64(ru.Stime.Usec)/1e6, float64(ru.Minflt)
}

// forwardFLOPsPerToken counts a forward pass's multiply-adds twice: every
// projection and the LM head, and attention's two products over seq keys
// (as computed: the mask does not skip work).
func forwardFLOPsPerToken(c *model.Config, seq int) float64 {
	h, i, v := float64(c.HiddenSize), float64(c.IntermediateSize), float64(c.VocabSize)
	q, kv := float64(c.NumAttentionHeads*c.HeadDim), float64(c.NumKeyValueHeads*c.HeadDim)
	perLayer := h*q + 2*h*kv + q*h + 3*h*i + 2*q*float64(seq)
	return 2 * (float64(c.NumHiddenLayers)*perLayer + h*v)
}

// setPeakShare measures this machine's float32 matmul peak on the training
// step's own shapes (and a square one) and sets the step's share of it.
func setPeakShare(res *result, lib *worker.Library, c *model.Config, seq int, tokensPerS float64, o options) error {
	m := int64(o.rows * seq)
	shapes := []worker.GemmTiming{
		{Rows: m, K: int64(c.HiddenSize), N: int64(c.IntermediateSize)},
		{Rows: m, K: int64(c.IntermediateSize), N: int64(c.HiddenSize)},
		{Rows: 2048, K: 2048, N: 2048},
	}
	got, err := lib.BenchGemm(shapes, o.threads)
	if err != nil {
		return err
	}
	for _, g := range got {
		for kernel, s := range map[string]float64{"onednn": g.OneDNNSeconds, "at::mm": g.ATenSeconds} {
			if r := g.GFLOPS(s); r > res.SgemmPeakGFLOPS {
				res.SgemmPeakGFLOPS, res.PeakKernel = r, fmt.Sprintf("%s %dx%dx%d", kernel, g.Rows, g.K, g.N)
			}
		}
	}
	res.TrainGFLOPS = 3 * forwardFLOPsPerToken(c, seq) * tokensPerS / 1e9
	if res.SgemmPeakGFLOPS > 0 {
		res.PeakShare = res.TrainGFLOPS / res.SgemmPeakGFLOPS
	}
	return nil
}
