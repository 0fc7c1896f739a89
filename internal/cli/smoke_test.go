package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// smokeConfig writes configs/seta.yaml with a local Qwen3 directory (its
// real tokenizer and template from testdata, Qwen3-4B's config.json, no
// weights) for the model and builtin:lockbox for the hosted env.
func smokeConfig(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	model := filepath.Join(dir, "Qwen3-4B")
	require.NoError(t, os.MkdirAll(model, 0o755))
	for _, f := range []string{"../../testdata/models/qwen3-4b/config.json", "../../testdata/tokenizers/qwen3/tokenizer.json.gz", "../../testdata/tokenizers/qwen3/tokenizer_config.json"} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(model, filepath.Base(f)), b, 0o644))
	}
	b, err := os.ReadFile("../../configs/seta.yaml")
	require.NoError(t, err)
	y := strings.Replace(string(b), "model: Qwen/Qwen3-4B", "model: "+model, 1)
	y = strings.Replace(y, "target: Eigent/SETA", "target: builtin:lockbox", 1)
	y = strings.Replace(y, "output_dir: runs/seta", "output_dir: "+filepath.Join(dir, "never"), 1)
	path := filepath.Join(dir, "seta.yaml")
	require.NoError(t, os.WriteFile(path, []byte(y), 0o644))
	return path
}

// TestRunSmoke: `run --smoke` on the SETA recipe passes on CPU, writes the
// JUnit and JSON verdicts, and leaves the config's output_dir alone.
func TestRunSmoke(t *testing.T) {
	requireWorkerLib(t)
	cfg := smokeConfig(t)
	out := t.TempDir()
	env := map[string]string{"ORTRAIN_WORKER_LIB": os.Getenv("ORTRAIN_WORKER_LIB")}
	code, stdout, errOut := execCLI(t, env, "run", "--config", cfg, "--smoke",
		"--smoke-json", filepath.Join(out, "smoke.json"), "--smoke-junit", filepath.Join(out, "smoke.xml"))
	require.Equal(t, ExitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, errOut)
	assert.Contains(t, stdout, "PASS: 7 passed, 0 failed")
	var v struct {
		Passed bool
		Checks []struct{ Name, Status string }
	}
	b, err := os.ReadFile(filepath.Join(out, "smoke.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &v))
	assert.True(t, v.Passed)
	assert.FileExists(t, filepath.Join(out, "smoke.xml"))
	assert.NoDirExists(t, filepath.Join(filepath.Dir(cfg), "never"), "a smoke run trains in its own directory")
}

func TestRunSmokeUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"run", "--smoke", "--resume"},
		{"run", "--smoke", "--overwrite"},
		{"run", "--smoke", "--smoke-json", "-", "--smoke-junit", "-"},
	} {
		code, _, errOut := execCLI(t, nil, args...)
		assert.Equal(t, ExitUsage, code, "%v: %s", args, errOut)
	}
}
