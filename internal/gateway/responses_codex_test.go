package gateway

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/testclients"
)

// closeAgentCall is the policy calling Codex's namespaced close_agent
// (namespace multi_agent_v1): a call Codex runs without a shell or a
// sandbox, and that it routes only by the namespace the function_call
// carries.
const closeAgentCall = "<tool_call>\n{\"name\": \"multi_agent_v1__close_agent\", \"arguments\": {\"target\": \"nobody\"}}\n</tool_call>"

// TestResponsesFromCodexCLI runs the pinned Codex CLI (codex exec) against
// a rollout over the Responses API: its real request (namespaces, hosted
// tools, reasoning, include, store false, streamed) is served, a
// namespaced call reaches Codex's own tool and comes back with its result,
// and the two calls are one training segment.
func TestResponsesFromCodexCLI(t *testing.T) {
	n := testclients.RequireNode(t, "@openai/codex")
	h := newHarness(t, nil)
	key, rec := h.open(t, "codex-1")
	var calls atomic.Int32
	h.sampler.mu.Lock()
	h.sampler.reply = func(req engine.Request) (string, bool) {
		if calls.Add(1) == 1 && strings.Contains(h.tok.Decode(req.PromptIDs, false), "multi_agent_v1__close_agent") {
			return closeAgentCall, true
		}
		return "Hello from the policy.", true
	}
	h.sampler.mu.Unlock()

	home := t.TempDir()
	// Nothing but the gateway is contacted: no update check, analytics or
	// history; multi-agent tools stay on (they are the namespace).
	config := `model = "tiny-policy"
model_provider = "ortrain"
approval_policy = "never"
sandbox_mode = "read-only"
check_for_update_on_startup = false

[model_providers.ortrain]
name = "ortrain"
base_url = "` + h.url + RolloutPath("codex-1") + `"
env_key = "ORTRAIN_TEST_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[history]
persistence = "none"
`
	require.NoError(t, os.WriteFile(filepath.Join(home, "config.toml"), []byte(config), 0o600))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, n.Bin, filepath.Join(n.Package("@openai/codex"), "bin", "codex.js"),
		"exec", "--skip-git-repo-check", "--json", "Close the agent nobody.")
	cmd.Dir = t.TempDir()
	cmd.Env = n.Env("CODEX_HOME="+home, "ORTRAIN_TEST_KEY="+key)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "codex: %s", out)
	assert.Contains(t, string(out), `"text":"Hello from the policy."`, "codex: %s", out)

	recorded := rec.Calls()
	require.Len(t, recorded, 2, "the call, then the turn after its result; codex: %s", out)
	assert.Equal(t, []int{0, 0}, []int{rec.Rejected(), rec.Failed()}, "%+v", rec.Rejections())
	for _, c := range recorded {
		assert.Equal(t, KindResponses, c.Kind)
	}
	assert.Equal(t, "tool_calls", recorded[0].FinishReason)
	// Codex sent the call back with its namespace (re-rendered under the
	// flattened name the model wrote) and the tool's answer: one segment.
	got := Assemble(recorded)
	assert.Zero(t, got.PrefixBreaks)
	assert.Len(t, got.Segments, 1)
	held := len(recorded[0].PromptIDs) + len(recorded[0].CompletionIDs)
	assert.Contains(t, h.tok.Decode(recorded[1].PromptIDs[held:], false), "<tool_response>")
	assert.Positive(t, rec.DroppedResponseTools(), "Codex offers web_search, which is dropped")
}
