package serve

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestServeChatFromPython: a Python process using only the standard
// library (urllib, json), as a user's agent would without the openai
// package, talks to serve-engine over loopback with an API key: a chat
// completion with a tool, the tool's result sent back, and a streamed
// completion parsed from its SSE lines (testdata/openai_client.py).
func TestServeChatFromPython(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed")
	}
	tok, tc := tinyTextChat(t)
	cs := startChatServer(t, newScriptedBackend(tok, weatherCall), tc, func(o *Options) { o.APIKey = "sk-serve-engine" })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, python, "testdata/openai_client.py", cs.url+"/v1", cs.key, "toy").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Equal(t, "ok", strings.TrimSpace(string(out)))
}
