package envmcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envmcp"
	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/testclients"
)

// sdkRun is what testdata/mcp_client.js printed.
type sdkRun struct {
	ProtocolVersion string `json:"protocolVersion"`
	SessionID       string `json:"sessionId"`
	Server          struct {
		Name, Version string
	} `json:"server"`
	Tools []struct {
		Name        string          `json:"name"`
		Annotations json.RawMessage `json:"annotations"`
	} `json:"tools"`
	Calls []struct {
		Result *struct {
			Content []struct {
				Type, Text string
			} `json:"content"`
			IsError           bool                       `json:"isError"`
			StructuredContent json.RawMessage            `json:"structuredContent"`
			Meta              map[string]json.RawMessage `json:"_meta"`
		} `json:"result"`
		Error string `json:"error"`
	} `json:"calls"`
	Terminated      bool     `json:"terminated"`
	TransportErrors []string `json:"transportErrors"`
}

// runSDKClient runs the official TypeScript SDK client against url.
func runSDKClient(t *testing.T, url, key string, calls []map[string]any) sdkRun {
	t.Helper()
	n := testclients.RequireNode(t, "@modelcontextprotocol/sdk")
	plan, err := json.Marshal(calls)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, n.Bin, "testdata/mcp_client.js", url, key, string(plan))
	cmd.Env = n.Env()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "mcp_client.js: %s", stderr.String())
	t.Logf("the SDK client saw: %s", stdout.String())
	var run sdkRun
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &run), "%s", stdout.String())
	return run
}

// The official TypeScript SDK client plays a lockbox episode over a real
// env session: it negotiates 2025-11-25, sees the tools with their
// annotations, reads the end of the episode from the finishing call, and
// gets an error result for a call after it.
func TestTypeScriptSDKClient(t *testing.T) {
	sess, tools := openBuiltin(t, "builtin:lockbox", "")
	annotations := map[string]any{"readOnlyHint": false, "destructiveHint": false, "openWorldHint": false}
	srv, base := serve(t, envmcp.Options{Version: "1.2.3", ToolAnnotations: envmcp.AnnotateAll(annotations)})
	ep := srv.Attach("r1", "key-1", sess, tools)
	t.Cleanup(func() { srv.Detach("r1") })

	run := runSDKClient(t, base+"/mcp/r1", "key-1", []map[string]any{
		{"name": envs.LockboxOpenTool},
		{"name": envs.LockboxUnlockTool, "arguments": map[string]any{"code": "$digit"}},
		{"name": envs.LockboxOpenTool},
	})
	assert.Equal(t, "2025-11-25", run.ProtocolVersion)
	assert.NotEmpty(t, run.SessionID)
	assert.Equal(t, "ortrain", run.Server.Name)
	assert.Equal(t, "1.2.3", run.Server.Version)
	require.Len(t, run.Tools, 2)
	for _, tl := range run.Tools {
		assert.JSONEq(t, `{"readOnlyHint":false,"destructiveHint":false,"openWorldHint":false}`, string(tl.Annotations), tl.Name)
	}

	require.Len(t, run.Calls, 3)
	for i, c := range run.Calls {
		require.Empty(t, c.Error, "call %d", i)
		require.NotNil(t, c.Result, "call %d", i)
	}
	opened, unlocked, after := run.Calls[0].Result, run.Calls[1].Result, run.Calls[2].Result
	assert.False(t, opened.IsError)
	assert.Nil(t, opened.StructuredContent)
	assert.JSONEq(t, `false`, string(opened.Meta[envmcp.MetaFinished]))

	assert.False(t, unlocked.IsError)
	assert.JSONEq(t, `{"finished":true,"reward":1}`, string(unlocked.StructuredContent))
	assert.JSONEq(t, `true`, string(unlocked.Meta[envmcp.MetaFinished]))
	assert.JSONEq(t, `1`, string(unlocked.Meta[envmcp.MetaReward]))
	require.Len(t, unlocked.Content, 1)
	assert.Equal(t, "unlocked\n\n[episode finished: reward 1 — no more tool calls are needed]", unlocked.Content[0].Text)

	assert.True(t, after.IsError)
	require.Len(t, after.Content, 1)
	assert.Equal(t, "the episode is over (it finished at tool call 2); end the episode", after.Content[0].Text)

	assert.True(t, run.Terminated, "DELETE ended the MCP session")
	assert.Empty(t, run.TransportErrors)
	assert.True(t, ep.Finished())
	assert.Equal(t, 1, ep.CallsAfterFinish())
	assert.Len(t, ep.Calls(), 3)
}
