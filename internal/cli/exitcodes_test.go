package cli

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/worker"
)

// The README's exit-code table, row by row, for every command: 3 is what the
// user fixes in the command line, config or environment before running again
// (the hint says where), 1 is a failure that is not the input's fault, 0 is
// success. Exit 2 (interrupted, checkpoint saved) is shown by the interrupt
// tests (TestRunInterrupt…, TestLauncherInterrupt…, TestResume…).
func TestExitCodeTable(t *testing.T) {
	// The worker library, found from the checkout before leaving it (a
	// clean clone has it in build/worker/, which the search finds from here).
	lib, _, _ := worker.FindLibrary("", os.Getenv)
	buildOrtrain(t) // from the checkout, for the rows that run the binary
	dir := t.TempDir()
	t.Chdir(dir)
	code, _, errOut := execCLI(t, nil, "init-model", "--preset", "tiny", "--out", "m")
	require.Equal(t, ExitOK, code, errOut)
	require.NoError(t, os.WriteFile("bad.yaml", []byte("grpo:\n  learnin_rate: 1e-6\n"), 0o644))
	missing := filepath.Join(dir, "missing")

	every := [][]string{
		{"run"}, {"sft"}, {"eval"}, {"serve-engine"}, {"serve-vllm"}, {"list-tasks"}, {"init-model"},
		{"report"}, {"doctor"}, {"version"}, {"reward"}, {"reward", "serve-example"},
		{"env", "check"}, {"env", "demos"}, {"env", "serve"}, {"env", "list"},
	}
	type row struct {
		name string
		args []string
		code int
		// env, when set, runs the built binary with it (what it sets is
		// read by libtorch's side, once per process).
		env map[string]string
	}
	var rows []row
	for _, cmd := range every {
		rows = append(rows, row{"unknown flag", append(append([]string{}, cmd...), "--no-such-flag"), ExitUsage, nil})
	}
	rows = append(rows,
		// 3: the input.
		row{"unknown config key", []string{"run", "--config", "bad.yaml", "--dry-run"}, ExitUsage, nil},
		row{"bad flag value", []string{"run", "--max-steps", "1.5", "--dry-run"}, ExitUsage, nil},
		row{"bad --set", []string{"run", "--set", "grpo.no_such_key=1", "--dry-run"}, ExitUsage, nil},
		row{"missing model", []string{"run", "--model", missing, "--output-dir", "runs/a"}, ExitUsage, nil},
		row{"missing model", []string{"eval", "--model", missing, "--env", "builtin:echo", "--output-dir", "runs/b"}, ExitUsage, nil},
		row{"missing model", []string{"serve-engine", "--model", missing}, ExitUsage, nil},
		row{"missing model", []string{"serve-vllm", "--model", missing}, ExitUsage, nil},
		row{"sft without --data", []string{"sft", "--model", "m", "--output-dir", "runs/c"}, ExitUsage, nil},
		row{"sft data file missing", []string{"sft", "--model", "m", "--data", missing + ".jsonl", "--output-dir", "runs/d"}, ExitUsage, nil},
		row{"unknown built-in env", []string{"list-tasks", "--env", "builtin:no-such-env"}, ExitUsage, nil},
		row{"unknown built-in env", []string{"env", "serve", "no-such-env"}, ExitUsage, nil},
		row{"env demos without a script", []string{"env", "demos", "no-such-env", "--out", "d.jsonl"}, ExitUsage, nil},
		row{"unknown preset", []string{"init-model", "--preset", "no-such-preset", "--out", "p"}, ExitUsage, nil},
		row{"not a run directory", []string{"report", missing}, ExitUsage, nil},
		row{"no checkpoint to resume", []string{"run", "--model", "m", "--output-dir", "runs/empty", "--resume"}, ExitUsage, nil},
		row{"no worker library", []string{"run", "--model", "m", "--output-dir", "runs/e", "--set", "worker.library=" + missing + ".so"}, ExitUsage, nil},
		row{"unknown decode kernels", []string{"run", "--set", "worker.decode_kernels=fastest", "--dry-run"}, ExitUsage, nil},
		row{"onednn kernels without oneDNN", []string{"run", "--model", "m", "--output-dir", "runs/f", "--set", "worker.decode_kernels=onednn"}, ExitUsage,
			map[string]string{"ORTRAIN_WORKER_ONEDNN": "off", "ORTRAIN_WORKER_LIB": lib}},
		row{"missing OPENREWARD_API_KEY", []string{"list-tasks", "--env", "Eigent/SETA"}, ExitUsage, nil},
		// 1: not the input's fault (or not knowably).
		row{"env server unreachable", []string{"list-tasks", "--env", "http://127.0.0.1:1"}, ExitError, nil},
		row{"env check failures", []string{"env", "check", "http://127.0.0.1:1"}, ExitError, nil},
		// 0.
		row{"ok", []string{"version"}, ExitOK, nil},
		row{"ok", []string{"env", "list"}, ExitOK, nil},
		row{"ok", []string{"list-tasks", "--env", "builtin:echo"}, ExitOK, nil},
		row{"ok", []string{"run", "--dry-run"}, ExitOK, nil},
	)
	for _, r := range rows {
		t.Run(r.name+"/"+filepath.Base(r.args[0])+"_"+r.args[len(r.args)-1], func(t *testing.T) {
			code, _, errOut := 0, "", ""
			if r.env != nil {
				code, _, errOut = execBinary(t, r.env, r.args...)
				assert.Contains(t, errOut, "error: config worker.decode_kernels", "the refusal names the field")
			} else {
				code, _, errOut = execCLI(t, map[string]string{"ORTRAIN_WORKER_LIB": lib}, r.args...)
			}
			assert.Equal(t, r.code, code, "ortrain %v: %s", r.args, errOut)
			if r.code == ExitUsage {
				assert.Contains(t, errOut, "error: ", "a usage error says what is wrong")
			}
		})
	}
	assert.NoDirExists(t, filepath.Join(dir, "runs", "a"), "a start that fails leaves no output directory")
}
