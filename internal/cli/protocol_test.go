package cli

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/model"
)

// serveBuiltin serves a built-in env over protocol on loopback for the test.
func serveBuiltin(t *testing.T, key string, protocol envs.Protocol) string {
	t.Helper()
	srv, err := envs.ServeLocalProtocol(context.Background(), key, protocol, envs.ServeOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	return srv.URL
}

// Issue 23: a URL is probed for its protocol, so list-tasks and eval work
// against an OpenEnv server without being told which standard it speaks.
func TestURLTargetsDetectTheProtocol(t *testing.T) {
	guess := serveBuiltin(t, "guess", envs.ProtocolOpenEnv)
	code, out, errOut := execCLI(t, nil, "list-tasks", "--env", guess, "--tools")
	require.Equal(t, ExitOK, code, errOut)
	assert.Contains(t, out, "GuessEnvironment")
	assert.Contains(t, out, "step\tshared")

	echo := serveBuiltin(t, "echo", envs.ProtocolORS)
	code, out, errOut = execCLI(t, nil, "list-tasks", "--env", echo, "--num-tasks", "2")
	require.Equal(t, ExitOK, code, errOut)
	assert.Contains(t, out, "0\t")

	dir := t.TempDir()
	preset, ok := model.PresetByName("tiny")
	require.True(t, ok)
	require.NoError(t, model.Init(filepath.Join(dir, "tiny"), preset, 1))
	letters := serveBuiltin(t, "letters", envs.ProtocolOpenEnv)
	requireWorkerLib(t)
	code, out, errOut = execCLI(t, nil, "eval", "--env", letters, "--model", filepath.Join(dir, "tiny"), "-n", "2", "--num-tasks", "1",
		"--output-dir", filepath.Join(dir, "run"), "--format", "json", "--max-completion-length", "16")
	require.Equal(t, ExitOK, code, errOut)
	assert.Contains(t, out, `"rollouts": 2`)
}

// Issue 23: a server that speaks neither protocol — here a plain web server
// with an HTML error page — is one usage error whatever --protocol says,
// naming both probes and what came back, without the page's HTML.
func TestNeitherProtocolIsOneError(t *testing.T) {
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte("<html><head><title>404 Not Found</title></head><body><center><h1>404 Not Found</h1></center><hr><center>nginx</center></body></html>\n"))
	}))
	t.Cleanup(web.Close)
	for _, protocol := range []string{"", "auto", "ors", "openenv"} {
		t.Run("protocol="+protocol, func(t *testing.T) {
			args := []string{"list-tasks", "--env", web.URL}
			if protocol != "" {
				args = append(args, "--protocol", protocol)
			}
			code, _, errOut := execCLI(t, nil, args...)
			assert.Equal(t, ExitUsage, code, errOut)
			assert.Contains(t, errOut, "/health")
			assert.Contains(t, errOut, "/list_environments")
			assert.Contains(t, errOut, "404")
			assert.NotContains(t, errOut, "<center>", "no raw HTML in the message")
		})
	}
}
