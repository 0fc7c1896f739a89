package train

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/rollout"
)

// TestAgentGroupsSampleDistinctly: an agent that sends no seed and one
// that sends the same seed with every call both give a group of distinct
// samples on the real worker (the gateway seeds each call from the
// rollout's seed; the fixed seed is overridden and counted), and no group
// is token-identical.
func TestAgentGroupsSampleDistinctly(t *testing.T) {
	for _, tc := range []struct {
		name string
		seed string
	}{{"no seed sent", ""}, {"the same seed every call", "7"}} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "run")
			cfg, py, script := agentRun(t, out, 2)
			cfg.Agent.Command = []string{"/usr/bin/env", "AGENT_SEED=" + tc.seed, py, script}
			require.NoError(t, cfg.Validate())
			var mu sync.Mutex
			groups := map[[2]int][][]int32{} // (task index, policy version: the round) → completions
			_, err := Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: func(string) string { return "" },
				OnRollout: func(tr *rollout.Trajectory) {
					mu.Lock()
					defer mu.Unlock()
					assert.False(t, tr.Outcome.Failed(), "%s: %v", tr.Outcome, tr.Err)
					k := [2]int{tr.Task.Index, tr.Task.Version}
					groups[k] = append(groups[k], tr.Tokens[tr.PromptLen:])
				}})
			require.NoError(t, err)
			for task, samples := range groups {
				require.GreaterOrEqual(t, len(samples), cfg.GRPO.NumGenerations, "task %v", task)
				distinct := 0
				for i, s := range samples {
					if !slices.ContainsFunc(samples[:i], func(o []int32) bool { return slices.Equal(o, s) }) {
						distinct++
					}
				}
				assert.Greater(t, distinct, 1, "the rollouts of task %v sample differently", task)
			}
			for _, m := range readMetrics(t, out) {
				assert.Zero(t, m["rollouts/identical_groups"])
				if tc.seed != "" {
					assert.Greater(t, m["agent/seed_overridden"], 0.0, "the agent's own seed is overridden and counted")
				} else {
					assert.Zero(t, m["agent/seed_overridden"])
				}
				assert.Greater(t, m["agent/sampling_overridden"], 0.0, "its temperature 0 is overridden and counted")
			}
		})
	}
}

// TestFailedAgentIsReadable: an agent that fails says why: its stderr tail
// (the key redacted) is kept in trajectories.jsonl beside the error, and
// the run goes on with the others.
func TestFailedAgentIsReadable(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	cfg, py, script := agentRun(t, out, 1)
	cfg.Rollout.MaxFailureFraction = 0.75
	cfg.Logging.LogCompletions = true
	// Odd rollouts fail loudly on stderr, the others play the episode.
	cfg.Agent.Command = []string{"/bin/sh", "-c", `n=${ORTRAIN_ROLLOUT_ID##*-}
if [ $((n % 2)) = 1 ]; then echo "connecting with $OPENAI_API_KEY" >&2; echo "Traceback: ModelNotFound" >&2; exit 1; fi
exec "$0" "$1"`, py, script}
	require.NoError(t, cfg.Validate())
	_, err := Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: func(string) string { return "" }})
	require.NoError(t, err)
	f, err := os.Open(filepath.Join(out, "trajectories.jsonl"))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<22)
	failed := 0
	for sc.Scan() {
		var rec map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &rec))
		if rec["outcome"] != "agent_error" {
			assert.NotContains(t, rec, "agent_stderr")
			continue
		}
		failed++
		assert.Contains(t, rec["error"], "exit")
		assert.Contains(t, rec["agent_stderr"], "Traceback: ModelNotFound")
		assert.Contains(t, rec["agent_stderr"], "connecting with [REDACTED]")
		assert.NotContains(t, rec["agent_stderr"], "sk-ortrain-")
	}
	assert.Equal(t, cfg.GRPO.PerDeviceTrainBatchSize/2, failed)
}

// TestOversizedAgentPromptIsRefused: agents that send prompts far beyond
// the model's context (100,000 characters to the tiny model, and a 15 MB
// body) are refused with context_length_exceeded before the worker sees
// them (agent_bad_request, naming the reason); the run trains on the other
// rollouts and its memory stays bounded.
func TestOversizedAgentPromptIsRefused(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	cfg, py, script := agentRun(t, out, 1)
	cfg.Rollout.MaxFailureFraction = 0.75
	cfg.Logging.LogCompletions = true
	// Odd rollouts send one huge prompt; the others play the episode.
	huge := `import json, os, urllib.request, urllib.error
n = int(os.environ["ORTRAIN_ROLLOUT_ID"].rsplit("-", 1)[1])
size = 100000 if n % 4 == 1 else 15000000
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * size}]}).encode()
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body, method="POST",
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
try:
    urllib.request.urlopen(req, timeout=60)
except urllib.error.HTTPError as e:
    print(e.code, e.read()[:300], flush=True)
except OSError as e:   # the server may close while a 15 MB body is still being sent
    print("refused:", e, flush=True)
`
	cfg.Agent.Command = []string{"/bin/sh", "-c", `n=${ORTRAIN_ROLLOUT_ID##*-}
if [ $((n % 2)) = 1 ]; then exec "$0" -c "$2"; fi
exec "$0" "$1"`, py, script, huge}
	require.NoError(t, cfg.Validate())
	_, err := Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: func(string) string { return "" }})
	require.NoError(t, err)
	m := readMetrics(t, out)
	require.Len(t, m, 1)
	assert.Equal(t, float64(cfg.GRPO.PerDeviceTrainBatchSize/2), m[0]["rollouts/agent_bad_request"])
	assert.Less(t, m[0]["memory/peak_rss_bytes"], float64(1<<30), "the huge prompts never reached the worker")
	f, err := os.Open(filepath.Join(out, "trajectories.jsonl"))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<22)
	refused := 0
	for sc.Scan() {
		var rec map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &rec))
		if rec["outcome"] == "agent_bad_request" {
			refused++
			assert.Contains(t, rec["error"], "/chat/completions answered 4")
		} else {
			t.Logf("outcome %v: %v", rec["outcome"], rec["error"])
		}
	}
	assert.Equal(t, cfg.GRPO.PerDeviceTrainBatchSize/2, refused)
}
