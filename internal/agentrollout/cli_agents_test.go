package agentrollout

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/agent"
	"github.com/ortrain/ortrain/internal/gateway"
	"github.com/ortrain/ortrain/internal/rollout"
	"github.com/ortrain/ortrain/internal/testclients"
)

// The two coding-agent CLIs pinned in scripts/test-clients, run unchanged
// through their example wrappers (docs/examples/agents) as a rollout's
// agent: the scripted policy has them call the env's tools over MCP (open
// the envelope, unlock with the code its answer shows), then answer.

// cliRollout is one rollout played by a CLI agent, with what the engine
// recorded.
type cliRollout struct {
	tr    *rollout.Trajectory
	calls []engineCall
}

// runCLIAgent plays one lockbox rollout with the wrapper argv and env.
func runCLIAgent(t *testing.T, argv, env []string) cliRollout {
	t.Helper()
	h := newHarness(t, "builtin:lockbox", "ors", agent.Spec{Command: argv, Env: env, Timeout: 90 * time.Second, KillGrace: 2 * time.Second})
	// Both CLIs name an MCP tool by its server ("env"): mcp__env__unlock.
	h.model.toolPrefix = "mcp__env__"
	start := time.Now()
	tr := h.runner.Run(context.Background(), rollout.Task{Split: "train", Index: 5, Version: 2})
	t.Logf("rollout took %s, outcome %s", time.Since(start).Round(time.Millisecond), tr.Outcome)
	require.Equal(t, rollout.OutcomeDone, tr.Outcome, "%v\nstderr: %s", tr.Err, tr.AgentStderr)
	return cliRollout{tr: tr, calls: h.model.recorded()}
}

func exampleAgent(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("../../docs/examples/agents", name))
	require.NoError(t, err)
	return p
}

// checkCLIRollout asserts what both CLIs' rollouts share: the box was
// unlocked with the code read through MCP, the model calls up to the
// unlock are one sequence whose trained tokens are exactly the sampled
// ids with the engine's log-probs, and the call the CLI made after the
// episode ended (the tool's answer sent back) is counted, not trained.
func checkCLIRollout(t *testing.T, r cliRollout, kind gateway.CallKind) {
	t.Helper()
	tr := r.tr
	assert.True(t, tr.Agent)
	assert.Equal(t, 2, tr.ToolCalls, "open_envelope, then unlock")
	assert.Zero(t, tr.ToolFailures)
	require.Len(t, tr.Rewards, 2)
	require.NotNil(t, tr.Rewards[1])
	assert.Equal(t, 1.0, *tr.Rewards[1], "the code read from the envelope unlocked the box")
	require.Len(t, r.calls, 3, "open, unlock, then the answer after the tool's result")
	assert.Equal(t, 1, tr.AgentCalls.AfterFinish, "the answer came after unlock ended the episode")
	assert.Zero(t, tr.AgentCalls.ToolCallsAfterFinish)
	for _, turn := range tr.Turns {
		assert.NotContains(t, turn.Text, "Done.", "the call after the end is not in the transcript")
	}
	t.Logf("prompt tokens per call: %d, %d, %d", len(r.calls[0].req.PromptIDs), len(r.calls[1].req.PromptIDs), len(r.calls[2].req.PromptIDs))

	calls := r.calls[:2]
	assert.Zero(t, tr.PrefixBreaks, "the CLI re-sends its history: each prompt extends the last prompt and completion")
	assert.Empty(t, tr.Forks)
	prev := calls[0]
	require.Equal(t, append(slices.Clone(prev.req.PromptIDs), prev.res.IDs...), calls[1].req.PromptIDs[:len(prev.req.PromptIDs)+len(prev.res.IDs)])
	assert.Equal(t, calls[0].req.PromptIDs, tr.Tokens[:tr.PromptLen])
	last := calls[1]
	assert.Equal(t, append(slices.Clone(last.req.PromptIDs), last.res.IDs...), tr.Tokens)
	var sampled, masked []int32
	var lps, maskedLps []float32
	for _, c := range calls {
		sampled = append(sampled, c.res.IDs...)
		lps = append(lps, c.res.Logprobs...)
	}
	completion := tr.Tokens[tr.PromptLen:]
	require.Len(t, tr.LossMask, len(completion))
	for i, m := range tr.LossMask {
		if m == 1 {
			masked = append(masked, completion[i])
			maskedLps = append(maskedLps, tr.Logprobs[i])
		} else {
			assert.Zero(t, tr.Logprobs[i])
		}
	}
	assert.Equal(t, sampled, masked, "the loss covers exactly the sampled ids")
	assert.Equal(t, lps, maskedLps, "with the engine's log-probs")
	_ = kind
	_ = strings.Contains
}

// TestCodexCLIAgent: OpenAI's Codex CLI (codex exec) through
// codex-agent.sh over the Responses API: the env's tools reach it as the
// MCP namespace mcp__env and the policy's calls go back to it with that
// namespace.
func TestCodexCLIAgent(t *testing.T) {
	n := testclients.RequireNode(t, "@openai/codex")
	r := runCLIAgent(t, []string{"bash", exampleAgent(t, "codex-agent.sh")},
		[]string{"ORTRAIN_CODEX_BIN=" + filepath.Join(n.Modules, ".bin", "codex"), "ORTRAIN_AGENT_BUILTIN_TOOLS=1"})
	checkCLIRollout(t, r, gateway.KindResponses)
}

// TestClaudeAgentSDK: Anthropic's Claude Agent SDK (its native Claude
// Code) through claude-agent.js over the Messages API.
func TestClaudeAgentSDK(t *testing.T) {
	n := testclients.RequireNode(t, "@anthropic-ai/claude-agent-sdk")
	r := runCLIAgent(t, []string{n.Bin, exampleAgent(t, "claude-agent.js")}, []string{"NODE_PATH=" + n.Modules})
	checkCLIRollout(t, r, gateway.KindMessages)
}
