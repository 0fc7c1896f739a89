package train

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/rollout"
)

// agentRun is the quickstart turned into an agent run on lockbox: the
// tool agent in ../agentrollout/testdata (python3 and its script, returned
// for commands that wrap it), steps steps of 2 generations x 4 rollouts.
// It skips where python3 is missing.
func agentRun(t *testing.T, out string, steps int) (*config.Config, string, string) {
	t.Helper()
	requireWorker(t)
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed")
	}
	script, err := filepath.Abs("../agentrollout/testdata/tool_agent.py")
	require.NoError(t, err)
	cfg := quickstart(t, out, steps)
	cfg.Envs = []config.EnvConfig{{Target: "builtin:lockbox", Split: "train", Weight: 1}}
	cfg.Chat.FinalAnswerTool = ""
	cfg.Chat.RenderTools = true
	cfg.Agent.Command = []string{py, script}
	cfg.GRPO.SaveSteps = 0
	cfg.GRPO.NumGenerations, cfg.GRPO.PerDeviceTrainBatchSize = 2, 4
	return cfg, py, script
}

// TestAgentRolloutsTrain: a run whose rollouts are played by a Python
// agent (standard library only, a real process per rollout) through the
// gateway and the env's MCP tools trains for a few steps on the real
// worker: every rollout is the agent's, at least two model calls each, the
// loss covers only sampled tokens with the engine's log-probs, the agent's
// reward is scored, and forks are reported.
func TestAgentRolloutsTrain(t *testing.T) {
	for _, async := range []int{0, 1} {
		t.Run(fmt.Sprintf("max_off_policy_steps=%d", async), func(t *testing.T) { testAgentRolloutsTrain(t, async) })
	}
}

// testAgentRolloutsTrain runs it synchronously (async 0) or with rounds a
// step ahead of training (async 1: each rollout's calls are served by the
// round's sampler copy and stamped with its version; stale groups, forks
// included, are dropped).
func testAgentRolloutsTrain(t *testing.T, async int) {
	out := filepath.Join(t.TempDir(), "run")
	cfg, _, _ := agentRun(t, out, 3)
	cfg.Async.MaxOffPolicySteps = async
	require.NoError(t, cfg.Validate())

	var mu sync.Mutex
	var trajs []*rollout.Trajectory
	_, err := Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: func(string) string { return "" },
		OnRollout: func(tr *rollout.Trajectory) {
			mu.Lock()
			trajs = append(trajs, tr)
			mu.Unlock()
		}})
	require.NoError(t, err)
	metrics := readMetrics(t, out)
	require.Len(t, metrics, 3)
	for _, m := range metrics {
		assert.Contains(t, m, "agent/prefix_breaks")
		assert.Contains(t, m, "rewards/agent/mean")
		assert.Greater(t, m["memory/peak_rss_bytes"], 0.0)
		assert.NotContains(t, m, "memory/peak_allocated_bytes", "a CPU run has no device allocator peak")
		assert.False(t, math.IsNaN(m["loss"]))
	}
	require.GreaterOrEqual(t, len(trajs), 3*cfg.GRPO.PerDeviceTrainBatchSize)
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

// TestAbsoluteArgs: relative arguments naming existing files become
// absolute (the agent runs elsewhere); programs on PATH, flags and other
// words stay as written.
func TestAbsoluteArgs(t *testing.T) {
	abs, err := filepath.Abs("agent.go")
	require.NoError(t, err)
	assert.Equal(t, []string{"python3", abs, "-v", "no-such-file", "/bin/sh"},
		absoluteArgs([]string{"python3", "agent.go", "-v", "no-such-file", "/bin/sh"}))
}

// TestMisbehavingAgentsDoNotStopTheRun: among a run's agents one crashes,
// one hangs past the episode timeout, one reaches into a neighbour's
// endpoint with its own key and one rewrites its history; the run
// completes, each misbehaving rollout is classified and masked, the forks
// are counted and trained.
func TestMisbehavingAgentsDoNotStopTheRun(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	cfg, py, script := agentRun(t, out, 2)
	cfg.Rollout.EpisodeTimeout = 3 * time.Second
	cfg.Rollout.MaxFailureFraction = 0.75
	cfg.Agent.KillGrace = 200 * time.Millisecond
	// The rollout's number picks the behaviour: 1 crash, 2 hang, 3 steal,
	// then every rollout of the second step rewrites its history.
	cfg.Agent.Command = []string{"/bin/sh", "-c", `n=${ORTRAIN_ROLLOUT_ID##*-}
case $n in
1) kill -SEGV $$ ;;
2) sleep 60 ;;
3) AGENT_STEAL=1 exec "$0" "$1" ;;
[5-8]) AGENT_REWRITE=1 exec "$0" "$1" ;;
*) exec "$0" "$1" ;;
esac`, py, script}
	require.NoError(t, cfg.Validate())
	var mu sync.Mutex
	outcomes := map[rollout.Outcome]int{}
	_, err := Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: func(string) string { return "" },
		OnRollout: func(tr *rollout.Trajectory) {
			mu.Lock()
			outcomes[tr.Outcome]++
			mu.Unlock()
		}})
	require.NoError(t, err, "the run completes")
	assert.Equal(t, 1, outcomes[rollout.OutcomeAgentError], "%v", outcomes)
	assert.Equal(t, 1, outcomes[rollout.OutcomeAgentTimeout], "%v", outcomes)
	assert.GreaterOrEqual(t, outcomes[rollout.OutcomeAgentBadRequest], 1, "%v", outcomes)
	metrics := readMetrics(t, out)
	require.Len(t, metrics, 2)
	assert.Equal(t, 4.0, metrics[1]["agent/prefix_breaks"], "each rollout of step 2 rewrote its history once")
}

// TestAgentRolloutsOnVLLMReplicas: agents served from the vLLM path (two
// `ortrain serve-engine` replicas standing in for vLLM): every call of a
// rollout goes to one replica (its session key is the rollout), the run
// trains and pushes its weights to the replicas.
func TestAgentRolloutsOnVLLMReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("builds ortrain and launches two replicas")
	}
	dir := filepath.Join(t.TempDir(), "run")
	cfg, _, _ := agentRun(t, dir, 2)
	bin := filepath.Join(t.TempDir(), "ortrain")
	out, err := exec.Command("go", "build", "-o", bin, "../../cmd/ortrain").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	cfg.GRPO.PerDeviceTrainBatchSize = 8
	cfg.Engine.Kind = "vllm"
	cfg.Engine.VLLMReplicas = 2
	cfg.Engine.VLLMCommand = []string{"ortrain", "serve-engine", "--threads", "1"}
	require.NoError(t, cfg.Validate())
	var mu sync.Mutex
	failed := 0
	_, err = Run(context.Background(), cfg, RunOptions{
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel), Getenv: os.Getenv,
		Executable: bin, Environ: os.Environ(),
		OnRollout: func(tr *rollout.Trajectory) {
			mu.Lock()
			if tr.Outcome.Failed() {
				failed++
			}
			mu.Unlock()
		}})
	require.NoError(t, err)
	assert.Zero(t, failed)
	metrics := readMetrics(t, dir)
	require.Len(t, metrics, 2)
	for _, m := range metrics {
		assert.Zero(t, m["router/moved_sessions"], "a rollout's calls stay on its replica")
		assert.Less(t, m["router/max_replica_share"], 1.0, "both replicas serve")
		assert.Contains(t, m, "time/sync")
	}
}

// TestAgentCommandMustExist: a program that is not there stops the run
// before it starts, naming agent.command.
func TestAgentCommandMustExist(t *testing.T) {
	requireWorker(t)
	out := filepath.Join(t.TempDir(), "run")
	cfg := quickstart(t, out, 1)
	cfg.Envs = []config.EnvConfig{{Target: "builtin:lockbox", Split: "train", Weight: 1}}
	cfg.Chat.FinalAnswerTool = ""
	cfg.Agent.Command = []string{"no-such-agent-program", "x.py"}
	ro := RunOptions{Logger: zerolog.Nop(), Getenv: func(string) string { return "" }}
	_, err := Run(context.Background(), cfg, ro)
	var fe *config.FieldError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, "agent.command", fe.Field)
	err = Check(context.Background(), cfg, ro, func(string, string) {})
	require.ErrorAs(t, err, &fe, "--dry-run says so too")
	assert.Equal(t, "agent.command", fe.Field)
}
