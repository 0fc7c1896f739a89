package train

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/vllm"
)

// These runs train the quickstart with engine vllm against `ortrain
// serve-engine` replicas that misbehave as a real vLLM can (the stand-in's
// --fault and --emulate-vllm switches): each must fail loudly, before or at
// the first step it would corrupt, with a typed error.

var (
	faultBinOnce sync.Once
	faultBin     string
	faultBinErr  error
)

func ortrainBinary(t *testing.T) string {
	t.Helper()
	faultBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "ortrain-train-test-")
		if err != nil {
			faultBinErr = err
			return
		}
		faultBin = filepath.Join(dir, "ortrain")
		if out, err := exec.Command("go", "build", "-o", faultBin, "../../cmd/ortrain").CombinedOutput(); err != nil {
			faultBinErr = errors.New("go build: " + string(out))
		}
	})
	require.NoError(t, faultBinErr)
	return faultBin
}

// runAgainstServeEngine runs steps of the quickstart with one serve-engine
// replica started with extra flags; it returns the run's error and metrics.
func runAgainstServeEngine(t *testing.T, steps int, lora bool, flags ...string) (error, []map[string]float64) {
	t.Helper()
	requireWorker(t)
	if testing.Short() {
		t.Skip("builds ortrain and launches a serve-engine replica")
	}
	bin := ortrainBinary(t)
	dir := filepath.Join(t.TempDir(), "run")
	cfg := quickstart(t, dir, steps)
	cfg.GRPO.SaveSteps = 0
	cfg.GRPO.LoRA.Enabled = lora
	cfg.Engine.Kind = "vllm"
	cfg.Engine.VLLMReplicas = 1
	cfg.Engine.VLLMCommand = append([]string{"ortrain", "serve-engine", "--threads", "1"}, flags...)
	_, err := Run(context.Background(), cfg, RunOptions{
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel), Getenv: os.Getenv,
		Executable: bin, Environ: os.Environ(),
	})
	var metrics []map[string]float64
	if _, serr := os.Stat(filepath.Join(dir, "metrics.jsonl")); serr == nil {
		metrics = readMetrics(t, dir)
	}
	return err, metrics
}

// TestVLLMRunVerifiesEverySync: against a server that reloads, every
// step's push is verified (the probe's difference is a metric, tiny);
// against one that answers the reload but keeps its weights, the run
// stops at the first step with a StaleWeightsError, full weights and LoRA.
func TestVLLMRunVerifiesEverySync(t *testing.T) {
	for _, lora := range []bool{false, true} {
		err, metrics := runAgainstServeEngine(t, 2, lora)
		require.NoError(t, err, "lora %v", lora)
		require.Len(t, metrics, 2)
		for i, m := range metrics {
			require.Contains(t, m, "engine/sync_probe_logp_difference", "lora %v step %d", lora, i+1)
			assert.Less(t, m["engine/sync_probe_logp_difference"], 1e-3, "lora %v step %d", lora, i+1)
		}
	}
	for _, lora := range []bool{false, true} {
		err, metrics := runAgainstServeEngine(t, 3, lora, "--fault", "reload-noop")
		var stale *engine.StaleWeightsError
		require.ErrorAs(t, err, &stale, "lora %v", lora)
		assert.Equal(t, 1, stale.Step, "lora %v: caught at the first sync", lora)
		assert.Equal(t, lora, stale.LoRA)
		assert.Empty(t, metrics, "lora %v: no step was logged as done", lora)
		t.Logf("lora %v: %v", lora, err)
	}
}

// TestVLLMRunRefusesOlderVLLMAtStart: a vLLM whose reload_weights takes no
// weights_path fails the start (the initial push), not the first step.
func TestVLLMRunRefusesOlderVLLMAtStart(t *testing.T) {
	err, metrics := runAgainstServeEngine(t, 2, false, "--emulate-vllm", "0.14.0")
	var ce *vllm.CapabilityError
	require.ErrorAs(t, err, &ce)
	assert.Contains(t, ce.Missing, "0.14.0")
	assert.Empty(t, metrics)
	t.Log(err)
}

// TestVLLMRunNeverTrainsNullLogprobs: a server that leaves log-probs null
// or omits token ids is refused at the start (the probe's completion),
// before any rollout could read a null as log p = 0.
func TestVLLMRunNeverTrainsNullLogprobs(t *testing.T) {
	for _, fault := range []string{"null-logprobs=1", "no-token-ids"} {
		err, metrics := runAgainstServeEngine(t, 2, false, "--fault", fault)
		var ce *vllm.CapabilityError
		require.ErrorAs(t, err, &ce, fault)
		assert.Empty(t, metrics, fault)
		t.Logf("%s: %v", fault, err)
	}
}
