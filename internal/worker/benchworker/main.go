// Command benchworker measures the libtorch worker on one model directory:
// training-step and sampling throughput and peak RSS, printed as one JSON
// line. With --logprobs it instead prints the worker's log-probs for rows
// read from a JSON file (used by scripts/check-transformers); with --init it
// writes a random model from a preset (with --vocab, a vocabulary of that
// size) into --model. It is run by scripts/bench-worker, one process per
// model so peak RSS is per model.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
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
	checkpointing                  bool
	initPreset                     string
	vocab                          int
	logprobPath                    string
	chunkRows                      int
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
	FwdBwdTokensPerS  float64 `json:"fwd_bwd_tokens_per_s"` // forward+backward only, without the optimizer step
	FwdBwdCPU         float64 `json:"fwd_bwd_cpu_s"`        // process CPU time per forward+backward
	SampleTokensPerS  float64 `json:"sample_tokens_per_s"`
	PeakRSSMiB        float64 `json:"peak_rss_mib"`
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
	flag.IntVar(&o.threads, "threads", runtime.NumCPU(), "libtorch intra-op threads")
	flag.BoolVar(&o.checkpointing, "checkpointing", false, "activation recomputation")
	flag.StringVar(&o.initPreset, "init", "", "write a random model of this preset into --model and exit")
	flag.IntVar(&o.vocab, "vocab", 0, "with --init: vocabulary size (0 = the preset's)")
	flag.StringVar(&o.logprobPath, "logprob-path", "auto", "auto, fused or recompute: how the loss gradient crosses the vocab projection")
	flag.IntVar(&o.chunkRows, "logprob-chunk-rows", 0, "token rows per vocab-projection chunk (0 = the worker's choice)")
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
	path, _, err := worker.FindLibrary("", os.Getenv)
	if err != nil {
		return err
	}
	lib, err := worker.Open(path)
	if err != nil {
		return err
	}
	m, err := lib.LoadModel(ctx, worker.ModelOptions{Dir: o.model, Device: o.device, DType: o.dtype, Threads: o.threads,
		GradientCheckpointing: o.checkpointing, LogprobPath: lpPath, LogprobChunkRows: o.chunkRows})
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
	mb := grpo.MicroBatch{Rows: rows, RoundTokens: float64(o.rows * o.complLen), GradAccumSteps: 1}
	cfg := grpo.DefaultLossConfig()
	cfg.ISCorrection = grpo.ISCorrectionOff
	var elapsed, fwdBwd time.Duration
	var cpu, fbCPU float64
	for step := 0; step <= o.steps; step++ {
		cpu0 := cpuSeconds()
		start := time.Now()
		if _, err := m.ForwardBackward(ctx, mb, cfg); err != nil {
			return err
		}
		fb := time.Since(start) // ForwardBackward returns after its loss is read back, so the device is synchronised
		cpu1 := cpuSeconds()
		if _, err := m.OptimizerStep(ctx, 1e-5); err != nil {
			return err
		}
		if step > 0 { // step 0 warms up
			elapsed += time.Since(start)
			fwdBwd += fb
			cpu += cpuSeconds() - cpu0
			fbCPU += cpu1 - cpu0
		}
	}
	reqs := make([]worker.SampleRequest, o.rows)
	for i := range reqs {
		reqs[i] = worker.SampleRequest{PromptIDs: rows[i].Tokens[:o.promptLen], MaxNewTokens: o.newTokens, Temperature: 1, Seed: int64(i)}
	}
	if _, err := m.Sample(ctx, reqs[:1]); err != nil { // warm-up
		return err
	}
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
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	seq := o.promptLen + o.complLen
	return json.NewEncoder(os.Stdout).Encode(result{
		Model: o.model, Device: o.device, DType: string(m.DType()), Threads: o.threads, Libtorch: lib.Info().LibtorchVersion,
		Params: m.Config().NumParams(), Vocab: V, LogprobPath: o.logprobPath, Rows: o.rows, SeqLen: seq,
		TrainTokensPerSec: float64(o.rows*seq*o.steps) / elapsed.Seconds(),
		TrainStepSeconds:  elapsed.Seconds() / float64(o.steps),
		TrainStepCPU:      cpu / float64(o.steps),
		FwdBwdTokensPerS:  float64(o.rows*seq*o.steps) / fwdBwd.Seconds(),
		FwdBwdCPU:         fbCPU / float64(o.steps),
		SampleTokensPerS:  float64(sampled) / sampleTime.Seconds(),
		PeakRSSMiB:        float64(ru.Maxrss) / 1024,
	})
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
