package vllm_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/vllm"
)

// TestToyServerReadsLaunchEnv: the toy child answers as the launch
// environment says, like vLLM: dev routes only with VLLM_SERVER_DEV_MODE=1,
// adapter routes only with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1,
// the key only on /v1, and /version as --emulate-vllm names it.
func TestToyServerReadsLaunchEnv(t *testing.T) {
	tests := []struct {
		name          string
		env, args     []string
		dev, lora     bool
		version       string
		modelsWithout int // GET /v1/models without a key
	}{
		{"bare", nil, nil, false, false, "0.33.0", 200},
		{"as launched", []string{"VLLM_SERVER_DEV_MODE=1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1", "VLLM_API_KEY=k"},
			[]string{"--enable-lora"}, true, true, "0.33.0", 401},
		{"runtime LoRA without --enable-lora", []string{"VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"}, nil, false, false, "0.33.0", 200},
		{"old", []string{"VLLM_SERVER_DEV_MODE=0"}, []string{"--emulate-vllm", "0.14.0"}, false, false, "0.14.0", 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := startToy(t, tt.env, tt.args...)
			c, err := vllm.NewClient(url, nil)
			require.NoError(t, err)
			ctx := testContext(t, time.Minute)

			_, err = c.IsPaused(ctx)
			// 0.14.0 attaches /is_paused without dev mode.
			if tt.dev || tt.version == "0.14.0" {
				assert.NoError(t, err, "is_paused key-free")
			} else {
				assert.True(t, routeMissing(err), "is_paused: %v", err)
			}
			err = c.WithAPIKey("k").UnloadLoRAAdapter(ctx, "nope")
			var se *vllm.StatusError
			require.ErrorAs(t, err, &se)
			assert.Equal(t, !tt.lora, se.RouteMissing, "unload_lora_adapter: %v", err)

			resp, err := http.Get(url + "/v1/models")
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, tt.modelsWithout, resp.StatusCode)

			resp, err = http.Get(url + "/version")
			require.NoError(t, err)
			var v struct{ Version string }
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
			resp.Body.Close()
			assert.Equal(t, tt.version, v.Version)
		})
	}
}

func routeMissing(err error) bool {
	var se *vllm.StatusError
	return errors.As(err, &se) && se.RouteMissing
}

// startToy runs the toy server on a free port with env (and PATH) and
// returns its URL once it is up.
func startToy(t *testing.T, env []string, args ...string) string {
	t.Helper()
	port, err := vllm.FreePort("127.0.0.1")
	require.NoError(t, err)
	cmd := exec.Command(toyServer, append([]string{"toy", "--port", strconv.Itoa(port)}, args...)...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(line, "Application startup complete."), line)
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	c, err := vllm.NewClient(url, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return c.Health(context.Background()) == nil }, 10*time.Second, 10*time.Millisecond)
	return url
}
