package train

import (
	"context"
	"math"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/rollout"
)

// TestAgentRolloutsTrain: a run whose rollouts are played by a Python
// agent (standard library only, a real process per rollout) through the
// gateway and the env's MCP tools trains for a few steps on the real
// worker: every rollout is the agent's, at least two model calls each, the
// loss covers only sampled tokens with the engine's log-probs, the agent's
// reward is scored, and forks are reported.
func TestAgentRolloutsTrain(t *testing.T) {
	requireWorker(t)
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed")
	}
	script, err := filepath.Abs("../agentrollout/testdata/tool_agent.py")
	require.NoError(t, err)
	out := filepath.Join(t.TempDir(), "run")
	cfg := quickstart(t, out, 2)
	cfg.Envs = []config.EnvConfig{{Target: "builtin:lockbox", Split: "train", Weight: 1}}
	cfg.Chat.FinalAnswerTool = ""
	cfg.Chat.RenderTools = true
	cfg.Agent.Command = []string{py, script}
	cfg.GRPO.SaveSteps = 0
	cfg.GRPO.NumGenerations, cfg.GRPO.PerDeviceTrainBatchSize = 2, 4
	require.NoError(t, cfg.Validate())

	var mu sync.Mutex
	var trajs []*rollout.Trajectory
	_, err = Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: func(string) string { return "" },
		OnRollout: func(tr *rollout.Trajectory) {
			mu.Lock()
			trajs = append(trajs, tr)
			mu.Unlock()
		}})
	require.NoError(t, err)
	metrics := readMetrics(t, out)
	require.Len(t, metrics, 2)
	for _, m := range metrics {
		assert.Contains(t, m, "agent/prefix_breaks")
		assert.Contains(t, m, "rewards/agent/mean")
		assert.False(t, math.IsNaN(m["loss"]))
	}
	require.Len(t, trajs, 2*cfg.GRPO.PerDeviceTrainBatchSize)
	for _, tr := range trajs {
		require.True(t, tr.Agent)
		require.False(t, tr.Outcome.Failed(), "%s: %v", tr.Outcome, tr.Err)
		require.NotNil(t, tr.AgentReward)
		assert.Equal(t, 0.5, *tr.AgentReward)
		calls := 0
		for _, turn := range tr.Turns {
			if turn.Role == "assistant" {
				calls++
			}
		}
		assert.GreaterOrEqual(t, calls, 2, "the agent calls the model at least twice")
		seqs := append([]rollout.Fork{{Tokens: tr.Tokens, PromptLen: tr.PromptLen, LossMask: tr.LossMask, Logprobs: tr.Logprobs}}, tr.Forks...)
		assert.Len(t, seqs, tr.PrefixBreaks+1)
		for _, s := range seqs {
			require.Len(t, s.LossMask, len(s.Tokens)-s.PromptLen)
			for i, m := range s.LossMask {
				if m == 0 {
					assert.Zero(t, s.Logprobs[i], "no log-prob on tokens the agent sent")
				} else {
					assert.LessOrEqual(t, s.Logprobs[i], float32(0), "the sampler's log-prob")
				}
			}
		}
	}
}
