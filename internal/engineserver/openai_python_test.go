package engineserver

import (
	"context"
	"os"
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

// TestServeChatFromOpenAIClient: the real `openai` Python package (Debian's
// python3-openai; installed in CI's libtorch 2.x lane) talks to
// serve-engine unchanged: chat with a tool, the result sent back, the same
// streamed, and a text completion from a string prompt
// (testdata/openai_sdk_client.py). Skipped where the package is missing,
// unless ORTRAIN_REQUIRE_OPENAI is set.
func TestServeChatFromOpenAIClient(t *testing.T) {
	python := requireOpenAIClient(t)
	tok, tc := tinyTextChat(t)
	cs := startChatServer(t, newScriptedBackend(tok, weatherCall), tc, func(o *Options) { o.APIKey = "sk-serve-engine" })
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, python, "testdata/openai_sdk_client.py", cs.url+"/v1", cs.key, "toy").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Equal(t, "ok", strings.TrimSpace(string(out)))
}

// requireOpenAIClient returns python3 when it can import openai; else the
// test skips, or fails when ORTRAIN_REQUIRE_OPENAI is set (CI's lane that
// installs it).
func requireOpenAIClient(t *testing.T) string {
	t.Helper()
	python, err := exec.LookPath("python3")
	if err == nil {
		err = exec.Command(python, "-c", "import openai").Run()
	}
	if err != nil {
		if os.Getenv("ORTRAIN_REQUIRE_OPENAI") != "" {
			t.Fatalf("ORTRAIN_REQUIRE_OPENAI is set but python3 cannot import openai: %v", err)
		}
		t.Skipf("the openai Python package is not installed (Debian: python3-openai): %v", err)
	}
	return python
}
