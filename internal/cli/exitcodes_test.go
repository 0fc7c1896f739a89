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
	}
	var rows []row
	for _, cmd := range every {
		rows = append(rows, row{"unknown flag", append(append([]string{}, cmd...), "--no-such-flag"), ExitUsage})
	}
	rows = append(rows,
		// 3: the input.
		row{"unknown config key", []string{"run", "--config", "bad.yaml", "--dry-run"}, ExitUsage},
		row{"bad flag value", []string{"run", "--max-steps", "1.5", "--dry-run"}, ExitUsage},
		row{"bad --set", []string{"run", "--set", "grpo.no_such_key=1", "--dry-run"}, ExitUsage},
		row{"missing model", []string{"run", "--model", missing, "--output-dir", "runs/a"}, ExitUsage},
		row{"missing model", []string{"eval", "--model", missing, "--env", "builtin:echo", "--output-dir", "runs/b"}, ExitUsage},
		row{"missing model", []string{"serve-engine", "--model", missing}, ExitUsage},
		row{"missing model", []string{"serve-vllm", "--model", missing}, ExitUsage},
		row{"sft without --data", []string{"sft", "--model", "m", "--output-dir", "runs/c"}, ExitUsage},
		row{"sft data file missing", []string{"sft", "--model", "m", "--data", missing + ".jsonl", "--output-dir", "runs/d"}, ExitUsage},
		row{"unknown built-in env", []string{"list-tasks", "--env", "builtin:no-such-env"}, ExitUsage},
		row{"unknown built-in env", []string{"env", "serve", "no-such-env"}, ExitUsage},
		row{"env demos without a script", []string{"env", "demos", "no-such-env", "--out", "d.jsonl"}, ExitUsage},
		row{"unknown preset", []string{"init-model", "--preset", "no-such-preset", "--out", "p"}, ExitUsage},
		row{"not a run directory", []string{"report", missing}, ExitUsage},
		row{"no checkpoint to resume", []string{"run", "--model", "m", "--output-dir", "runs/empty", "--resume"}, ExitUsage},
		row{"no worker library", []string{"run", "--model", "m", "--output-dir", "runs/e", "--set", "worker.library=" + missing + ".so"}, ExitUsage},
		row{"missing OPENREWARD_API_KEY", []string{"list-tasks", "--env", "Eigent/SETA"}, ExitUsage},
		// 1: not the input's fault (or not knowably).
		row{"env server unreachable", []string{"list-tasks", "--env", "http://127.0.0.1:1"}, ExitError},
		row{"env check failures", []string{"env", "check", "http://127.0.0.1:1"}, ExitError},
		// 0.
		row{"ok", []string{"version"}, ExitOK},
		row{"ok", []string{"env", "list"}, ExitOK},
		row{"ok", []string{"list-tasks", "--env", "builtin:echo"}, ExitOK},
		row{"ok", []string{"run", "--dry-run"}, ExitOK},
	)
	for _, r := range rows {
		t.Run(r.name+"/"+filepath.Base(r.args[0])+"_"+r.args[len(r.args)-1], func(t *testing.T) {
			code, _, errOut := execCLI(t, map[string]string{"ORTRAIN_WORKER_LIB": lib}, r.args...)
			assert.Equal(t, r.code, code, "ortrain %v: %s", r.args, errOut)
			if r.code == ExitUsage {
				assert.Contains(t, errOut, "error: ", "a usage error says what is wrong")
			}
		})
	}
	assert.NoDirExists(t, filepath.Join(dir, "runs", "a"), "a start that fails leaves no output directory")
}
