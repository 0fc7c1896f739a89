package train

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/configs"
	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/rollout"
	"github.com/ortrain/ortrain/internal/runlock"
	"github.com/ortrain/ortrain/internal/tfevents"
	"github.com/ortrain/ortrain/internal/worker"
)

// requireWorker skips when the worker library is not built, unless
// ORTRAIN_REQUIRE_WORKER is set (CI), where that is a failure.
func requireWorker(t *testing.T) {
	t.Helper()
	if _, searched, err := worker.FindLibrary("", os.Getenv); err != nil {
		if os.Getenv("ORTRAIN_REQUIRE_WORKER") != "" {
			t.Fatalf("ORTRAIN_REQUIRE_WORKER is set but the worker library is missing: %v (searched %v)", err, searched)
		}
		t.Skipf("worker library not built (run scripts/build-worker.sh): %v", err)
	}
}

// quickstart loads the embedded quickstart config into a temp directory.
func quickstart(t *testing.T, out string, maxSteps int) *config.Config {
	t.Helper()
	cfg, err := config.Load(config.Source{Data: configs.Quickstart()})
	require.NoError(t, err)
	cfg.Model = filepath.Join(filepath.Dir(out), "model")
	cfg.OutputDir = out
	cfg.GRPO.MaxSteps = maxSteps
	return cfg
}

func readMetrics(t *testing.T, dir string) []map[string]float64 {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "metrics.jsonl"))
	require.NoError(t, err)
	defer f.Close()
	var out []map[string]float64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]float64
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m))
		out = append(out, m)
	}
	return out
}

// meanOf is the mean of key over metric lines.
func meanOf(ms []map[string]float64, key string) float64 {
	s := 0.0
	for _, m := range ms {
		s += m[key]
	}
	return s / float64(len(ms))
}

func countLines(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		n++
	}
	return n
}

// TestQuickstartRunAndResume runs the quickstart for a few steps, then
// resumes it, and checks every file a run leaves behind.
func TestQuickstartRunAndResume(t *testing.T) {
	requireWorker(t)
	out := filepath.Join(t.TempDir(), "run")
	cfg := quickstart(t, out, 4)
	cfg.GRPO.SaveSteps = 2
	cfg.Logging.TensorBoard = true
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)

	res, err := Run(context.Background(), cfg, RunOptions{Logger: log, Getenv: func(string) string { return "" }, Version: "test"})
	require.NoError(t, err)
	assert.Equal(t, 4, res.Steps)
	assert.Equal(t, filepath.Join(out, "checkpoints", "step-000004"), res.Checkpoint)
	for _, f := range []string{"config.yaml", "manifest.json", "metrics.jsonl", "trajectories.jsonl"} {
		assert.FileExists(t, filepath.Join(out, f))
	}
	for _, step := range []string{"step-000002", "step-000004"} {
		ck := filepath.Join(out, "checkpoints", step)
		for _, f := range []string{"DONE", "trainer_state.json", "optimizer.pt", "model/config.json", "model/model.safetensors", "model/tokenizer.json"} {
			assert.FileExists(t, filepath.Join(ck, f))
		}
	}
	metrics := readMetrics(t, out)
	require.Len(t, metrics, 4)
	for i, m := range metrics {
		assert.Equal(t, float64(i+1), m["step"])
		for _, k := range []string{"reward", "reward_std", "frac_reward_zero_std", "loss", "grad_norm", "entropy",
			"completions/mean_length", "clip_ratio/region_mean", "num_tokens", "time/rollout", "time/train", "env/letters/reward_mean", "rewards/env/mean"} {
			assert.Contains(t, m, k, "step %d", i+1)
		}
		// Phase wall times fit inside the step; busy times may not.
		assert.LessOrEqual(t, m["time/generation"], m["step_time"], "step %d", i+1)
		assert.LessOrEqual(t, m["time/env"], m["step_time"], "step %d", i+1)
		assert.GreaterOrEqual(t, m["time/generation_busy"], m["time/generation"], "step %d", i+1)
		assert.GreaterOrEqual(t, m["time/env_busy"], m["time/env"], "step %d", i+1)
		for _, o := range rollout.Outcomes() {
			assert.Contains(t, m, "rollouts/"+string(o), "step %d", i+1)
		}
	}
	assert.Equal(t, 4*32, countLines(t, filepath.Join(out, "trajectories.jsonl")))
	// logging.tensorboard: every metric as a scalar, under Trainer's tags.
	files, err := filepath.Glob(filepath.Join(out, "tb", "events.out.tfevents.*"))
	require.NoError(t, err)
	require.Len(t, files, 1)
	events, err := tfevents.ReadFile(files[0])
	require.NoError(t, err)
	tb := map[int64]map[string]float64{}
	for _, e := range events {
		for _, sc := range e.Scalars {
			if tb[e.Step] == nil {
				tb[e.Step] = map[string]float64{}
			}
			tb[e.Step][sc.Tag] = float64(sc.Value)
		}
	}
	for i, m := range metrics {
		assert.InDelta(t, m["reward"], tb[int64(i+1)]["train/reward"], 1e-6, "step %d", i+1)
		assert.InDelta(t, m["loss"], tb[int64(i+1)]["train/loss"], 1e-6, "step %d", i+1)
	}
	var man manifest
	require.NoError(t, ReadJSON(filepath.Join(out, "manifest.json"), &man))
	assert.Len(t, man.ModelHash, 64)
	assert.Equal(t, "letters", man.Envs[0].Name)
	assert.Len(t, man.Envs[0].Indices, 64)
	var st State
	require.NoError(t, ReadJSON(filepath.Join(res.Checkpoint, "trainer_state.json"), &st))
	assert.Equal(t, 4, st.Step)
	assert.Equal(t, 4, st.Sampler.Round)

	// Resume: two more steps continue the same files from step 5.
	cfg = quickstart(t, out, 6)
	res, err = Run(context.Background(), cfg, RunOptions{Logger: log, Getenv: func(string) string { return "" }, Version: "test", Resume: true})
	require.NoError(t, err)
	assert.Equal(t, 6, res.Steps)
	metrics = readMetrics(t, out)
	require.Len(t, metrics, 6)
	assert.Equal(t, 5.0, metrics[4]["step"])
	assert.Greater(t, metrics[4]["num_tokens"], metrics[3]["num_tokens"], "cumulative counters continue")
	assert.FileExists(t, filepath.Join(out, "checkpoints", "step-000006", "DONE"))
	// Issue 23: a resume keeps the run's start and records itself apart.
	var resumed manifest
	require.NoError(t, ReadJSON(filepath.Join(out, "manifest.json"), &resumed))
	assert.Equal(t, man.StartedAt, resumed.StartedAt)
	assert.Len(t, resumed.ResumedAt, 1)

	// --resume of a finished run changes nothing in the run directory.
	before := snapshotFiles(t, out)
	res, err = Run(context.Background(), quickstart(t, out, 6), RunOptions{Logger: log, Getenv: func(string) string { return "" }, Version: "test", Resume: true})
	require.NoError(t, err)
	assert.Equal(t, 6, res.Steps)
	assert.Equal(t, before, snapshotFiles(t, out), "a finished run resumed writes nothing")

	// A fresh run into the same directory is refused; --overwrite starts over.
	_, err = Run(context.Background(), quickstart(t, out, 1), RunOptions{Logger: log, Getenv: func(string) string { return "" }})
	require.ErrorIs(t, err, ErrRunDirInUse)
	assert.Contains(t, err.Error(), "--resume")

	// Resuming without a checkpoint says so.
	_, err = Run(context.Background(), quickstart(t, filepath.Join(t.TempDir(), "none"), 2),
		RunOptions{Logger: log, Getenv: func(string) string { return "" }, Resume: true})
	require.ErrorIs(t, err, ErrNoCheckpoint)
}

// TestQuickstartLearns is the learning test: on the quickstart the mean
// reward must rise from near zero to at least 0.5.
func TestQuickstartLearns(t *testing.T) {
	requireWorker(t)
	if testing.Short() {
		t.Skip("learning test takes about a minute")
	}
	out := filepath.Join(t.TempDir(), "run")
	cfg := quickstart(t, out, 100)
	cfg.GRPO.SaveSteps = 0
	cfg.Logging.LogCompletions = false
	res, err := Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: func(string) string { return "" }})
	require.NoError(t, err)
	metrics := readMetrics(t, out)
	require.Len(t, metrics, 100)
	first, last := meanOf(metrics[:5], "reward"), meanOf(metrics[90:], "reward")
	t.Logf("mean reward: first 5 steps %.3f, last 10 steps %.3f (checkpoint %s)", first, last, res.Checkpoint)
	assert.LessOrEqual(t, first, 0.1)
	assert.GreaterOrEqual(t, last, 0.5)
}

// TestQuickstartAsyncLearns is the learning test with rollouts one step
// ahead of training (async.max_off_policy_steps 1): each round is sampled
// by the policy's copy with the previous step's weights and reweighted by
// the sampler's log-probs, and the mean reward must still rise from near
// zero to at least 0.5.
func TestQuickstartAsyncLearns(t *testing.T) {
	requireWorker(t)
	if testing.Short() {
		t.Skip("learning test takes about a minute")
	}
	out := filepath.Join(t.TempDir(), "run")
	cfg := quickstart(t, out, 100)
	cfg.Async.MaxOffPolicySteps = 1
	cfg.GRPO.SaveSteps = 0
	cfg.Logging.LogCompletions = false
	_, err := Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: os.Getenv})
	require.NoError(t, err)
	metrics := readMetrics(t, out)
	require.Len(t, metrics, 100)
	for i, m := range metrics {
		assert.Equal(t, float64(min(i, 1)), m["async/staleness_max"], "step %d: one step off-policy after the first", i+1)
		assert.Zero(t, m["async/dropped_samples"], "step %d", i+1)
		assert.Contains(t, m, "sampling/importance_sampling_ratio/mean", "step %d", i+1)
	}
	first, last := meanOf(metrics[:5], "reward"), meanOf(metrics[90:], "reward")
	t.Logf("async N=1: mean reward first 5 steps %.3f, last 10 steps %.3f; mean step %.2fs", first, last, meanOf(metrics, "step_time"))
	assert.LessOrEqual(t, first, 0.1)
	assert.GreaterOrEqual(t, last, 0.5)
}

// TestQuickstartVLLMEngineLearnsLikeBuiltin runs the quickstart twice: with
// the builtin engine, and with engine vllm where the supervisor launches two
// `ortrain serve-engine` replicas and the trainer pushes its weights to them
// after every step. Same seeds, same weights: the rewards must match step by
// step (the vLLM path adds only HTTP, weight sync and IS correction).
func TestQuickstartVLLMEngineLearnsLikeBuiltin(t *testing.T) {
	requireWorker(t)
	if testing.Short() {
		t.Skip("builds ortrain and launches two replicas")
	}
	bin := filepath.Join(t.TempDir(), "ortrain")
	out, err := exec.Command("go", "build", "-o", bin, "../../cmd/ortrain").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	const steps = 8
	run := func(vllm bool) []map[string]float64 {
		dir := filepath.Join(t.TempDir(), "run")
		cfg := quickstart(t, dir, steps)
		cfg.GRPO.SaveSteps = 0
		if vllm {
			cfg.Engine.Kind = "vllm"
			cfg.Engine.VLLMReplicas = 2
			cfg.Engine.VLLMCommand = []string{"ortrain", "serve-engine", "--threads", "1"}
		}
		_, err := Run(context.Background(), cfg, RunOptions{
			Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel), Getenv: os.Getenv,
			Executable: bin, Environ: os.Environ(),
		})
		require.NoError(t, err)
		return readMetrics(t, dir)
	}
	builtin, viaVLLM := run(false), run(true)
	require.Len(t, viaVLLM, steps)
	for i := range steps {
		assert.InDelta(t, builtin[i]["reward"], viaVLLM[i]["reward"], 1e-9, "step %d", i+1)
		assert.Contains(t, viaVLLM[i], "time/sync")
		// Same weights on both sides: the trainer/sampler mismatch is tiny.
		assert.Less(t, viaVLLM[i]["sampling/sampling_logp_difference/max"], 1e-3, "step %d", i+1)
		// Every push reached both replicas and was verified there.
		assert.Less(t, viaVLLM[i]["engine/sync_probe_logp_difference"], 1e-3, "step %d", i+1)
		assert.Contains(t, viaVLLM[i], "engine/sync_probe_logp_difference", "step %d", i+1)
	}
	t.Logf("reward step 1 %.4f -> step %d %.4f (both engines)", viaVLLM[0]["reward"], steps, viaVLLM[steps-1]["reward"])
}

// snapshotFiles maps every file under dir to its size and modification time.
func snapshotFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == runlock.FileName { // the holder record, not the run's output
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		out[path] = fmt.Sprintf("%d %s", info.Size(), info.ModTime().Format(time.RFC3339Nano))
		return nil
	}))
	return out
}
