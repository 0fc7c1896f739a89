package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/engineserver"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/vllm"
	"github.com/ortrain/ortrain/internal/worker"
)

func TestServeEngineFlags(t *testing.T) {
	deps := SystemDeps()
	deps.IO, _, _ = TestIO()
	var got *ServeEngineOptions
	cmd := newServeEngineCmd(deps, func(_ context.Context, o *ServeEngineOptions) error { got = o; return nil })
	// The command line the supervisor builds for vllm serve.
	cmd.SetArgs(strings.Fields("/models/tiny --host 127.0.0.1 --port 8100 --logprobs-mode processed_logprobs --generation-config vllm " +
		"--tensor-parallel-size 1 --disable-uvicorn-access-log --gpu-memory-utilization 0.5 --max-model-len 512 --enable-lora --max-lora-rank 32 --max-loras 2 " +
		"--tool-call-format hermes"))
	require.NoError(t, cmd.Execute())
	require.NotNil(t, got)
	assert.Equal(t, "/models/tiny", got.Model)
	assert.Equal(t, 8100, got.Port)
	assert.Equal(t, 512, got.MaxModelLen)
	assert.True(t, got.EnableLoRA)
	assert.Equal(t, 32, got.MaxLoRARank)
	assert.Equal(t, "hermes", got.ToolCallFormat)

	// The supervisor passes no tool-call flag: the format is detected; by
	// default it is the current vLLM, healthy, without dev routes.
	deps.Getenv = func(string) string { return "" }
	cmd = newServeEngineCmd(deps, func(_ context.Context, o *ServeEngineOptions) error { got = o; return nil })
	cmd.SetArgs([]string{"/models/tiny"})
	require.NoError(t, cmd.Execute())
	assert.Equal(t, "auto", got.ToolCallFormat)
	assert.Equal(t, engineserver.CurrentVLLM, got.EmulateVLLM)
	assert.Equal(t, engineserver.Faults{}, got.Faults)
	assert.False(t, got.DevMode)
	assert.False(t, got.RuntimeLoRA)
}

// TestServeEngineEmulationFlags: the environment ortrain gives a replica
// turns on dev mode and runtime LoRA as vLLM reads it; --emulate-vllm
// and the repeatable --fault select a profile and faults.
func TestServeEngineEmulationFlags(t *testing.T) {
	tests := []struct {
		env         map[string]string
		args        string
		dev, lora   bool
		version     string
		faults      engineserver.Faults
		apiKeyInEnv bool
	}{
		{map[string]string{"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", "VLLM_API_KEY": "k"}, "m --enable-lora",
			true, true, "0.33.0", engineserver.Faults{}, true},
		{map[string]string{"VLLM_SERVER_DEV_MODE": "0", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}, "m",
			false, true, "0.33.0", engineserver.Faults{}, false},
		{nil, "m --emulate-vllm 0.14.0 --fault reload-noop --fault null-logprobs=0.5 --fault no-token-ids --fault slow-health=2s",
			false, false, "0.14.0", engineserver.Faults{ReloadNoop: true, NullLogprobs: 0.5, NoTokenIDs: true, SlowHealth: 2 * time.Second}, false},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			deps := SystemDeps()
			deps.IO, _, _ = TestIO()
			deps.Getenv = func(k string) string { return tt.env[k] }
			var got *ServeEngineOptions
			cmd := newServeEngineCmd(deps, func(_ context.Context, o *ServeEngineOptions) error { got = o; return nil })
			cmd.SetArgs(strings.Fields(tt.args))
			require.NoError(t, cmd.Execute())
			assert.Equal(t, tt.dev, got.DevMode)
			assert.Equal(t, tt.lora, got.RuntimeLoRA)
			assert.Equal(t, tt.version, got.EmulateVLLM)
			assert.Equal(t, tt.faults, got.Faults)
			assert.Equal(t, tt.apiKeyInEnv, got.APIKey == "k")
		})
	}
}

// TestServeEngineHelpListsFaultsAndVersions: every fault and profile is
// documented in --help.
func TestServeEngineHelpListsFaultsAndVersions(t *testing.T) {
	code, out, errOut := execCLI(t, nil, "serve-engine", "--help")
	require.Equal(t, ExitOK, code, errOut)
	for _, name := range append(engineserver.FaultNames(), engineserver.Versions()...) {
		assert.Contains(t, out, name)
	}
	assert.Contains(t, out, "VLLM_SERVER_DEV_MODE=1")
	assert.Contains(t, out, "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1")
}

func TestServeEngineUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		msg  string
	}{
		{[]string{"serve-engine"}, "no model"},
		{[]string{"serve-engine", "m", "--enable-lora", "--max-lora-rank", "7"}, "--max-lora-rank 7: invalid choice (choose from 1, 8, 16, 32, 64, 128, 256, 320, 512)"},
		{[]string{"serve-engine", "m", "--max-lora-rank", "1024"}, "--max-lora-rank 1024: invalid choice (choose from 1, 8,"},
		{[]string{"serve-engine", "m", "--emulate-vllm", "0.1.0"}, `--emulate-vllm: vLLM version "0.1.0" is not one serve-engine imitates: want one of 0.33.0, 0.14.0`},
		{[]string{"serve-engine", "m", "--fault", "bogus"}, `--fault bogus: unknown fault "bogus": want one of reload-noop, null-logprobs, no-token-ids, slow-health`},
		{[]string{"serve-engine", "m", "--fault", "null-logprobs"}, "fault null-logprobs needs a value: null-logprobs=FRACTION"},
		{[]string{"serve-engine", "m", "--fault", "slow-health=soon"}, `want a duration such as 3s, got "soon"`},
		{[]string{"serve-engine", "a", "--model", "b"}, "the model is given twice"},
		{[]string{"serve-engine", "m", "--logprobs-mode", "raw_logprobs"}, "processed_logprobs only"},
		{[]string{"serve-engine", "m", "--generation-config", "auto"}, "supports only vllm"},
		{[]string{"serve-engine", "m", "--enable-lora", "--max-lora-rank", "0"}, "--max-lora-rank 0"},
		{[]string{"serve-engine", "m", "--port", "70000"}, "is not a port"},
		{[]string{"serve-engine", "m", "--host", "0.0.0.0"}, "--host 0.0.0.0 is reachable beyond this machine: give an API key"},
		{[]string{"serve-engine", "m", "--tool-call-format", "yaml"}, `--tool-call-format "yaml": want auto or one of none, hermes`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, _, errOut := execCLI(t, nil, tt.args...)
			assert.Equal(t, ExitUsage, code, errOut)
			assert.Contains(t, errOut, tt.msg)
		})
	}
	// vLLM reads the variable with int(): "true" stops it too.
	code, _, errOut := execCLI(t, map[string]string{"VLLM_SERVER_DEV_MODE": "true"}, "serve-engine", "m")
	assert.Equal(t, ExitUsage, code, errOut)
	assert.Contains(t, errOut, `VLLM_SERVER_DEV_MODE="true": want an integer`)
}

// TestServeEngineCommand serves the tiny model through the real worker:
// the URL is printed on stdout, /v1/models, a token-id completion, a text
// completion and a chat completion answer, and an interrupt stops it with
// exit code 0.
func TestServeEngineCommand(t *testing.T) {
	libPath, searched, err := worker.FindLibrary("", os.Getenv)
	if err != nil {
		if os.Getenv("ORTRAIN_REQUIRE_WORKER") != "" {
			t.Fatalf("ORTRAIN_REQUIRE_WORKER is set but the worker library is missing: %v (searched %v)", err, searched)
		}
		t.Skipf("worker library not built (run scripts/build-worker.sh): %v", err)
	}
	dir := filepath.Join(t.TempDir(), "tiny")
	p, _ := model.PresetByName("tiny")
	require.NoError(t, model.InitOverwrite(dir, p, 1))

	deps := SystemDeps()
	deps.Getenv = func(k string) string {
		if k == "VLLM_SERVER_DEV_MODE" {
			return "1" // as ortrain launches a replica: the probe needs the dev routes
		}
		return os.Getenv(k)
	}
	outR, outW := io.Pipe()
	deps.IO = &IOStreams{In: &bytes.Buffer{}, Out: outW, ErrOut: &lockedBuffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	codeCh := make(chan int, 1)
	go func() {
		codeCh <- Execute(ctx, deps, []string{"serve-engine", "--model", dir, "--port", "0", "--threads", "1", "--worker-lib", libPath, "--served-model-name", "policy"})
		outW.Close()
	}()
	line, err := bufio.NewReader(outR).ReadString('\n')
	require.NoError(t, err)
	url := strings.TrimSpace(line)
	require.True(t, strings.HasPrefix(url, "http://127.0.0.1:"), url)
	go io.Copy(io.Discard, outR)

	c, err := vllm.NewClient(url, nil)
	require.NoError(t, err)
	card, err := vllm.Probe(context.Background(), c, vllm.Needs{FullSync: true})
	require.NoError(t, err)
	assert.Equal(t, "policy", card.ID)
	assert.Equal(t, dir, card.Root)
	assert.Equal(t, 2048, card.MaxModelLen)
	resp, err := http.Post(url+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"policy","prompt":[72,105],"max_tokens":5,"n":2,"seed":1,"logprobs":0,"return_token_ids":true,"ignore_eos":true}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	var cr vllm.CompletionResponse
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&cr))
	require.NoError(t, cr.Validate(2))
	assert.Len(t, cr.Choices[0].TokenIDs, 5)
	assert.NotEmpty(t, cr.Choices[0].Text, "text is decoded with the model's tokenizer")

	// Any OpenAI client: a text prompt and a chat, sampled by the worker.
	for _, tt := range []struct{ path, body, object string }{
		{"/v1/completions", `{"model":"policy","prompt":"hello","max_tokens":4,"seed":1}`, "text_completion"},
		{"/v1/chat/completions", `{"model":"policy","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"seed":1,"logprobs":true}`, "chat.completion"},
	} {
		resp, err := http.Post(url+tt.path, "application/json", strings.NewReader(tt.body))
		require.NoError(t, err)
		var reply struct {
			Object  string `json:"object"`
			Model   string `json:"model"`
			Choices []struct {
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, 200, resp.StatusCode, "%s: %s", tt.path, raw)
		require.NoError(t, json.Unmarshal(raw, &reply), "%s", raw)
		assert.Equal(t, tt.object, reply.Object)
		assert.Equal(t, "policy", reply.Model)
		require.Len(t, reply.Choices, 1)
		assert.Contains(t, []string{"stop", "length", "tool_calls"}, reply.Choices[0].FinishReason)
		assert.Positive(t, reply.Usage.PromptTokens)
		assert.Positive(t, reply.Usage.CompletionTokens)
		assert.LessOrEqual(t, reply.Usage.CompletionTokens, 4)
	}

	cancel()
	select {
	case code := <-codeCh:
		assert.Equal(t, ExitOK, code)
	case <-time.After(20 * time.Second):
		t.Fatal("serve-engine did not stop")
	}
}
