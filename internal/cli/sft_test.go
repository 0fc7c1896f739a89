package cli

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/worker"
)

// sftConfigYAML is an SFT run over data with batch rows per micro-batch
// and gradient accumulation 2.
func sftConfigYAML(modelDir, out, data string, batch, maxSteps int) string {
	return fmt.Sprintf(`model: %s
output_dir: %s
seed: 11
chat:
  system_prompt: "Use the tools."
sft:
  data: %s
  per_device_train_batch_size: %d
  gradient_accumulation_steps: 2
  learning_rate: 3.0e-3
  max_steps: %d
  save_steps: 0
worker:
  device: cpu
  dtype: float32
  threads: 1
  collective_timeout: 20s
`, modelDir, out, data, batch, maxSteps)
}

// TestSFTDataParallelMatchesOneRank: `sft --nproc-per-node 2` (real
// processes on Gloo) with 2 rows per rank trains as one rank with 4,
// unsharded, with the optimizer sharded (ZeRO stage 2) and with the
// parameters sharded (stage 3), whose checkpoints hold the same weights and
// the same whole AdamW state.
func TestSFTDataParallelMatchesOneRank(t *testing.T) {
	f := newDDPFixture(t)
	data := filepath.Join(f.work, "demos.jsonl")
	code, _, errOut := execCLI(t, nil, "env", "demos", "lockbox", "--n", "24", "--skill", "0.5", "--out", data)
	require.Equal(t, ExitOK, code, errOut)
	evalData := filepath.Join(f.work, "eval.jsonl")
	code, _, errOut = execCLI(t, nil, "env", "demos", "lockbox", "--n", "5", "--skill", "0.5", "--out", evalData)
	require.Equal(t, ExitOK, code, errOut)
	write := func(name string, batch int, extra string) (string, string) {
		dir := filepath.Join(f.work, name)
		cfg := filepath.Join(f.work, name+".yaml")
		// 5 held-out rows: the two ranks score 3 and 2 of them.
		body := strings.Replace(sftConfigYAML(f.modelDir, dir, data, batch, 3), "  save_steps: 0\n", "  save_steps: 0\n  eval_data: "+evalData+"\n  eval_steps: 1\n", 1)
		require.NoError(t, os.WriteFile(cfg, []byte(body+extra), 0o644))
		return cfg, dir
	}
	cfg1, dir1 := write("sft-1rank", 4, "")
	out1 := ortrainStdout(t, f.bin, f.lib, "sft", "--config", cfg1)
	assert.Equal(t, filepath.Join(dir1, "checkpoints", "step-000003", "model"), out1, "sft prints what run --model takes")
	for _, shard := range []string{"none", "gradients", "parameters"} {
		t.Run("shard="+shard, func(t *testing.T) {
			cfg2, dir2 := write("sft-2ranks-"+shard, 2, shardYAML(shard))
			out2 := ortrainStdout(t, f.bin, f.lib, "sft", "--config", cfg2, "--nproc-per-node", "2")
			// model=$(ortrain sft ...); ortrain run --model "$model": the
			// same stdout with two ranks as with one.
			assert.Equal(t, filepath.Join(dir2, "checkpoints", "step-000003", "model"), out2)
			assert.FileExists(t, filepath.Join(out2, "config.json"))

			one, two := metricsRows(t, dir1), metricsRows(t, dir2)
			require.Len(t, one, 3)
			require.Len(t, two, 3)
			for i := range one {
				for _, k := range []string{"loss", "mean_token_accuracy", "grad_norm", "eval_loss"} {
					assert.InDelta(t, one[i][k], two[i][k], 1e-5*max(1, math.Abs(one[i][k])), "%s of step %d", k, i+1)
				}
				assert.Equal(t, one[i]["num_tokens"], two[i]["num_tokens"], "step %d", i+1)
			}
			a, b := finalTensors(t, dir1, 3, false), finalTensors(t, dir2, 3, false)
			require.Equal(t, len(a), len(b))
			worst := 0.0
			for name, va := range a {
				vb := b[name]
				require.Len(t, vb, len(va), name)
				for i := range va {
					worst = max(worst, math.Abs(float64(va[i])-float64(vb[i])))
				}
			}
			assert.LessOrEqual(t, worst, 1e-5)
			requireSameOptimizer(t, dir1, dir2, 3)
			assert.FileExists(t, filepath.Join(dir2, "ranks", "rank-1.log"))
		})
	}
}

func TestSFTUsageErrors(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "d.jsonl")
	require.NoError(t, os.WriteFile(data, []byte("not json\n"), 0o644))
	cases := []struct {
		name string
		args []string
		code int
	}{
		{"no data", []string{"sft", "--output-dir", filepath.Join(dir, "a")}, ExitUsage},
		{"bad learning rate", []string{"sft", "--data", data, "--learning-rate", "-1"}, ExitUsage},
		{"resume and overwrite", []string{"sft", "--data", data, "--resume", "--overwrite"}, ExitUsage},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := execCLI(t, nil, tc.args...)
			assert.Equal(t, tc.code, code, errOut)
		})
	}
	code, out, _ := execCLI(t, nil, "sft", "--help")
	require.Equal(t, ExitOK, code)
	for _, s := range []string{"assistant", "--data", "ortrain env demos", "--resume"} {
		assert.Contains(t, out, s)
	}
	code, out, errOut := execCLI(t, nil, "sft", "--data", data, "--print-config")
	require.Equal(t, ExitOK, code, errOut)
	assert.True(t, strings.Contains(out, "sft:") && strings.Contains(out, "assistant_only_loss: true"), out)
}

// ortrainStdout runs the binary and returns its stdout, trimmed.
func ortrainStdout(t *testing.T, bin, lib string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), worker.EnvLibrary+"="+lib)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "ortrain %v: %s", args, &stderr)
	return strings.TrimSpace(stdout.String())
}
