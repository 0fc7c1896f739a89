package agentrollout

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/agent"
	"github.com/ortrain/ortrain/internal/peercred"
	"github.com/ortrain/ortrain/internal/rollout"
)

// TestStolenKeyIsRefused reproduces a hostile agent: while two rollouts
// run, one reads the other's key and URLs from /proc/<pid>/environ (agents
// run as one uid) and calls its model endpoint and its MCP server with
// them. Every call gets a wrong key's 401, is counted on the gateway and
// the MCP server, and the victim's rollout plays as if nothing happened:
// nothing reached its engine session or its env session, nothing was
// counted against it.
func TestStolenKeyIsRefused(t *testing.T) {
	if !peercred.Supported() {
		t.Skip("no peer process lookup on this platform: a stolen key works there (see the README's threat model)")
	}
	py := python(t)
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	thief, err := filepath.Abs("testdata/thief_agent.sh")
	require.NoError(t, err)
	script, err := filepath.Abs("testdata/tool_agent.py")
	require.NoError(t, err)
	shared := t.TempDir()
	h := newHarness(t, "builtin:lockbox", "ors", agent.Spec{
		Command: []string{"/bin/bash", thief, py, script}, Env: []string{"SHARED=" + shared}})

	trs := h.runner.RunAll(context.Background(), []rollout.Task{{Split: "train", Index: 2}, {Split: "train", Index: 3}}, nil)
	raw, err := os.ReadFile(filepath.Join(shared, "steal"))
	require.NoError(t, err, "the thief ran")
	got := map[string]string{}
	for _, line := range strings.Fields(string(raw)) {
		k, v, _ := strings.Cut(line, "=")
		got[k] = v
	}
	require.Equal(t, "stolen", got["key"], "the thief read the victim's key from its environment")
	assert.Equal(t, "401", got["chat"], "the victim's model endpoint")
	assert.Equal(t, "401", got["mcp"], "the victim's MCP server")
	assert.Equal(t, "401", got["own_url"], "the victim's key at the thief's own endpoint")

	for _, tr := range trs {
		assert.Equal(t, rollout.OutcomeDone, tr.Outcome, "neither rollout is masked: %v", tr.Err)
		assert.Equal(t, 2, tr.ToolCalls, "open_envelope and unlock, nothing injected")
	}
	assert.EqualValues(t, 2, h.runner.gw.ForeignProcess(), "both model calls counted on the gateway")
	assert.EqualValues(t, 1, h.runner.mcp.ForeignProcess())
	assert.Zero(t, h.runner.gw.Unauthorized(), "a stolen key is not a made-up one")
	assert.Equal(t, 6, len(h.model.recorded()), "three calls of each agent reached the engine, none of the thief's")
}

// TestAgentChildrenAreItsOwn: an agent whose model and MCP calls come from
// a grandchild it spawned (a shell running its client in a pipeline inside
// a subshell) is served: the binding covers the whole process tree.
func TestAgentChildrenAreItsOwn(t *testing.T) {
	py := python(t)
	script, err := filepath.Abs("testdata/tool_agent.py")
	require.NoError(t, err)
	h := newHarness(t, "builtin:lockbox", "ors", agent.Spec{Command: []string{"/bin/sh", "-c", `( "$0" "$1" | cat ); exit $?`, py, script}})
	tr := h.runner.Run(context.Background(), rollout.Task{Split: "train", Index: 5})
	require.Equal(t, rollout.OutcomeDone, tr.Outcome, "%v (stderr: %s)", tr.Err, tr.AgentStderr)
	assert.Equal(t, 2, tr.ToolCalls)
	require.NotNil(t, tr.AgentReward)
	assert.Equal(t, 0.5, *tr.AgentReward)
	assert.Zero(t, h.runner.gw.ForeignProcess())
	assert.Zero(t, h.runner.mcp.ForeignProcess())
}
