package cli

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/train"
)

// shardYAML shards the optimizer at stage, in buckets small enough (1 MiB)
// that the tiny model's slices start and end inside tensors.
func shardYAML(stage string) string {
	return fmt.Sprintf("  shard: %s\n  bucket_mb: 1\n", stage)
}

// TestShardedRunMatchesOneRank: `run --nproc-per-node P` with the optimizer
// sharded (ZeRO stage 1 or 2) trains as one rank with the same global batch
// (8 rows a micro-batch, gradient accumulation 2), and its checkpoints keep
// the unsharded formats: the weights, and one optimizer file with every
// tensor's whole AdamW state.
func TestShardedRunMatchesOneRank(t *testing.T) {
	f := newDDPFixture(t)
	for _, tc := range []struct {
		stage string
		ranks int
		loss  string
		lora  bool
	}{
		{"optimizer", 2, "dapo", false},
		{"gradients", 4, "grpo", false},
		{"gradients", 2, "dapo", true},
		{"parameters", 2, "grpo", false},
		{"parameters", 4, "dapo", true},
	} {
		name := fmt.Sprintf("%s_%dranks_%s_lora=%v", tc.stage, tc.ranks, tc.loss, tc.lora)
		t.Run(name, func(t *testing.T) {
			cfg1, dir1 := f.writeConfig(t, name+"-1rank", tc.loss, tc.lora, 8, 3)
			runOrtrain(t, f.bin, f.lib, "run", "--config", cfg1)
			cfgP, dirP := f.writeConfig(t, name+"-sharded", tc.loss, tc.lora, 8/tc.ranks, 3, shardYAML(tc.stage))
			runOrtrain(t, f.bin, f.lib, "run", "--config", cfgP, "--nproc-per-node", strconv.Itoa(tc.ranks))
			worlds := []int{tc.ranks, tc.ranks, tc.ranks}
			requireSameRunOn(t, dir1, dirP, tc.lora, worlds)
			requireSameOptimizer(t, dir1, dirP, 3)
			m := stepMetrics(t, dirP)
			if tc.stage == "parameters" {
				// The passes gather each layer; the optimizer step gathers nothing.
				mine, one := lastMemory(t, dirP), lastMemory(t, dir1)
				assert.Positive(t, mine["memory/peak_gathered_bytes"], "stage 3 reports what it gathered")
				for _, k := range []string{"memory/params_bytes", "memory/optimizer_bytes"} {
					assert.InDelta(t, one[k]/float64(tc.ranks), mine[k], 0.01*one[k], "each rank keeps 1/P: %s", k)
				}
			} else {
				assert.Positive(t, m[2]["dist/allgather_mib"], "a sharded step all-gathers the parameters")
			}
			staging, err := os.ReadDir(filepath.Join(dirP, "checkpoints", ".optimizer-shards"))
			if err == nil {
				assert.Empty(t, staging, "rank 0 removes the slices it merged")
			}
		})
	}
}

// lastMemory is the memory/* metrics of a run's last step (rank 0's).
func lastMemory(t *testing.T, runDir string) map[string]float64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(runDir, "metrics.jsonl"))
	require.NoError(t, err)
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	var m map[string]float64
	require.NoError(t, json.Unmarshal(lines[len(lines)-1], &m))
	out := map[string]float64{}
	for k, v := range m {
		if strings.HasPrefix(k, "memory/") {
			out[k] = v
		}
	}
	return out
}

// TestShardedResumeAcrossWorldSize: a run saved by 4 ranks with stage 2,
// or with stage 3, resumes on 2 ranks with stage 1 (and a per-rank batch
// twice as large, so the global batch is the same), and one saved by 2
// ranks with stage 3 resumes on one rank unsharded; the three steps match
// one rank's. A constant learning rate, as the first leg stops at
// max_steps 2 and the schedule follows max_steps.
func TestShardedResumeAcrossWorldSize(t *testing.T) {
	f := newDDPFixture(t)
	write := func(name, dir string, batch, steps int, extra string) string {
		body := strings.Replace(ddpConfig(f.modelDir, dir, "dapo", false, batch, steps),
			"  learning_rate: 1.0e-3\n", "  learning_rate: 1.0e-3\n  lr_scheduler_type: constant\n", 1) + extra
		require.Contains(t, body, "lr_scheduler_type")
		path := filepath.Join(f.work, name+".yaml")
		require.NoError(t, os.WriteFile(path, []byte(body), 0o644))
		return path
	}
	dir1 := filepath.Join(f.work, "one")
	runOrtrain(t, f.bin, f.lib, "run", "--config", write("one", dir1, 8, 3, ""))

	for _, tc := range []struct {
		first, then   string
		ranks, ranks2 int
	}{
		{"gradients", "optimizer", 4, 2},
		{"parameters", "optimizer", 4, 2},
		{"parameters", "none", 2, 1},
	} {
		t.Run(fmt.Sprintf("%s_%d_to_%s_%d", tc.first, tc.ranks, tc.then, tc.ranks2), func(t *testing.T) {
			dir := filepath.Join(f.work, "resized-"+tc.first+strconv.Itoa(tc.ranks))
			runOrtrain(t, f.bin, f.lib, "run", "--config", write(filepath.Base(dir)+"-a", dir, 8/tc.ranks, 2, shardYAML(tc.first)),
				"--nproc-per-node", strconv.Itoa(tc.ranks))
			_, step, err := train.LatestCheckpoint(dir)
			require.NoError(t, err)
			require.Equal(t, 2, step)

			// The same run directory, now fewer ranks with more rows each
			// (the batch shape is a recorded change), another stage, one
			// more step.
			cfg2 := write(filepath.Base(dir)+"-b", dir, 8/tc.ranks2, 3, shardYAML(tc.then))
			args := []string{"run", "--config", cfg2, "--resume", "--resume-with-changes"}
			if tc.ranks2 > 1 {
				args = append(args, "--nproc-per-node", strconv.Itoa(tc.ranks2))
			}
			runOrtrain(t, f.bin, f.lib, args...)
			requireSameRunOn(t, dir1, dir, false, []int{tc.ranks, tc.ranks, tc.ranks2})
			requireSameOptimizer(t, dir1, dir, 3)
		})
	}
}

// requireSameOptimizer checks that two runs' optimizer files of step hold
// the same tensors within float32 noise (AdamW moments of 1e-3-scale
// gradients: 1e-6 absolute).
func requireSameOptimizer(t *testing.T, oneDir, otherDir string, step int) {
	t.Helper()
	read := func(dir string) map[string]model.Tensor {
		path := filepath.Join(dir, "checkpoints", fmt.Sprintf("step-%06d", step), "optimizer.pt")
		meta, tensors, err := model.ReadSafetensors(path)
		require.NoError(t, err)
		assert.Equal(t, "ortrain-adamw", meta.Metadata["format"], path)
		out := map[string]model.Tensor{}
		for _, x := range tensors {
			out[x.Name] = x
		}
		return out
	}
	a, b := read(oneDir), read(otherDir)
	require.Equal(t, len(a), len(b))
	worst := 0.0
	for name, x := range a {
		y, ok := b[name]
		require.True(t, ok, "%s missing", name)
		require.Equal(t, x.Shape, y.Shape, name)
		if name == "step" {
			assert.Equal(t, x.Data, y.Data)
			continue
		}
		require.Equal(t, model.DType("F32"), x.DType, name)
		for i := 0; i+4 <= len(x.Data); i += 4 {
			fa := math.Float32frombits(binary.LittleEndian.Uint32(x.Data[i:]))
			fb := math.Float32frombits(binary.LittleEndian.Uint32(y.Data[i:]))
			worst = max(worst, math.Abs(float64(fa)-float64(fb)))
		}
	}
	t.Logf("max |AdamW state, one rank - sharded| = %.3g", worst)
	assert.LessOrEqual(t, worst, 1e-6)
}

// TestShardedInterruptSavesTheStep: SIGINT to `run --nproc-per-node 2` with
// stage 2 sharding, and with stage 3, whose weights exist only as the
// ranks' slices. The group is usually broken by then (a rank left in the
// middle of a step), so no collective runs at save time: each rank writes
// its optimizer slice and rank 0 merges them into the one checkpoint of the
// last step every rank completed, which both ranks resume from.
func TestShardedInterruptSavesTheStep(t *testing.T) {
	f := newDDPFixture(t)
	for _, stage := range []string{"gradients", "parameters"} {
		t.Run(stage, func(t *testing.T) {
			cfg, dir := f.writeConfig(t, "interrupted-"+stage, "dapo", false, 4, 1000, shardYAML(stage))
			require.NoError(t, os.WriteFile(cfg, bytes.Replace(mustRead(t, cfg), []byte("save_steps: 1"), []byte("save_steps: 0"), 1), 0o644))
			cmd, done, pids, log := startLauncher(t, f, cfg, dir, 2)
			require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
			var err error
			select {
			case err = <-done:
			case <-time.After(2 * time.Minute):
				t.Fatalf("the launcher did not exit within 2 minutes of SIGINT: %s", log)
			}
			var exitErr *exec.ExitError
			require.True(t, errors.As(err, &exitErr), "exit: %v; log: %s", err, log)
			assert.Equal(t, ExitInterrupted, exitErr.ExitCode(), log.String())
			assert.False(t, alive(pids[0]) || alive(pids[1]), "a rank outlived the launcher")
			ckpt, step, err := train.LatestCheckpoint(dir)
			require.NoError(t, err, log.String())
			assert.GreaterOrEqual(t, step, 2)
			meta, tensors, err := model.ReadSafetensors(filepath.Join(ckpt, "optimizer.pt"))
			require.NoError(t, err)
			assert.Equal(t, "ortrain-adamw", meta.Metadata["format"])
			_, weights, err := model.ReadSafetensors(filepath.Join(ckpt, "model", "model.safetensors"))
			require.NoError(t, err)
			assert.Len(t, tensors, 2*len(weights)+1, "both moments of every weight, and the step")
			staging, err := os.ReadDir(filepath.Join(dir, "checkpoints", ".optimizer-shards"))
			if err == nil {
				assert.Empty(t, staging, "rank 0 removes the slices it merged")
			}

			runOrtrain(t, f.bin, f.lib, "run", "--config", cfg, "--resume", "--nproc-per-node", "2", "--max-steps", strconv.Itoa(step+1))
			_, last, err := train.LatestCheckpoint(dir)
			require.NoError(t, err)
			assert.Equal(t, step+1, last)
		})
	}
}
