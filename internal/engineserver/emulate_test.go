package engineserver

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/engineserver/servetest"
	"github.com/ortrain/ortrain/internal/vllm"
)

// These tests hold serve-engine to real vLLM's answers (vllm-contract.md):
// which routes exist, which need the API key, and how each imitated
// version's /pause and reload_weights behave.

// send makes one request with an optional Authorization header value.
func send(t *testing.T, method, url, auth, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestServeAPIKeyGuardsOnlyVLLMPrefixes: with a key, only the version's
// guarded prefixes answer 401 ({"error":"Unauthorized"}, before routing,
// so unknown paths under them too); /health, /version and the dev routes
// answer without it.
func TestServeAPIKeyGuardsOnlyVLLMPrefixes(t *testing.T) {
	tests := []struct {
		method, path, body string
		current, old       int // status without a key on 0.33.0 and 0.14.0
	}{
		{"GET", "/health", "", 200, 200},
		{"GET", "/version", "", 200, 200},
		{"GET", "/is_paused", "", 200, 200},
		{"POST", "/pause?mode=wait", "", 200, 200},
		{"POST", "/resume", "", 200, 200},
		{"POST", "/collective_rpc", `{"method":"sleep"}`, 400, 400},
		{"POST", "/reset_prefix_cache", "", 200, 200},
		{"GET", "/no/such/route", "", 404, 404},
		{"GET", "/v1/models", "", 401, 401},
		{"POST", "/v1/completions", `{}`, 401, 401},
		{"POST", "/v1/load_lora_adapter", `{}`, 401, 401},
		{"GET", "/v1/no/such/route", "", 401, 401},
		{"GET", "/v2/models", "", 401, 404},
		{"POST", "/inference/v1/generate", "", 401, 404},
		{"POST", "/cohere/v2/chat", "", 401, 404},
	}
	for _, version := range []string{"0.33.0", "0.14.0"} {
		t.Run(version, func(t *testing.T) {
			ts := startToyServer(t, servetest.NewBackend(0), true, func(o *Options) { o.APIKey, o.Version = "k-123", version })
			for _, tt := range tests {
				want := tt.current
				if version == "0.14.0" {
					want = tt.old
				}
				code, body := send(t, tt.method, ts.URL+tt.path, "", tt.body)
				assert.Equal(t, want, code, "%s %s without a key: %s", tt.method, tt.path, body)
				if want != 401 {
					continue
				}
				assert.JSONEq(t, `{"error":"Unauthorized"}`, body, "vLLM's middleware body")
				code, _ = send(t, tt.method, ts.URL+tt.path, "Bearer k-12", tt.body)
				assert.Equal(t, 401, code, "%s %s with a wrong key", tt.method, tt.path)
				code, _ = send(t, tt.method, ts.URL+tt.path, "k-123", tt.body)
				assert.Equal(t, 401, code, "%s %s with no scheme", tt.method, tt.path)
			}
			for _, auth := range []string{"Bearer k-123", "bearer k-123"} {
				code, body := send(t, "GET", ts.URL+"/v1/models", auth, "")
				assert.Equal(t, 200, code, "%q: %s", auth, body)
			}
		})
	}
}

// TestServeDevRoutesNeedDevMode: without VLLM_SERVER_DEV_MODE the dev
// routes answer FastAPI's 404, except that 0.14.0 attached /pause, /resume
// and /is_paused always.
func TestServeDevRoutesNeedDevMode(t *testing.T) {
	routes := []struct{ method, path, body string }{
		{"GET", "/is_paused", ""}, {"POST", "/pause?mode=wait", ""}, {"POST", "/resume", ""},
		{"POST", "/collective_rpc", `{"method":"sleep"}`}, {"POST", "/reset_prefix_cache", ""},
	}
	tests := []struct {
		version string
		dev     bool
		present []bool // per route
	}{
		{"0.33.0", false, []bool{false, false, false, false, false}},
		{"0.33.0", true, []bool{true, true, true, true, true}},
		{"0.14.0", false, []bool{true, true, true, false, false}},
		{"0.14.0", true, []bool{true, true, true, true, true}},
	}
	for _, tt := range tests {
		name := tt.version + "/dev=" + map[bool]string{true: "1", false: "0"}[tt.dev]
		t.Run(name, func(t *testing.T) {
			ts := startToyServer(t, servetest.NewBackend(0), false, func(o *Options) { o.Version, o.DevMode = tt.version, tt.dev })
			for i, r := range routes {
				code, body := send(t, r.method, ts.URL+r.path, "", r.body)
				if !tt.present[i] {
					assert.Equal(t, 404, code, "%s %s", r.method, r.path)
					assert.JSONEq(t, `{"detail":"Not Found"}`, body, "%s %s", r.method, r.path)
					continue
				}
				assert.NotEqual(t, 404, code, "%s %s: %s", r.method, r.path, body)
			}
		})
	}
}

// TestServeLoRARoutesNeedRuntimeUpdating: the adapter routes exist only
// with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING together.
func TestServeLoRARoutesNeedRuntimeUpdating(t *testing.T) {
	tests := []struct{ lora, runtime, present bool }{
		{false, false, false}, {true, false, false}, {false, true, false}, {true, true, true},
	}
	for _, tt := range tests {
		ts := startToyServer(t, servetest.NewBackend(0), tt.lora, func(o *Options) { o.RuntimeLoRA = tt.runtime })
		for _, path := range []string{"/v1/load_lora_adapter", "/v1/unload_lora_adapter"} {
			code, body := send(t, "POST", ts.URL+path, "", `{"lora_name":"nope","lora_path":"/no/such/dir"}`)
			if tt.present {
				assert.NotContains(t, body, `"detail"`, "lora=%v runtime=%v %s: the route exists (%d)", tt.lora, tt.runtime, path, code)
				continue
			}
			assert.Equal(t, 404, code, "lora=%v runtime=%v %s", tt.lora, tt.runtime, path)
			assert.JSONEq(t, `{"detail":"Not Found"}`, body)
		}
	}
}

// TestServeVersion: GET /version names the imitated version, key or not.
func TestServeVersion(t *testing.T) {
	for _, tt := range []struct{ version, want string }{{"", CurrentVLLM}, {"0.33.0", "0.33.0"}, {"0.14.0", "0.14.0"}} {
		ts := startToyServer(t, servetest.NewBackend(0), false, func(o *Options) { o.Version, o.APIKey = tt.version, "k" })
		code, body := get(t, ts.URL+"/version")
		assert.Equal(t, 200, code)
		assert.JSONEq(t, `{"version":"`+tt.want+`"}`, body)
	}
	_, err := LookupProfile("0.1.0")
	assert.ErrorContains(t, err, `vLLM version "0.1.0" is not one serve-engine imitates: want one of 0.33.0, 0.14.0`)
	assert.Panics(t, func() { NewServer(servetest.NewBackend(0), Options{Version: "0.1.0"}) })
}

// TestServeOldPauseAbortsWhateverTheMode: 0.14.0's /pause has no mode: any
// ?mode= (even an invalid one) aborts in-flight requests at once, which
// end with finish_reason "abort"; the current version waits on mode=wait.
func TestServeOldPauseAbortsWhateverTheMode(t *testing.T) {
	body := `{"model":"toy","prompt":[1],"max_tokens":2,"seed":3,"logprobs":0,"return_token_ids":true,"ignore_eos":true}`
	for _, tt := range []struct{ version, query, finish string }{
		{"0.14.0", "?mode=wait", "abort"},
		{"0.14.0", "?mode=sideways", "abort"},
		{"0.33.0", "?mode=wait", "length"},
	} {
		t.Run(tt.version+tt.query, func(t *testing.T) {
			backend := servetest.NewBackend(0)
			backend.Delay = 500 * time.Millisecond
			ts := startToyServer(t, backend, false, func(o *Options) { o.Version = tt.version })
			got := make(chan string, 1)
			go func() { _, b := post(t, ts.URL+"/v1/completions", body); got <- b }()
			require.Eventually(t, func() bool { return backend.Batches.Load() >= 1 }, 5*time.Second, time.Millisecond)
			start := time.Now()
			code, pauseBody := post(t, ts.URL+"/pause"+tt.query, "")
			require.Equal(t, 200, code, pauseBody)
			if tt.finish == "abort" {
				assert.Less(t, time.Since(start), 400*time.Millisecond, "abort does not wait for the batch")
			}
			var resp vllm.CompletionResponse
			require.NoError(t, json.Unmarshal([]byte(<-got), &resp))
			require.Len(t, resp.Choices, 1)
			assert.Equal(t, tt.finish, *resp.Choices[0].FinishReason)
			code, _ = post(t, ts.URL+"/resume", "")
			assert.Equal(t, 200, code)
		})
	}
}

// TestServeReloadWeightsArguments: 0.14.0's reload_weights takes no
// argument (weights_path is a TypeError, HTTP 500) and re-reads the model
// it started with; the current one loads weights_path and keeps it as the
// model a later call without arguments re-reads.
func TestServeReloadWeightsArguments(t *testing.T) {
	root, next := t.TempDir(), t.TempDir()
	servetest.WriteWeights(t, root, servetest.Weights{Slope: 0.5})
	servetest.WriteWeights(t, next, servetest.Weights{Slope: 2})
	type call struct {
		body   string
		code   int
		msg    string
		reload string // the directory read, "" for none
	}
	tests := []struct {
		version string
		calls   []call
	}{
		{"0.14.0", []call{
			{`{"method":"reload_weights","kwargs":{"weights_path":"` + next + `"}}`, 500,
				"TypeError: Worker.reload_weights() got an unexpected keyword argument 'weights_path'", ""},
			{`{"method":"reload_weights","args":["` + next + `"]}`, 500, "takes 1 positional argument but 2 were given", ""},
			{`{"method":"reload_weights"}`, 200, "", root},
		}},
		{"0.33.0", []call{
			{`{"method":"reload_weights","kwargs":{"weights_path":"` + next + `","flavour":1}}`, 500, "unexpected keyword argument 'flavour'", ""},
			{`{"method":"reload_weights","kwargs":{"weights_path":"` + next + `"}}`, 200, "", next},
			{`{"method":"reload_weights"}`, 200, "", next},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.version, func(t *testing.T) {
			backend := servetest.NewBackend(0.5)
			ts := startToyServer(t, backend, false, func(o *Options) { o.Version, o.ModelRoot = tt.version, root })
			var reloads []string
			for _, c := range tt.calls {
				code, body := post(t, ts.URL+"/collective_rpc", c.body)
				assert.Equal(t, c.code, code, "%s: %s", c.body, body)
				assert.Contains(t, body, c.msg)
				if c.reload != "" {
					reloads = append(reloads, c.reload)
				}
				assert.Equal(t, reloads, backend.Reloads(), c.body)
			}
		})
	}

	// Through ortrain's client: the sync's call fails loudly on 0.14.0.
	ts := startToyServer(t, servetest.NewBackend(0.5), false, func(o *Options) { o.Version, o.ModelRoot = "0.14.0", root })
	c, err := vllm.NewClient(ts.URL, nil)
	require.NoError(t, err)
	err = c.ReloadWeights(context.Background(), next, time.Minute)
	var se *vllm.StatusError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, 500, se.Code)
	assert.Contains(t, se.Message, "reload_weights() got an unexpected keyword argument 'weights_path'")
}
