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
	cfgJSON := `{"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "bos_token_id": 151643, "eos_token_id": 151645,
  "head_dim": 128, "hidden_act": "silu", "hidden_size": 2560, "intermediate_size": 9728, "max_position_embeddings": 40960,
  "max_window_layers": 36, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 151936}`
	require.NoError(t, os.WriteFile(filepath.Join(model, "config.json"), []byte(cfgJSON), 0o644))
	for _, f := range []string{"tokenizer.json.gz", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join("../../testdata/tokenizers/qwen3", f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(model, f), b, 0o644))
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
