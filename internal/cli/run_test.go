package cli

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/configs"
	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
	"github.com/ortrain/ortrain/internal/runlock"
	"github.com/ortrain/ortrain/internal/train"
	"github.com/ortrain/ortrain/internal/worker"
)

func TestRunPrintConfigAndValidation(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		env    map[string]string
		code   int
		stdout []string
		stderr []string
	}{
		{"print embedded quickstart", []string{"run", "--print-config"}, nil, ExitOK,
			[]string{"target: builtin:letters", "final_answer_tool: submit", "max_steps: 100"}, nil},
		{"flag beats env beats file", []string{"run", "--print-config", "--learning-rate", "0.5"},
			map[string]string{"ORTRAIN_GRPO_LEARNING_RATE": "0.25", "ORTRAIN_GRPO_NUM_GENERATIONS": "4"}, ExitOK,
			[]string{"learning_rate: 0.5", "num_generations: 4"}, nil},
		{"env flag replaces envs", []string{"run", "--print-config", "--env", "Eigent/SETA", "--model", "Qwen/Qwen3-4B"}, nil, ExitOK,
			[]string{"target: Eigent/SETA"}, nil},
		// Issue 14, bug 11: the design card's command does not train the
		// quickstart's random byte model with its env-specific settings.
		{"another env without a config needs --model", []string{"run", "--print-config", "--env", "Eigent/SETA"}, nil, ExitUsage,
			nil, []string{"--env Eigent/SETA needs --model", "configs/seta.yaml"}},
		{"another env with --model takes TRL's defaults", []string{"run", "--print-config", "--env", "Eigent/SETA", "--model", "Qwen/Qwen3-4B"}, nil, ExitOK,
			[]string{"model: Qwen/Qwen3-4B", "render_tools: true", "final_answer_tool: \"\"", "init_model_preset: \"\"", "learning_rate: 1e-06"}, nil},
		// Issue 14, bug 5: a preset creates a model only at the config's own path.
		{"--model drops the quickstart's preset", []string{"run", "--print-config", "--model", "Qwen/Qwen3-4B"}, nil, ExitOK,
			[]string{"model: Qwen/Qwen3-4B", "init_model_preset: \"\""}, nil},
		{"async flag", []string{"run", "--print-config", "--max-off-policy-steps", "1"}, nil, ExitOK,
			[]string{"max_off_policy_steps: 1"}, nil},
		{"bad value is a usage error naming the field", []string{"run", "--loss-type", "ppo"}, nil, ExitUsage,
			nil, []string{"grpo.loss_type", `"ppo"`, "dapo"}},
		{"bad env var names the variable", []string{"run", "--print-config"}, map[string]string{"ORTRAIN_SEED": "x"}, ExitUsage,
			nil, []string{"ORTRAIN_SEED"}},
		{"missing config file", []string{"run", "--config", "/nonexistent.yaml"}, nil, ExitUsage,
			nil, []string{"/nonexistent.yaml"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := execCLI(t, tc.env, tc.args...)
			assert.Equal(t, tc.code, code, "stderr: %s", errOut)
			for _, s := range tc.stdout {
				assert.Contains(t, out, s)
			}
			for _, s := range tc.stderr {
				assert.Contains(t, errOut, s)
			}
		})
	}
}

func TestRunUnknownConfigKey(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.yaml")
	require.NoError(t, os.WriteFile(p, []byte("grpo:\n  learnig_rate: 1\n"), 0o644))
	code, _, errOut := execCLI(t, nil, "run", "--config", p)
	assert.Equal(t, ExitUsage, code)
	assert.Contains(t, errOut, `unknown key "grpo.learnig_rate" (did you mean "grpo.learning_rate"?)`)
}

// buildOrtrain returns the real binary for black-box tests, built once per
// test process (TestMain removes it). It is built without -race: the
// in-process tests (execCLI) are where the race detector looks, and the
// black-box ones train at full speed.
func buildOrtrain(t *testing.T) string {
	t.Helper()
	bin, err := builtOrtrain()
	require.NoError(t, err)
	return bin
}

// TestRunInterruptSavesCheckpointAndClosesSessions sends SIGINT to a real
// `ortrain run` training against an env server this test owns, then checks
// the exit code, the checkpoint (loadable by the worker) and that every ORS
// session was closed.
func TestRunInterruptSavesCheckpointAndClosesSessions(t *testing.T) {
	lib, searched, err := worker.FindLibrary("", os.Getenv)
	if err != nil {
		if os.Getenv("ORTRAIN_REQUIRE_WORKER") != "" {
			t.Fatalf("worker library missing: %v (searched %v)", err, searched)
		}
		t.Skipf("worker library not built: %v", err)
	}
	bin := buildOrtrain(t)
	url, srv, stop, err := envs.ServeLocal(context.Background(), "letters", orsserver.Options{Logger: zerolog.Nop()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = stop(context.Background()) })

	work := t.TempDir()
	out := filepath.Join(work, "run")
	// The quickstart, with its env served by this test (so the test can
	// count sessions) instead of in-process.
	cfgPath := filepath.Join(work, "run.yaml")
	require.NoError(t, os.WriteFile(cfgPath, bytes.Replace(configs.Quickstart(), []byte("builtin:letters"), []byte(url), 1), 0o644))
	cmd := exec.Command(bin, "run", "--config", cfgPath, "--output-dir", out, "--max-steps", "100000", "--log-format", "json")
	cmd.Dir = work
	cmd.Env = append(os.Environ(), worker.EnvLibrary+"="+lib)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	// Interrupt once two steps are logged (the run is mid-training then).
	metrics := filepath.Join(out, "metrics.jsonl")
	require.Eventually(t, func() bool { return lines(metrics) >= 2 }, 3*time.Minute, 100*time.Millisecond, "stderr: %s", &stderr)
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	var exitErr *exec.ExitError
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		t.Fatalf("ortrain did not exit after SIGINT; stderr: %s", &stderr)
	}
	require.True(t, errors.As(err, &exitErr), "exit: %v", err)
	assert.Equal(t, ExitInterrupted, exitErr.ExitCode(), "stderr: %s", &stderr)
	assert.Contains(t, stderr.String(), "interrupted")
	assert.Positive(t, requireNoDuplicateKeys(t, stderr.String()), "the run's JSON log has lines")

	ck, step, err := train.LatestCheckpoint(out)
	require.NoError(t, err, "stderr: %s", &stderr)
	assert.GreaterOrEqual(t, step, 2)
	var st train.State
	require.NoError(t, train.ReadJSON(filepath.Join(ck, "trainer_state.json"), &st))
	assert.Equal(t, step, st.Step)

	// The checkpoint loads: weights and optimizer state.
	l, err := worker.Open(lib)
	require.NoError(t, err)
	m, err := l.LoadModel(context.Background(), worker.ModelOptions{Dir: filepath.Join(ck, "model"), Threads: 1})
	require.NoError(t, err)
	require.NoError(t, m.LoadOptimizer(context.Background(), filepath.Join(ck, "optimizer.pt")))
	require.NoError(t, m.Close())

	s := srv.Stats()
	assert.Equal(t, int64(0), s.Live, "no session left open")
	assert.Equal(t, s.Created, s.Deleted)
	assert.Positive(t, s.Created)
}

func lines(path string) int {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) != "" {
			n++
		}
	}
	return n
}

// Issue 16: a reward expression that does not compile, uses an unknown
// variable or returns the wrong type is refused before anything runs, with
// its position; --dry-run compiles every expression.
func TestRewardExpressionsAreCheckedAtStartup(t *testing.T) {
	for _, tc := range []struct{ expr, want string }{
		{`completion_tokens <`, "1:20"},
		{`1.0 + lenght`, "undeclared reference to 'lenght'"},
		{`text`, "1:1"},
	} {
		t.Run(tc.expr, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "r.yaml")
			cfg := string(configs.Quickstart()) + fmt.Sprintf("\noutput_dir: %s\nrewards:\n  - {name: env, kind: env}\n  - {name: bonus, kind: expression, expression: %q}\n",
				filepath.Join(dir, "out"), tc.expr)
			require.NoError(t, os.WriteFile(p, []byte(strings.Replace(cfg, "output_dir: runs/quickstart", "", 1)), 0o644))
			for _, args := range [][]string{{"run", "--config", p, "--dry-run"}, {"run", "--config", p}} {
				code, _, errOut := execCLI(t, nil, args...)
				assert.Equal(t, ExitUsage, code, "%v: %s", args, errOut)
				assert.Contains(t, errOut, `reward "bonus"`)
				assert.Contains(t, errOut, tc.want)
				assert.Contains(t, errOut, "available variables")
			}
			assert.NoDirExists(t, filepath.Join(dir, "out"), "nothing was created")
		})
	}
}

func TestEvalHelpListsOnlyEvalFlags(t *testing.T) {
	code, out, errOut := execCLI(t, nil, "eval", "--help")
	require.Equal(t, ExitOK, code, errOut)
	for _, f := range []string{"--eval-dir", "--num-generations", "--pass-threshold", "--model", "--split", "--num-tasks", "--temperature"} {
		assert.Contains(t, out, f)
	}
	for _, f := range []string{"--max-steps", "--learning-rate", "--per-device-train-batch-size", "--loss-type", "--engine", "--max-off-policy-steps", "--resume", "--overwrite"} {
		assert.NotContains(t, out, f)
	}
	code, _, errOut = execCLI(t, nil, "eval", "--learning-rate", "0.1")
	assert.Equal(t, ExitUsage, code)
	assert.Contains(t, errOut, "unknown flag: --learning-rate")
}

// The quickstart's duration is stated once, in quickstartTime: run --help
// shows it and the README must say the same.
func TestQuickstartTimeAgrees(t *testing.T) {
	code, out, errOut := execCLI(t, nil, "run", "--help")
	require.Equal(t, ExitOK, code, errOut)
	assert.Contains(t, strings.Join(strings.Fields(out), " "), "on CPU in "+quickstartTime+".")
	// One measured number: the README and the config's own comment agree.
	for _, f := range []string{"../../README.md", "../../configs/quickstart.yaml"} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		assert.Contains(t, strings.Join(strings.Fields(strings.ReplaceAll(string(b), "#", "")), " "), quickstartTime, f)
	}
}

// A split the env does not have is a usage error that lists the valid
// splits, for eval's --split and for a config's envs[].split in run.
func TestUnknownSplitListsValidSplits(t *testing.T) {
	dir := t.TempDir()
	modelDir := filepath.Join(dir, "tiny")
	cfg := filepath.Join(dir, "c.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(fmt.Sprintf("model: %s\ninit_model_preset: tiny\noutput_dir: %s\nenvs:\n  - target: builtin:letters\n    split: bogus\n",
		modelDir, filepath.Join(dir, "run"))), 0o644))
	tests := []struct {
		name string
		args []string
	}{
		{"eval --split", []string{"eval", "--config", cfg, "--env", "builtin:letters", "--split", "bogus"}},
		{"run with envs[].split", []string{"run", "--config", cfg}},
		{"run --dry-run", []string{"run", "--config", cfg, "--dry-run"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := execCLI(t, nil, tt.args...)
			assert.Equal(t, ExitUsage, code, errOut)
			assert.Contains(t, errOut, `split "bogus" is not a split of builtin:letters (valid splits: train, validation, mixed)`)
			assert.NotContains(t, errOut, "Invalid split", "the raw HTTP rejection is replaced")
		})
	}
}

// An env that cannot be reached gets the same hint from run as from
// list-tasks (printError adds it for every command).
func TestRunUnreachableEnvHint(t *testing.T) {
	dir := t.TempDir()
	preset, ok := model.PresetByName("tiny")
	require.True(t, ok)
	require.NoError(t, model.Init(filepath.Join(dir, "tiny"), preset, 1))
	code, _, errOut := execCLI(t, nil, "run", "--env", closedURL(t), "--model", filepath.Join(dir, "tiny"), "--output-dir", filepath.Join(dir, "run"))
	assert.Equal(t, ExitError, code, errOut)
	assert.Contains(t, errOut, "cannot reach ")
	assert.Contains(t, errOut, "hint: is a server running there?")
}

// Issue 14: --dry-run refuses what the run would then fail on — an
// output_dir holding a run, a vLLM command that is not installed — and
// creates nothing.
func TestDryRunChecksWhatTheRunWouldFailOn(t *testing.T) {
	dir := t.TempDir()
	held := filepath.Join(dir, "held")
	require.NoError(t, os.MkdirAll(filepath.Join(held, "checkpoints"), 0o755))
	code, _, errOut := execCLI(t, nil, "run", "--dry-run", "--output-dir", held)
	assert.Equal(t, ExitUsage, code, errOut)
	assert.Contains(t, errOut, "output_dir holds an earlier run")

	fresh := filepath.Join(dir, "fresh")
	code, _, errOut = execCLI(t, map[string]string{"ORTRAIN_ENGINE_VLLM_COMMAND": "no-such-vllm-binary serve"},
		"run", "--dry-run", "--output-dir", fresh, "--engine", "vllm")
	assert.Equal(t, ExitUsage, code, errOut)
	assert.Contains(t, errOut, "engine.vllm_command")
	assert.NoDirExists(t, fresh, "--dry-run creates nothing")

	// Every problem at once: a directory a live run holds, and a vLLM
	// server nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "http://" + l.Addr().String()
	require.NoError(t, l.Close())
	live := filepath.Join(dir, "live")
	lock, err := runlock.Acquire(live, "run")
	require.NoError(t, err)
	defer lock.Release()
	code, _, errOut = execCLI(t, map[string]string{"ORTRAIN_ENGINE_VLLM_URLS": `["` + closed + `"]`},
		"run", "--dry-run", "--output-dir", live, "--engine", "vllm")
	assert.Equal(t, ExitUsage, code, errOut)
	assert.Contains(t, errOut, "is in use by a run that is still going")
	assert.Contains(t, errOut, closed)
}

// Issue 23: a missing model is a usage error (exit 3) in run and eval as in
// serve-vllm, names the directory rather than a download, and a run that
// fails before training leaves no empty output directory behind.
func TestMissingModelExitCodeAndNoEmptyRunDir(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "models", "tiny"), 0o755))
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"run", []string{"run", "--model", "models/nope", "--output-dir", "runs/x"}},
		{"eval", []string{"eval", "--model", "models/nope", "--env", "builtin:echo", "--output-dir", "runs/x"}},
		{"serve-vllm", []string{"serve-vllm", "--model", "models/nope"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := execCLI(t, nil, tc.args...)
			assert.Equal(t, ExitUsage, code, errOut)
			assert.Contains(t, errOut, "directory models/nope does not exist")
			assert.NotContains(t, errOut, "hf download")
			assert.NoDirExists(t, filepath.Join(dir, "runs"), "a start that fails leaves no empty output directory")
		})
	}
}

// A model directory without its weights or its tokenizer is the user's to
// fix, like a missing model: exit 3, naming what is missing.
func TestIncompleteModelIsAUsageError(t *testing.T) {
	dir := t.TempDir()
	code, _, errOut := execCLI(t, nil, "init-model", "--preset", "tiny", "--out", filepath.Join(dir, "noweights"))
	require.Equal(t, ExitOK, code, errOut)
	code, _, errOut = execCLI(t, nil, "init-model", "--preset", "tiny", "--out", filepath.Join(dir, "notokenizer"))
	require.Equal(t, ExitOK, code, errOut)
	require.NoError(t, os.Remove(filepath.Join(dir, "noweights", "model.safetensors")))
	require.NoError(t, os.Remove(filepath.Join(dir, "notokenizer", "tokenizer.json")))
	env := map[string]string{"ORTRAIN_WORKER_LIB": os.Getenv("ORTRAIN_WORKER_LIB")}
	for _, tc := range []struct{ model, wantIn string }{
		{"notokenizer", "has no tokenizer"},
		{"noweights", "is incomplete: it has no weights"},
	} {
		code, _, errOut := execCLI(t, env, "run", "--model", filepath.Join(dir, tc.model), "--output-dir", filepath.Join(dir, "run-"+tc.model), "--max-steps", "1")
		if tc.model == "noweights" && strings.Contains(errOut, "worker library") {
			t.Skip("the weights are read by the worker, which is not built here")
		}
		assert.Equal(t, ExitUsage, code, "%s: %s", tc.model, errOut)
		assert.Contains(t, errOut, tc.wantIn, tc.model)
	}

	// --device cuda with a worker built against a CPU-only libtorch (the
	// test machines' worker): the field and the fix, not libtorch's words alone.
	code, _, errOut = execCLI(t, nil, "init-model", "--preset", "tiny", "--out", filepath.Join(dir, "whole"))
	require.Equal(t, ExitOK, code, errOut)
	code, _, errOut = execCLI(t, env, "run", "--model", filepath.Join(dir, "whole"), "--output-dir", filepath.Join(dir, "run-cuda"), "--max-steps", "1", "--device", "cuda")
	assert.Equal(t, ExitUsage, code, errOut)
	assert.Contains(t, errOut, "worker.device")
	assert.Contains(t, errOut, "--device cpu")
}

// An OpenEnv env has no task list: eval --env names its own flag.
func TestEvalOpenEnvWithoutTasksNamesTheFlag(t *testing.T) {
	dir := t.TempDir()
	code, _, errOut := execCLI(t, nil, "init-model", "--preset", "tiny", "--out", filepath.Join(dir, "m"))
	require.Equal(t, ExitOK, code, errOut)
	env := map[string]string{"ORTRAIN_WORKER_LIB": os.Getenv("ORTRAIN_WORKER_LIB")}
	code, _, errOut = execCLI(t, env, "eval", "--model", filepath.Join(dir, "m"), "--env", "builtin:guess", "-n", "1", "--eval-dir", filepath.Join(dir, "e"))
	assert.Equal(t, ExitUsage, code, errOut)
	assert.Contains(t, errOut, "--num-tasks")
}

// --help shows each config flag's default (the value a --config file that
// omits the key gets), without making the flag count as set.
func TestHelpShowsConfigDefaults(t *testing.T) {
	for _, tc := range []struct {
		cmd  string
		want []string
	}{
		{"run", []string{`--device string`, `(default "auto")`, `--learning-rate float`, `(default 1e-06)`, `--num-generations int`, `(default 8)`, `(default "dapo")`}},
		{"sft", []string{`(default 2e-05)`, `--max-length int`, `(default 1024)`}},
		{"eval", []string{`--max-completion-length int`, `(default 512)`}},
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			code, out, errOut := execCLI(t, nil, tc.cmd, "--help")
			require.Equal(t, ExitOK, code, errOut)
			for _, w := range tc.want {
				assert.Contains(t, out, w)
			}
		})
	}
	// A shown default is not a set flag: the quickstart keeps its own.
	code, out, errOut := execCLI(t, nil, "run", "--print-config")
	require.Equal(t, ExitOK, code, errOut)
	assert.NotContains(t, out, "learning_rate: 1e-06")
}
