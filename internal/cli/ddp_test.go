package cli

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
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
	"github.com/ortrain/ortrain/internal/worker"
)

// ddpConfig is a small run with gradient accumulation 2 whose global batch
// is ranks x batch rows per micro-batch.
func ddpConfig(modelDir, out, loss string, lora bool, batch, maxSteps int) string {
	loraYAML := ""
	if lora {
		// No dropout: its masks would differ between one rank and two.
		loraYAML = "  lora: {enabled: true, r: 4, alpha: 8, dropout: 0, target_modules: [q_proj, v_proj]}\n"
	}
	return fmt.Sprintf(`model: %s
output_dir: %s
seed: 11
envs:
  - target: builtin:letters
    split: train
chat:
  system_prompt: "Answer the user."
  final_answer_tool: submit
  render_tools: false
grpo:
  num_generations: 4
  per_device_train_batch_size: %d
  gradient_accumulation_steps: 2
  max_completion_length: 8
  max_tool_calling_iterations: 0
  loss_type: %s
  learning_rate: 1.0e-3
  max_steps: %d
  logging_steps: 1
  save_steps: 1
%srollout:
  max_concurrency: 16
worker:
  device: cpu
  dtype: float32
  threads: 1
  collective_timeout: 20s
`, modelDir, out, batch, loss, maxSteps, loraYAML)
}

// ddpFixture is a built binary, the worker and a tiny model for the
// data-parallel tests.
type ddpFixture struct {
	bin, lib, work, modelDir string
}

func newDDPFixture(t *testing.T) ddpFixture {
	t.Helper()
	f := ddpFixture{lib: requireWorkerLib(t), bin: buildOrtrain(t), work: t.TempDir()}
	f.modelDir = filepath.Join(f.work, "tiny")
	preset, ok := model.PresetByName("tiny")
	require.True(t, ok)
	require.NoError(t, model.Init(f.modelDir, preset, 5))
	return f
}

// writeConfig writes a config for run directory name, with extra YAML
// sections appended, and returns both paths.
func (f ddpFixture) writeConfig(t *testing.T, name, loss string, lora bool, batch, maxSteps int, extra ...string) (cfg, dir string) {
	t.Helper()
	dir = filepath.Join(f.work, name)
	cfg = filepath.Join(f.work, name+".yaml")
	body := ddpConfig(f.modelDir, dir, loss, lora, batch, maxSteps) + strings.Join(extra, "")
	require.NoError(t, os.WriteFile(cfg, []byte(body), 0o644))
	return cfg, dir
}

// finalTensors reads the float32 tensors of a run's checkpoint of step
// (the model, or the adapter of a LoRA run).
func finalTensors(t *testing.T, runDir string, step int, lora bool) map[string][]float32 {
	t.Helper()
	path := filepath.Join(runDir, "checkpoints", fmt.Sprintf("step-%06d", step), "model", "model.safetensors")
	if lora {
		path = filepath.Join(runDir, "checkpoints", fmt.Sprintf("step-%06d", step), "adapter", "adapter_model.safetensors")
	}
	_, tensors, err := model.ReadSafetensors(path)
	require.NoError(t, err)
	out := map[string][]float32{}
	for _, ts := range tensors {
		require.Equal(t, model.DType("F32"), ts.DType, ts.Name)
		v := make([]float32, len(ts.Data)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(ts.Data[4*i:]))
		}
		out[ts.Name] = v
	}
	return out
}

// requireSameRun checks that two runs logged the same reward and loss per
// step and ended with weights within 1e-5 of each other.
func requireSameRun(t *testing.T, oneDir, twoDir string, steps int, lora bool) {
	t.Helper()
	worlds := make([]int, steps)
	for i := range worlds {
		worlds[i] = 2
	}
	requireSameRunOn(t, oneDir, twoDir, lora, worlds)
}

// requireSameRunOn is requireSameRun for a run whose step i ran on
// worlds[i] ranks.
func requireSameRunOn(t *testing.T, oneDir, twoDir string, lora bool, worlds []int) {
	t.Helper()
	steps := len(worlds)
	one, two := stepMetrics(t, oneDir), stepMetrics(t, twoDir)
	require.Len(t, one, steps)
	require.Len(t, two, steps)
	for i := range one {
		if worlds[i] > 1 {
			assert.Equal(t, float64(worlds[i]), two[i]["dist/world_size"], "step %d", i+1)
		} else {
			assert.NotContains(t, two[i], "dist/world_size", "step %d ran on one rank", i+1)
		}
		assert.InDelta(t, one[i]["reward"], two[i]["reward"], 1e-9, "reward of step %d", i+1)
		assert.InDelta(t, one[i]["reward_std"], two[i]["reward_std"], 1e-9, "reward_std of step %d", i+1)
		assert.InDelta(t, one[i]["loss"], two[i]["loss"], 1e-5*max(1, math.Abs(one[i]["loss"])), "loss of step %d", i+1)
		assert.Equal(t, one[i]["num_tokens"], two[i]["num_tokens"], "num_tokens of step %d", i+1)
	}
	a, b := finalTensors(t, oneDir, steps, lora), finalTensors(t, twoDir, steps, lora)
	require.Equal(t, len(a), len(b))
	worst, where := 0.0, ""
	for name, va := range a {
		vb, ok := b[name]
		require.True(t, ok, "tensor %s missing from the two-rank run", name)
		require.Len(t, vb, len(va), name)
		for i := range va {
			if d := math.Abs(float64(va[i]) - float64(vb[i])); d > worst {
				worst, where = d, name
			}
		}
	}
	t.Logf("max |one rank - two ranks| = %.3g (%s)", worst, where)
	assert.LessOrEqual(t, worst, 1e-5, "weights differ most in %s", where)
}

// TestDataParallelMatchesOneRank is issue 15's equality: two ranks
// (`run --nproc-per-node 2`, real processes on Gloo) with a per-rank
// batch of 4 train exactly as one rank with a batch of 8, for the dapo,
// grpo and dr_grpo losses with gradient accumulation 2, full and LoRA.
func TestDataParallelMatchesOneRank(t *testing.T) {
	f := newDDPFixture(t)
	for _, loss := range []string{"dapo", "grpo", "dr_grpo"} {
		for _, lora := range []bool{false, true} {
			name := loss
			if lora {
				name += "_lora"
			}
			t.Run(name, func(t *testing.T) {
				cfg1, dir1 := f.writeConfig(t, name+"-1rank", loss, lora, 8, 3)
				runOrtrain(t, f.bin, f.lib, "run", "--config", cfg1)
				cfg2, dir2 := f.writeConfig(t, name+"-2ranks", loss, lora, 4, 3)
				runOrtrain(t, f.bin, f.lib, "run", "--config", cfg2, "--nproc-per-node", "2")
				requireSameRun(t, dir1, dir2, 3, lora)
				// Rank 0 alone wrote the run directory; every rank logged.
				for _, r := range []string{"rank-0.log", "rank-1.log"} {
					assert.FileExists(t, filepath.Join(dir2, "ranks", r))
				}
			})
		}
	}
}

// startRanksByHand starts two processes whose launcher variables this
// test sets itself, as torchrun or srun would, and waits for both.
func startRanksByHand(t *testing.T, f ddpFixture, cfg string, env func(rank int) []string) {
	t.Helper()
	type result struct {
		rank int
		err  error
		log  *bytes.Buffer
	}
	done := make(chan result, 2)
	for rank := range 2 {
		cmd := exec.Command(f.bin, "run", "--config", cfg, "--log-format", "json")
		cmd.Env = append(append(os.Environ(), worker.EnvLibrary+"="+f.lib), env(rank)...)
		var log bytes.Buffer
		cmd.Stderr = &log
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		go func() { done <- result{rank, cmd.Wait(), &log} }()
	}
	for range 2 {
		select {
		case r := <-done:
			require.NoError(t, r.err, "rank %d: %s", r.rank, r.log)
		case <-time.After(3 * time.Minute):
			t.Fatal("the ranks did not finish within 3 minutes")
		}
	}
}

// TestDataParallelFromLauncherVariables starts the two ranks by hand with
// the variables torchrun (and Kubeflow's PyTorchJob) set, then with the
// ones srun sets, and checks both train as one rank with the global batch.
func TestDataParallelFromLauncherVariables(t *testing.T) {
	f := newDDPFixture(t)
	cfg1, dir1 := f.writeConfig(t, "one", "dapo", false, 8, 3)
	runOrtrain(t, f.bin, f.lib, "run", "--config", cfg1)
	launchers := map[string]func(rank, port int) []string{
		"torchrun": func(rank, port int) []string {
			return []string{"RANK=" + strconv.Itoa(rank), "WORLD_SIZE=2", "LOCAL_RANK=" + strconv.Itoa(rank), "LOCAL_WORLD_SIZE=2",
				"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + strconv.Itoa(port)}
		},
		"slurm": func(rank, port int) []string {
			// srun's step: the rendezvous host is the first of the node
			// list, the port derives from the job id.
			return []string{"SLURM_PROCID=" + strconv.Itoa(rank), "SLURM_NTASKS=2", "SLURM_LOCALID=" + strconv.Itoa(rank),
				"SLURM_STEP_ID=0", "SLURM_JOB_NODELIST=localhost,nonexistent-node", "SLURM_STEP_TASKS_PER_NODE=2",
				"SLURM_JOB_ID=" + strconv.Itoa(port-10000)}
		},
	}
	for _, name := range []string{"torchrun", "slurm"} {
		t.Run(name, func(t *testing.T) {
			cfg2, dir2 := f.writeConfig(t, name, "dapo", false, 4, 3)
			port := freeTCPPort(t)
			startRanksByHand(t, f, cfg2, func(rank int) []string { return launchers[name](rank, port) })
			requireSameRun(t, dir1, dir2, 3, false)
		})
	}
}

// freeTCPPort is a loopback port free now, in [10000, 30000) so that
// the SLURM test can derive it from a job id.
func freeTCPPort(t *testing.T) int {
	t.Helper()
	for range 100 {
		p := 10000 + rand.IntN(20000)
		if portFree(p) {
			return p
		}
	}
	t.Fatal("no free port in [10000, 30000)")
	return 0
}

// portFree reports whether a loopback port can be listened on now.
func portFree(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// rankPIDs are the pids of the launcher's children by RANK.
func rankPIDs(t *testing.T, launcher int) map[int]int {
	t.Helper()
	out := map[int]int{}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", launcher))
	for _, path := range tasks {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				continue
			}
			env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
			if err != nil {
				continue
			}
			for _, kv := range bytes.Split(env, []byte{0}) {
				if r, ok := strings.CutPrefix(string(kv), "RANK="); ok {
					if n, err := strconv.Atoi(r); err == nil {
						out[n] = pid
					}
				}
			}
		}
	}
	return out
}

// alive reports whether pid still runs (zombies count as gone).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

// startLauncher starts `run --nproc-per-node 2` and waits until the run
// has logged steps steps and both ranks are known.
func startLauncher(t *testing.T, f ddpFixture, cfg, dir string, steps int) (*exec.Cmd, <-chan error, map[int]int, *lockedBuffer) {
	t.Helper()
	cmd := exec.Command(f.bin, "run", "--config", cfg, "--nproc-per-node", "2", "--log-format", "json")
	cmd.Env = append(os.Environ(), worker.EnvLibrary+"="+f.lib)
	var log lockedBuffer
	cmd.Stderr = &log
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	waitSteps(t, dir, steps, done)
	pids := rankPIDs(t, cmd.Process.Pid)
	require.Len(t, pids, 2, "rank processes of launcher %d: %v", cmd.Process.Pid, pids)
	return cmd, done, pids, &log
}

// TestDataParallelRankKilled kills one rank with SIGKILL mid-run: every
// process exits non-zero within the collective timeout (20s) + 10s, none
// is left behind, and the last complete checkpoint resumes.
func TestDataParallelRankKilled(t *testing.T) {
	f := newDDPFixture(t)
	cfg, dir := f.writeConfig(t, "killed", "dapo", false, 4, 1000)
	_, done, pids, log := startLauncher(t, f, cfg, dir, 2)
	require.NoError(t, syscall.Kill(pids[1], syscall.SIGKILL))
	killed := time.Now()
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the launcher still runs 30s after rank 1 was killed: %s", log)
	}
	t.Logf("the launcher exited %v after rank 1 was killed: %v", time.Since(killed).Round(time.Millisecond), err)
	var exitErr *exec.ExitError
	require.True(t, errors.As(err, &exitErr), "exit: %v", err)
	assert.NotEqual(t, 0, exitErr.ExitCode())
	assert.Contains(t, log.String(), "rank 1 failed")
	require.Eventually(t, func() bool { return !alive(pids[0]) && !alive(pids[1]) }, 10*time.Second, 50*time.Millisecond, "a rank outlived the launcher")

	ckpt, step, err := train.LatestCheckpoint(dir)
	require.NoError(t, err, "no complete checkpoint: %s", log)
	t.Logf("last complete checkpoint: %s (step %d)", ckpt, step)
	// It resumes, on one rank, for one more step: half the global batch,
	// so a change that must be asked for (and is recorded).
	runOrtrain(t, f.bin, f.lib, "run", "--config", cfg, "--resume", "--resume-with-changes", "--max-steps", strconv.Itoa(step+1))
	recorded, err := os.ReadFile(filepath.Join(dir, "resume-changes.jsonl"))
	require.NoError(t, err)
	assert.Contains(t, string(recorded), `"ranks"`)
	_, last, err := train.LatestCheckpoint(dir)
	require.NoError(t, err)
	assert.Equal(t, step+1, last)
}

// TestDataParallelInterrupt sends SIGINT to `run --nproc-per-node 2`:
// exit code 2, no process left behind, and the step every rank completed
// is saved in one checkpoint.
func TestDataParallelInterrupt(t *testing.T) {
	f := newDDPFixture(t)
	cfg, dir := f.writeConfig(t, "interrupted", "dapo", false, 4, 1000)
	// No periodic checkpoints: the one found is the interrupt's.
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
	ckpts, err := filepath.Glob(filepath.Join(dir, "checkpoints", "step-*"))
	require.NoError(t, err)
	require.Len(t, ckpts, 1, "one checkpoint: %v", ckpts)
	_, step, err := train.LatestCheckpoint(dir)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, step, 2)
	assert.GreaterOrEqual(t, lines(filepath.Join(dir, "metrics.jsonl")), step)

	// Both ranks resume from it and train one more step together.
	runOrtrain(t, f.bin, f.lib, "run", "--config", cfg, "--resume", "--nproc-per-node", "2", "--max-steps", strconv.Itoa(step+1))
	_, last, err := train.LatestCheckpoint(dir)
	require.NoError(t, err)
	assert.Equal(t, step+1, last)
	m := stepMetrics(t, dir)
	require.Len(t, m, step+1, "every step logged once")
	assert.Equal(t, float64(step+1), m[step]["step"])
	assert.Equal(t, 2.0, m[step]["dist/world_size"])
}

// TestDataParallelPeerDiesWithoutLauncher: two ranks started by hand (no
// supervisor to stop the survivor); one is killed with SIGKILL and the
// other notices at its next collective and exits non-zero within the
// collective timeout (20s) + 10s.
func TestDataParallelPeerDiesWithoutLauncher(t *testing.T) {
	f := newDDPFixture(t)
	cfg, dir := f.writeConfig(t, "orphaned", "dapo", false, 4, 1000)
	port := freeTCPPort(t)
	var cmds [2]*exec.Cmd
	var logs [2]lockedBuffer
	done := make(chan error, 1)
	for rank := range 2 {
		cmd := exec.Command(f.bin, "run", "--config", cfg, "--log-format", "json")
		cmd.Env = append(os.Environ(), worker.EnvLibrary+"="+f.lib, "RANK="+strconv.Itoa(rank), "WORLD_SIZE=2",
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port))
		cmd.Stderr = &logs[rank]
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		cmds[rank] = cmd
	}
	go func() { done <- cmds[0].Wait() }()
	waitSteps(t, dir, 2, done)
	require.NoError(t, cmds[1].Process.Kill())
	_ = cmds[1].Wait()
	killed := time.Now()
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("rank 0 still runs 30s after rank 1 was killed: %s", &logs[0])
	}
	t.Logf("rank 0 exited %v after its peer was killed: %v", time.Since(killed).Round(time.Millisecond), err)
	var exitErr *exec.ExitError
	require.True(t, errors.As(err, &exitErr), "exit: %v", err)
	assert.NotEqual(t, 0, exitErr.ExitCode())
	_, _, err = train.LatestCheckpoint(dir)
	assert.NoError(t, err, "rank 0 kept its last complete checkpoint")
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// TestDataParallelSharesReplicas: two ranks sample from the same
// replicas — one `ortrain serve-engine` listed in engine.vllm_urls, or one
// that rank 0 launches (engine.vllm_command) and the other rank learns of
// through the process group. Rank 0 alone pushes each step's weights, the
// other rank follows, and the rewards match one rank on the builtin engine
// with the global batch. With the parameters sharded (ZeRO-3) no rank holds
// the weights whole: both ranks leave their slices, rank 0 pushes what it
// merges from them, and both take part in the check's log-prob pass.
func TestDataParallelSharesReplicas(t *testing.T) {
	f := newDDPFixture(t)
	baseline := map[bool][]map[string]float64{}
	oneRank := func(lora bool) []map[string]float64 {
		if baseline[lora] == nil {
			cfg1, dir1 := f.writeConfig(t, fmt.Sprintf("builtin-lora=%v", lora), "dapo", lora, 8, 3)
			runOrtrain(t, f.bin, f.lib, "run", "--config", cfg1)
			baseline[lora] = stepMetrics(t, dir1)
		}
		return baseline[lora]
	}

	urls := func(t *testing.T) string {
		return "engine:\n  kind: vllm\n  vllm_urls: [" + startServeEngine(t, f) + "]\n  vllm_sync_dir: " + filepath.Join(f.work, "sync-"+t.Name()[strings.LastIndex(t.Name(), "/")+1:]) + "\n"
	}
	launched := func(*testing.T) string {
		return "engine:\n  kind: vllm\n  vllm_replicas: 1\n  vllm_command: [ortrain, serve-engine, --threads, \"1\"]\n"
	}
	tests := []struct {
		name   string
		engine func(t *testing.T) string // the engine section
		rank1  string                    // what rank 1 logs about its replicas, if anything
		shard  string
		lora   bool
	}{
		{"vllm_urls", urls, "", "", false},
		{"launched by rank 0", launched, "sampling from the replicas rank 0 launched", "", false},
		{"vllm_urls parameters sharded", urls, "", "parameters", false},
		{"launched by rank 0 parameters sharded", launched, "sampling from the replicas rank 0 launched", "parameters", false},
		{"launched by rank 0 parameters sharded lora", launched, "", "parameters", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var extra []string
			if tc.shard != "" {
				extra = append(extra, shardYAML(tc.shard)) // the worker section ends the base config
			}
			extra = append(extra, tc.engine(t))
			cfg2, dir2 := f.writeConfig(t, strings.ReplaceAll(tc.name, " ", "-"), "dapo", tc.lora, 4, 3, extra...)
			one := oneRank(tc.lora)
			runOrtrain(t, f.bin, f.lib, "run", "--config", cfg2, "--nproc-per-node", "2", "--log-format", "json")

			two := stepMetrics(t, dir2)
			require.Len(t, two, 3)
			for i := range one {
				assert.InDelta(t, one[i]["reward"], two[i]["reward"], 1e-9, "reward of step %d", i+1)
				assert.Contains(t, two[i], "router/moved_sessions", "step %d reports the router", i+1)
				assert.Zero(t, two[i]["router/moved_sessions"], "step %d: no replica failed", i+1)
			}
			logOf := func(rank int) string {
				return string(mustRead(t, filepath.Join(dir2, "ranks", fmt.Sprintf("rank-%d.log", rank))))
			}
			assert.Equal(t, 3, strings.Count(logOf(0), "synced weights to vLLM"), "rank 0 pushes every step's weights")
			assert.NotContains(t, logOf(1), "synced weights to vLLM", "rank 1 follows without pushing")
			if tc.shard != "" {
				assert.Equal(t, 3, strings.Count(logOf(0), `"probe_logp_difference":`), "every push of the sharded weights is checked")
				slices, err := os.ReadDir(filepath.Join(dir2, "weight-sync-slices"))
				require.NoError(t, err)
				assert.Len(t, slices, 1, "only the last push's slices stay")
			}
			if tc.rank1 != "" {
				assert.Contains(t, logOf(1), tc.rank1)
			}
		})
	}
}

// startServeEngine starts `ortrain serve-engine` on the fixture's model,
// with the dev routes weight syncs need (as vLLM wants them switched on),
// and returns its URL.
func startServeEngine(t *testing.T, f ddpFixture) string {
	t.Helper()
	srv := exec.Command(f.bin, "serve-engine", "--model", f.modelDir, "--port", "0", "--threads", "1", "--worker-lib", f.lib)
	srv.Env = append(os.Environ(), "VLLM_SERVER_DEV_MODE=1")
	stdout, err := srv.StdoutPipe()
	require.NoError(t, err)
	var srvLog lockedBuffer
	srv.Stderr = &srvLog
	require.NoError(t, srv.Start())
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "serve-engine: %s", &srvLog)
	return strings.TrimSpace(line)
}
