package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/train"
	"github.com/ortrain/ortrain/internal/worker"
)

// requireWorkerLib returns the worker library, skipping (or failing under
// ORTRAIN_REQUIRE_WORKER) when it is not built.
func requireWorkerLib(t *testing.T) string {
	t.Helper()
	lib, searched, err := worker.FindLibrary("", os.Getenv)
	if err != nil {
		if os.Getenv("ORTRAIN_REQUIRE_WORKER") != "" {
			t.Fatalf("worker library missing: %v (searched %v)", err, searched)
		}
		t.Skipf("worker library not built: %v", err)
	}
	return lib
}

// resumeConfig is a quickstart-shaped run small enough to run many times.
func resumeConfig(modelDir, out string, ga, spg, mu int) string {
	return fmt.Sprintf(`model: %s
output_dir: %s
seed: 7
envs:
  - target: builtin:letters
    split: train
chat:
  system_prompt: "Answer the user."
  final_answer_tool: submit
  render_tools: false
grpo:
  num_generations: 4
  per_device_train_batch_size: 8
  gradient_accumulation_steps: %d
  steps_per_generation: %d
  num_iterations: %d
  max_completion_length: 8
  max_tool_calling_iterations: 0
  loss_type: dapo
  learning_rate: 1.0e-3
  max_steps: 8
  logging_steps: 1
  save_steps: 0
rollout:
  max_concurrency: 16
worker:
  device: cpu
  dtype: float32
  threads: 1
`, modelDir, out, ga, spg, mu)
}

// resumeWorkspace is what the resume tests share: the worker library, the
// binary, a scratch directory and a tiny model (seed 3) in it.
func resumeWorkspace(t *testing.T) (lib, bin, work, modelDir string) {
	t.Helper()
	lib = requireWorkerLib(t)
	bin = buildOrtrain(t)
	work = t.TempDir()
	modelDir = filepath.Join(work, "tiny")
	preset, ok := model.PresetByName("tiny")
	require.True(t, ok)
	require.NoError(t, model.Init(modelDir, preset, 3))
	return lib, bin, work, modelDir
}

// runOrtrain runs the binary to completion and returns its stderr.
func runOrtrain(t *testing.T, bin, lib string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), worker.EnvLibrary+"="+lib)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Run(), "ortrain %v: %s", args, &stderr)
	return stderr.String()
}

// interruptAfter runs ortrain with --interrupt-after: the run sends itself
// a real SIGINT delay after its afterSteps-th step, timed by its own
// progress (a test that read its log and signalled it could fall steps
// behind on a busy machine and find the run already finished). It waits for
// the exit, code 2.
func interruptAfter(t *testing.T, bin, lib string, afterSteps int, delay time.Duration, args ...string) string {
	t.Helper()
	args = append(args, "--log-format", "json", "--interrupt-after", fmt.Sprintf("%d+%s", afterSteps, delay))
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), worker.EnvLibrary+"="+lib)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	log := stderr.String()
	steps := strings.Count(log, `"message":"step"`)
	require.GreaterOrEqual(t, steps, afterSteps, "the run ended before step %d: %s", afterSteps, log)
	var exitErr *exec.ExitError
	require.True(t, errors.As(err, &exitErr), "exit: %v; log: %s", err, log)
	require.Equal(t, ExitInterrupted, exitErr.ExitCode(), log)
	return log
}

// stepMetrics reads metrics.jsonl without the wall-clock keys, one map per line.
func stepMetrics(t *testing.T, runDir string) []map[string]float64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(runDir, "metrics.jsonl"))
	require.NoError(t, err)
	var out []map[string]float64
	for line := range bytes.Lines(b) {
		var m map[string]float64
		require.NoError(t, json.Unmarshal(line, &m))
		for k := range m {
			if strings.HasPrefix(k, "time/") || strings.HasPrefix(k, "memory/") || k == "step_time" {
				delete(m, k)
			}
		}
		out = append(out, m)
	}
	return out
}

// finalWeights returns the bytes of the last checkpoint's weights.
func finalWeights(t *testing.T, runDir string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(runDir, "checkpoints", "step-000008", "model", "model.safetensors"))
	require.NoError(t, err)
	return b
}

// resumeRun is one interrupted-and-resumed run against its uninterrupted
// twin, both from config (a function of the run directory).
type resumeRun struct {
	bin, lib, work, name string
	config               func(runDir string) string
	after                int           // steps completed before the interrupt
	delay                time.Duration // into the next step
}

// compare runs both, checks the resumed run logged every step once and
// ended with bit-identical weights, and returns both runs' step metrics.
func (r resumeRun) compare(t *testing.T) (want, got []map[string]float64) {
	t.Helper()
	write := func(dir string) string {
		path := filepath.Join(r.work, r.name+"-"+filepath.Base(dir)+".yaml")
		require.NoError(t, os.WriteFile(path, []byte(r.config(dir)), 0o644))
		return path
	}
	whole, cut := filepath.Join(r.work, r.name, "whole"), filepath.Join(r.work, r.name, "cut")
	runOrtrain(t, r.bin, r.lib, "run", "--config", write(whole))

	cfg := write(cut)
	log := interruptAfter(t, r.bin, r.lib, r.after, r.delay, "run", "--config", cfg)
	_, _, err := train.LatestCheckpoint(cut)
	require.NoError(t, err, "the interrupted run saved its last completed step; its log: %s", log)
	runOrtrain(t, r.bin, r.lib, "run", "--config", cfg, "--resume")

	want, got = stepMetrics(t, whole), stepMetrics(t, cut)
	require.Len(t, got, 8, "every step logged once after the resume (interrupted after step %d + %s)", r.after, r.delay)
	for i := range want {
		assert.Equal(t, want[i], got[i], "step %d (interrupted after step %d + %s)", i+1, r.after, r.delay)
	}
	assert.True(t, bytes.Equal(finalWeights(t, whole), finalWeights(t, cut)),
		"final weights differ (interrupted after step %d + %s)", r.after, r.delay)
	return want, got
}

// TestResumeIsExact is the property of issue 14: for every combination of
// gradient_accumulation_steps, steps_per_generation and num_iterations in
// {1, 2}, a run interrupted by SIGINT at a random point (mid-step included)
// and resumed logs the same per-step metrics and ends with bit-identical
// weights as an uninterrupted run with the same seed.
func TestResumeIsExact(t *testing.T) {
	lib, bin, work, modelDir := resumeWorkspace(t)
	rng := rand.New(rand.NewPCG(2026, 11))
	for _, ga := range []int{1, 2} {
		for _, spg := range []int{1, 2} {
			for _, mu := range []int{1, 2} {
				r := resumeRun{bin: bin, lib: lib, work: work, name: fmt.Sprintf("ga%d_spg%d_mu%d", ga, spg, mu),
					config: func(dir string) string { return resumeConfig(modelDir, dir, ga, spg, mu) },
					after:  1 + rng.IntN(4), delay: time.Duration(rng.IntN(150)) * time.Millisecond}
				t.Run(r.name, func(t *testing.T) { r.compare(t) })
			}
		}
	}
}

// TestResumeIsExactAsync is TestResumeIsExact with rollouts one step ahead
// of training (async.max_off_policy_steps 1): the rounds generated ahead are
// checkpointed and the one in flight is generated again from the
// checkpoint's weights, so the resumed run logs the same metrics and ends
// with the same weights as the uninterrupted one.
func TestResumeIsExactAsync(t *testing.T) {
	lib, bin, work, modelDir := resumeWorkspace(t)
	rng := rand.New(rand.NewPCG(2026, 24))
	for _, shape := range [][3]int{{1, 1, 1}, {1, 2, 1}, {2, 2, 2}} {
		ga, spg, mu := shape[0], shape[1], shape[2]
		r := resumeRun{bin: bin, lib: lib, work: work, name: fmt.Sprintf("ga%d_spg%d_mu%d", ga, spg, mu),
			config: func(dir string) string {
				return resumeConfig(modelDir, dir, ga, spg, mu) + "async:\n  max_off_policy_steps: 1\n"
			},
			after: 1 + rng.IntN(4), delay: time.Duration(rng.IntN(150)) * time.Millisecond}
		t.Run(r.name, func(t *testing.T) {
			want, _ := r.compare(t)
			assert.Equal(t, 1.0, want[7]["async/staleness_max"], "the last step trains on samples one step old")
		})
	}
}

// TestResumeIsExactDynamicCurriculum: with DAPO dynamic sampling and the
// curriculum on (the ladder env: uniform groups are common, tasks go out
// of band), synchronous and async, an interrupted and resumed run logs the
// same metrics and ends with the same weights as an uninterrupted one; the
// pass rates travel in the checkpoint, and list-tasks --run shows them.
func TestResumeIsExactDynamicCurriculum(t *testing.T) {
	lib, bin, work, modelDir := resumeWorkspace(t)
	rng := rand.New(rand.NewPCG(2026, 41))
	for _, async := range []bool{false, true} {
		r := resumeRun{bin: bin, lib: lib, work: work, name: fmt.Sprintf("async_%v", async),
			config: func(dir string) string {
				c := strings.Replace(resumeConfig(modelDir, dir, 1, 1, 1), "builtin:letters", "builtin:ladder", 1)
				c = strings.Replace(c, "  max_steps: 8\n", "  max_steps: 8\n  dynamic_sampling: true\n  dynamic_sampling_max_extra_rounds: 2\n", 1)
				c += "curriculum:\n  enabled: true\n  window: 4\n  revisit_probability: 0.2\n"
				if async {
					c += "async:\n  max_off_policy_steps: 1\n"
				}
				return c
			},
			after: 2 + rng.IntN(3), delay: time.Duration(rng.IntN(150)) * time.Millisecond}
		t.Run(r.name, func(t *testing.T) {
			want, _ := r.compare(t)
			dropped, skipped := 0.0, 0.0
			for _, m := range want {
				require.Contains(t, m, "dynamic_sampling/groups_generated")
				dropped += m["dynamic_sampling/groups_dropped"]
				skipped += m["curriculum/skipped_draws"]
			}
			assert.Positive(t, dropped, "uniform groups were dropped")
			assert.Positive(t, skipped, "the curriculum skipped tasks out of band")
			cmd := exec.Command(bin, "list-tasks", "--run", filepath.Join(work, r.name, "cut"), "--format", "jsonl")
			out, err := cmd.Output()
			require.NoError(t, err)
			assert.NotEmpty(t, strings.TrimSpace(string(out)), "the run's pass rates")
		})
	}
}
