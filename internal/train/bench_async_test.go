package train

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/configs"
	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/worker"
)

// BenchmarkAsyncOverlap measures what rollouts that overlap training buy on
// an env-bound run: the quickstart (letters, tiny model) with every tool
// call slowed to 300 ms, trained synchronously and with
// async.max_off_policy_steps 1, in 3 alternating rounds of 12 steps. It
// prints one JSON line per run with the mean per-step phase times in
// seconds (the first 2 steps left out) and a summary line with the ratio
// of the synchronous step time to the async one (min, median, max over the
// rounds), which it also reports as the sync/async metric. Run it with
// scripts/bench-async.
//
// What to expect: with N = 1 the next round (rollout time R: generation,
// the env's latency, the sampler's scoring pass) overlaps the current
// step's training (T, with the trainer's old-log-prob pass), so a step
// takes about max(R, T) instead of R + T; the ratio is at most (R+T)/max(R,T),
// and lower where both models share too few cores.
func BenchmarkAsyncOverlap(b *testing.B) {
	if _, _, err := findWorker(); err != nil {
		b.Skipf("worker library not built: %v", err)
	}
	const (
		steps, warmup, rounds, n = 12, 2, 3, 1
		latency                  = "300ms"
	)
	work := b.TempDir()
	modelDir := filepath.Join(work, "model")
	preset, _ := model.PresetByName("tiny")
	if err := model.Init(modelDir, preset, 42); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		var ratios []float64
		for r := 1; r <= rounds; r++ {
			var stepTime [2]float64
			for i, mode := range []int{0, n} {
				out := filepath.Join(work, fmt.Sprintf("run-%d-n%d", r, mode))
				phases, err := benchRun(modelDir, out, mode, steps, warmup, latency)
				if err != nil {
					b.Fatal(err)
				}
				line := map[string]any{"bench": "async_overlap", "round": r, "mode": map[bool]string{true: "async", false: "sync"}[mode > 0],
					"max_off_policy_steps": mode, "tool_latency": latency, "steps": steps - warmup}
				for k, v := range phases {
					line[k] = v
				}
				printJSON(b, line)
				stepTime[i] = phases["step_s"]
			}
			ratios = append(ratios, stepTime[0]/stepTime[1])
		}
		slices.Sort(ratios)
		printJSON(b, map[string]any{"bench": "async_overlap", "summary": "sync step time / async step time",
			"max_off_policy_steps": n, "tool_latency": latency,
			"ratio_min": ratios[0], "ratio_median": ratios[len(ratios)/2], "ratio_max": ratios[len(ratios)-1]})
		b.ReportMetric(ratios[len(ratios)/2], "sync/async")
	}
}

func findWorker() (string, []string, error) { return worker.FindLibrary("", os.Getenv) }

// readMetricsFile reads a metrics.jsonl, one map per line.
func readMetricsFile(path string) ([]map[string]float64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []map[string]float64
	for line := range bytes.Lines(b) {
		var m map[string]float64
		if err := json.Unmarshal(line, &m); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, m)
	}
	return out, nil
}

func printJSON(b *testing.B, v any) {
	line, err := json.Marshal(v)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Println(string(line))
}

// benchPhases maps the JSON names of the benchmark to metrics.jsonl keys.
var benchPhases = [][2]string{
	{"step_s", "step_time"}, {"rollout_s", "time/rollout"}, {"generation_s", "time/generation"},
	{"env_s", "time/env"}, {"train_s", "time/train"}, {"sync_s", "time/sync"}, {"wait_s", "time/wait"},
	{"reward", "reward"}, {"staleness_mean", "async/staleness_mean"},
}

// benchRun trains the slowed-down quickstart and returns its per-step means.
func benchRun(modelDir, out string, n, steps, warmup int, latency string) (map[string]float64, error) {
	// ORTRAIN_* variables change the shape (ORTRAIN_WORKER_THREADS,
	// ORTRAIN_ASYNC_SAMPLER_THREADS, ORTRAIN_GRPO_MAX_COMPLETION_LENGTH, …).
	cfg, err := config.Load(config.Source{Data: configs.Quickstart(), Getenv: os.Getenv})
	if err != nil {
		return nil, err
	}
	cfg.Model, cfg.InitModelPreset, cfg.OutputDir = modelDir, "", out
	cfg.GRPO.MaxSteps, cfg.GRPO.SaveSteps = steps, 0
	cfg.Logging.LogCompletions = false
	cfg.Async.MaxOffPolicySteps = n
	cfg.Envs[0].Target = "builtin:letters?tool_latency=" + latency
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, err := Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: os.Getenv}); err != nil {
		return nil, fmt.Errorf("max_off_policy_steps %d: %w", n, err)
	}
	lines, err := readMetricsFile(filepath.Join(out, "metrics.jsonl"))
	if err != nil {
		return nil, err
	}
	if len(lines) != steps {
		return nil, fmt.Errorf("%d metric lines, want %d", len(lines), steps)
	}
	means := map[string]float64{}
	for _, m := range lines[warmup:] {
		for _, p := range benchPhases {
			means[p[0]] += m[p[1]] / float64(steps-warmup)
		}
	}
	return means, nil
}
