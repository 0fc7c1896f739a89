package engineserver

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/engineserver/servetest"
	"github.com/ortrain/ortrain/internal/vllm"
)

type toyServer struct {
	*httptest.Server
	backend *servetest.Backend
	srv     *Server
}

// startToyServer serves backend as ortrain launches a replica: dev mode on,
// runtime LoRA updating on with lora; configure adjusts the options first.
func startToyServer(t testing.TB, backend *servetest.Backend, lora bool, configure ...func(*Options)) *toyServer {
	opts := Options{ModelName: "toy", ModelRoot: "/models/toy", MaxModelLen: 64, EOSIDs: []int32{7}, LoRA: lora, RuntimeLoRA: lora, DevMode: true,
		Batch: engine.BuiltinOptions{MaxBatch: 16, Linger: time.Millisecond}, Logger: zerolog.New(zerolog.NewTestWriter(t)),
		Now: func() time.Time { return time.Unix(1700000000, 0) }}
	for _, c := range configure {
		c(&opts)
	}
	srv := NewServer(backend, opts)
	hs := httptest.NewServer(srv)
	t.Cleanup(func() { hs.Close(); srv.Close() })
	return &toyServer{Server: hs, backend: backend, srv: srv}
}

// post sends a raw JSON body and returns the status and the body.
func post(t testing.TB, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func get(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func decodeMap(t testing.TB, s string) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(s), &m), s)
	return m
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestServeCompletionShape checks the response against vLLM's documented
// non-streaming completion shape (vllm-integration.md §2.1): top-level
// fields, prompt-major choices, parallel logprob arrays, token ids.
func TestServeCompletionShape(t *testing.T) {
	ts := startToyServer(t, servetest.NewBackend(0.3), false)
	code, body := post(t, ts.URL+"/v1/completions",
		`{"model":"toy","prompt":[[1,2,3],[4,5]],"max_tokens":4,"n":2,"seed":11,"temperature":1.0,"top_p":1.0,"top_k":-1,
		  "logprobs":0,"return_token_ids":true,"ignore_eos":true,"stop_token_ids":[]}`)
	require.Equal(t, 200, code, body)
	m := decodeMap(t, body)
	assert.ElementsMatch(t, []string{"id", "object", "created", "model", "choices", "usage"}, keys(m))
	assert.True(t, strings.HasPrefix(m["id"].(string), "cmpl-"))
	assert.Equal(t, "text_completion", m["object"])
	assert.Equal(t, float64(1700000000), m["created"])
	assert.Equal(t, "toy", m["model"])
	usage := m["usage"].(map[string]any)
	assert.Equal(t, map[string]any{"prompt_tokens": 5.0, "completion_tokens": 16.0, "total_tokens": 21.0}, usage)
	choices := m["choices"].([]any)
	require.Len(t, choices, 4)
	for i, c := range choices {
		ch := c.(map[string]any)
		assert.ElementsMatch(t, []string{"index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids", "prompt_token_ids", "prompt_logprobs"}, keys(ch))
		assert.Equal(t, float64(i), ch["index"])
		wantPrompt := []any{1.0, 2.0, 3.0}
		if i >= 2 {
			wantPrompt = []any{4.0, 5.0}
		}
		assert.Equal(t, wantPrompt, ch["prompt_token_ids"], "choices are prompt-major")
		assert.Equal(t, "length", ch["finish_reason"])
		assert.Nil(t, ch["stop_reason"])
		assert.Nil(t, ch["prompt_logprobs"])
		ids := ch["token_ids"].([]any)
		require.Len(t, ids, 4)
		lp := ch["logprobs"].(map[string]any)
		assert.ElementsMatch(t, []string{"text_offset", "token_logprobs", "tokens", "top_logprobs"}, keys(lp))
		for _, k := range []string{"text_offset", "token_logprobs", "tokens", "top_logprobs"} {
			assert.Len(t, lp[k].([]any), 4, k)
		}
		var text string
		for j, id := range ids {
			tok := string(rune('a' + int(id.(float64))))
			assert.Equal(t, tok, lp["tokens"].([]any)[j])
			top := lp["top_logprobs"].([]any)[j].(map[string]any)
			assert.Equal(t, lp["token_logprobs"].([]any)[j], top[tok], "top_logprobs holds the sampled token")
			assert.Equal(t, float64(len(text)), lp["text_offset"].([]any)[j])
			text += tok
		}
		assert.Equal(t, text, ch["text"])
	}
}

// TestServeSeedsAndStops: a seed makes a request reproducible, sample j of
// n uses seed+j, stop ids end a completion (included, with stop_reason),
// EOS stops unless ignore_eos.
func TestServeSeedsAndStops(t *testing.T) {
	ts := startToyServer(t, servetest.NewBackend(0.3), false)
	c, err := vllm.NewClient(ts.URL, nil)
	require.NoError(t, err)
	ctx := context.Background()
	zero := 0
	req := func(seed int64, n int, stop []int32, ignoreEOS bool) *vllm.CompletionResponse {
		r, err := c.Complete(ctx, &vllm.CompletionRequest{Model: "toy", Prompt: []int32{1}, MaxTokens: 12, N: n, Temperature: 1, TopP: 1, TopK: -1,
			RepetitionPenalty: 1, Seed: &seed, StopTokenIDs: stop, IgnoreEOS: ignoreEOS, Logprobs: &zero, ReturnTokenIDs: true})
		require.NoError(t, err)
		return r
	}
	group := req(40, 3, nil, true)
	for j := range 3 {
		single := req(40+int64(j), 1, nil, true)
		assert.Equal(t, single.Choices[0].TokenIDs, group.Choices[j].TokenIDs, "sample %d uses seed+%d", j, j)
		want := servetest.Sample(engine.Request{PromptIDs: []int32{1}, MaxTokens: 12, Sampling: engine.SamplingParams{Temperature: 1, TopP: 1}, Seed: 40 + int64(j)}, 0.3)
		assert.Equal(t, want.IDs, single.Choices[0].TokenIDs)
	}
	// Find a seed whose free-running sample contains both 5 and 7 (EOS).
	for seed := int64(0); seed < 200; seed++ {
		free := req(seed, 1, nil, true).Choices[0].TokenIDs
		i5, i7 := indexOf(free, 5), indexOf(free, 7)
		if i5 < 0 || i7 < 0 {
			continue
		}
		stopped := req(seed, 1, []int32{5}, true).Choices[0]
		assert.Equal(t, free[:i5+1], stopped.TokenIDs, "the stop id is included")
		assert.Equal(t, "stop", *stopped.FinishReason)
		id, ok := stopped.StopTokenID()
		assert.True(t, ok)
		assert.Equal(t, int32(5), id)
		eos := req(seed, 1, nil, false).Choices[0]
		assert.Equal(t, free[:i7+1], eos.TokenIDs, "EOS stops without ignore_eos")
		assert.Equal(t, "null", string(eos.StopReason), "EOS gives stop_reason null")
		return
	}
	t.Fatal("no seed produced both 5 and 7")
}

func indexOf(ids []int32, id int32) int {
	for i, x := range ids {
		if x == id {
			return i
		}
	}
	return -1
}

func TestServeRejectsWhatItCannotHonour(t *testing.T) {
	ts := startToyServer(t, servetest.NewBackend(0), false)
	tests := []struct {
		name, body string
		code       int
		msg        string
	}{
		{"text prompt", `{"model":"toy","prompt":"hello"}`, 400, "does not tokenize text"},
		{"empty prompt", `{"model":"toy","prompt":[]}`, 400, "non-empty list"},
		{"negative id", `{"model":"toy","prompt":[1,-2]}`, 400, "negative token id"},
		{"stream", `{"model":"toy","prompt":[1],"stream":true}`, 400, "stream"},
		{"penalty", `{"model":"toy","prompt":[1],"repetition_penalty":1.2}`, 400, "penalties"},
		{"top logprobs", `{"model":"toy","prompt":[1],"logprobs":5}`, 400, "logprobs=5"},
		{"stop strings", `{"model":"toy","prompt":[1],"stop":["\n"]}`, 400, "stop strings"},
		{"too long", `{"model":"toy","prompt":[1,2,3],"max_tokens":62}`, 400, "maximum context length is 64 tokens. However, you requested 65 tokens"},
		{"bad top_p", `{"model":"toy","prompt":[1],"top_p":0}`, 400, "top_p"},
		{"bad n", `{"model":"toy","prompt":[1],"n":0}`, 400, "n must be at least 1"},
		{"huge n", `{"model":"toy","prompt":[1],"n":100000}`, 400, "more than 4096 samples"},
		{"unknown model", `{"model":"nope","prompt":[1]}`, 404, "The model `nope` does not exist."},
		{"bad json", `{"model":`, 400, "invalid JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := post(t, ts.URL+"/v1/completions", tt.body)
			assert.Equal(t, tt.code, code, body)
			var e vllm.ErrorResponse
			require.NoError(t, json.Unmarshal([]byte(body), &e), body)
			assert.Contains(t, e.Error.Message, tt.msg)
			assert.Equal(t, tt.code, e.Error.Code)
			assert.NotEmpty(t, e.Error.Type)
		})
	}
}

func TestServeModelsAndLoRARoutes(t *testing.T) {
	backend := servetest.NewBackend(0)
	ts := startToyServer(t, backend, true)
	code, body := get(t, ts.URL+"/v1/models")
	require.Equal(t, 200, code)
	assert.JSONEq(t, `{"object":"list","data":[{"id":"toy","object":"model","created":1700000000,"owned_by":"vllm","root":"/models/toy","parent":null,"max_model_len":64}]}`, body)

	dir := t.TempDir()
	servetest.WriteWeights(t, dir, servetest.Weights{Slope: 1})
	code, body = post(t, ts.URL+"/v1/load_lora_adapter", `{"lora_name":"policy-v1","lora_path":"`+dir+`"}`)
	assert.Equal(t, 200, code)
	assert.Equal(t, "Success: LoRA adapter 'policy-v1' added successfully.", body, "vLLM answers plain text")
	code, body = post(t, ts.URL+"/v1/load_lora_adapter", `{"lora_name":"policy-v1","lora_path":"`+dir+`"}`)
	assert.Equal(t, 400, code)
	assert.Contains(t, body, "has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True")
	code, _ = post(t, ts.URL+"/v1/load_lora_adapter", `{"lora_name":"policy-v1","lora_path":"`+dir+`","load_inplace":true}`)
	assert.Equal(t, 200, code)
	code, body = post(t, ts.URL+"/v1/load_lora_adapter", `{"lora_name":"x"}`)
	assert.Equal(t, 400, code, body)

	_, body = get(t, ts.URL+"/v1/models")
	var list vllm.ModelList
	require.NoError(t, json.Unmarshal([]byte(body), &list))
	require.Len(t, list.Data, 2)
	assert.Equal(t, "policy-v1", list.Data[1].ID)
	assert.Equal(t, dir, list.Data[1].Root)
	require.NotNil(t, list.Data[1].Parent)
	assert.Equal(t, "toy", *list.Data[1].Parent)

	code, body = post(t, ts.URL+"/v1/completions", `{"model":"policy-v1","prompt":[1],"max_tokens":3,"seed":1,"logprobs":0,"return_token_ids":true,"ignore_eos":true}`)
	require.Equal(t, 200, code, body)

	code, body = post(t, ts.URL+"/v1/unload_lora_adapter", `{"lora_name":"policy-v1"}`)
	assert.Equal(t, 200, code)
	assert.Equal(t, "Success: LoRA adapter 'policy-v1' removed successfully.", body)
	code, body = post(t, ts.URL+"/v1/unload_lora_adapter", `{"lora_name":"policy-v1"}`)
	assert.Equal(t, 404, code)
	assert.JSONEq(t, `{"error":{"message":"The lora adapter 'policy-v1' cannot be found.","type":"NotFoundError","param":null,"code":404}}`, body)
	code, _ = post(t, ts.URL+"/v1/completions", `{"model":"policy-v1","prompt":[1]}`)
	assert.Equal(t, 404, code)

	// Without LoRA the routes do not exist, as in vLLM without
	// VLLM_ALLOW_RUNTIME_LORA_UPDATING: the framework's bare 404.
	plain := startToyServer(t, servetest.NewBackend(0), false)
	code, body = post(t, plain.URL+"/v1/load_lora_adapter", `{"lora_name":"a","lora_path":"/x"}`)
	assert.Equal(t, 404, code)
	assert.JSONEq(t, `{"detail":"Not Found"}`, body)
}

func TestServeControlRoutes(t *testing.T) {
	backend := servetest.NewBackend(0)
	ts := startToyServer(t, backend, false)
	code, body := get(t, ts.URL+"/health")
	assert.Equal(t, 200, code)
	assert.Empty(t, body)
	_, body = get(t, ts.URL+"/is_paused")
	assert.JSONEq(t, `{"is_paused":false}`, body)
	code, body = post(t, ts.URL+"/pause?mode=wait", "")
	assert.Equal(t, 200, code)
	assert.JSONEq(t, `{"status":"paused"}`, body)
	_, body = get(t, ts.URL+"/is_paused")
	assert.JSONEq(t, `{"is_paused":true}`, body)
	code, _ = post(t, ts.URL+"/pause?mode=sideways", "")
	assert.Equal(t, 400, code)

	dir := t.TempDir()
	servetest.WriteWeights(t, dir, servetest.Weights{Slope: 2})
	code, body = post(t, ts.URL+"/collective_rpc", `{"method":"reload_weights","kwargs":{"weights_path":"`+dir+`"},"timeout":60}`)
	assert.Equal(t, 200, code, body)
	assert.JSONEq(t, `{"results":[null]}`, body)
	assert.Equal(t, []string{dir}, backend.Reloads())
	assert.Equal(t, 2.0, backend.Slope())
	code, body = post(t, ts.URL+"/collective_rpc", `{"method":"sleep"}`)
	assert.Equal(t, 400, code)
	assert.Contains(t, body, "implements only reload_weights")
	code, body = post(t, ts.URL+"/collective_rpc", `{"method":"reload_weights","kwargs":{"weights_path":"/no/such/dir"}}`)
	assert.Equal(t, 500, code, body)

	code, _ = post(t, ts.URL+"/reset_prefix_cache", "")
	assert.Equal(t, 200, code)
	code, body = post(t, ts.URL+"/resume", "")
	assert.Equal(t, 200, code)
	assert.JSONEq(t, `{"status":"resumed"}`, body)
}

// TestServePauseHoldsAndAbortsRequests: requests that arrive while paused
// wait for resume; pause?mode=abort ends in-flight ones with
// finish_reason "abort".
func TestServePauseHoldsAndAbortsRequests(t *testing.T) {
	backend := servetest.NewBackend(0)
	ts := startToyServer(t, backend, false)
	body := `{"model":"toy","prompt":[1],"max_tokens":2,"seed":3,"logprobs":0,"return_token_ids":true,"ignore_eos":true}`
	code, _ := post(t, ts.URL+"/pause?mode=wait", "")
	require.Equal(t, 200, code)
	done := make(chan int, 1)
	go func() { c, _ := post(t, ts.URL+"/v1/completions", body); done <- c }()
	select {
	case <-done:
		t.Fatal("a request completed while paused")
	case <-time.After(200 * time.Millisecond):
	}
	post(t, ts.URL+"/resume", "")
	select {
	case c := <-done:
		assert.Equal(t, 200, c)
	case <-time.After(10 * time.Second):
		t.Fatal("request not served after resume")
	}

	backend.Delay = 2 * time.Second
	got := make(chan string, 1)
	go func() { _, b := post(t, ts.URL+"/v1/completions", body); got <- b }()
	require.Eventually(t, func() bool { return backend.Batches.Load() >= 2 }, 5*time.Second, 5*time.Millisecond)
	start := time.Now()
	code, _ = post(t, ts.URL+"/pause?mode=abort", "")
	require.Equal(t, 200, code)
	assert.Less(t, time.Since(start), time.Second, "abort does not wait for the batch")
	var resp vllm.CompletionResponse
	require.NoError(t, json.Unmarshal([]byte(<-got), &resp))
	require.Len(t, resp.Choices, 1)
	assert.Equal(t, "abort", *resp.Choices[0].FinishReason)
	post(t, ts.URL+"/resume", "")
}

func TestServeUnknownRoute(t *testing.T) {
	ts := startToyServer(t, servetest.NewBackend(0), false)
	code, body := get(t, ts.URL+"/v1/chat/completions")
	assert.Equal(t, 404, code)
	assert.JSONEq(t, `{"detail":"Not Found"}`, body)
}

// FuzzServeCompletionBody: any body gets a well-formed answer (200 with a
// valid completion, or a JSON error), never a panic.
func FuzzServeCompletionBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"toy","prompt":[1,2],"max_tokens":3,"n":2,"seed":1,"logprobs":0,"return_token_ids":true}`,
		`{"prompt":[[1],[2,3]],"max_tokens":1}`, `{"prompt":"x"}`, `{"prompt":[1],"top_k":-5}`, `{}`, `[`, `null`,
		`{"prompt":[1],"max_tokens":0}`, `{"prompt":[1],"temperature":-1}`, `{"prompt":[1],"stop":null,"n":3}`,
	} {
		f.Add(s)
	}
	srv := NewServer(servetest.NewBackend(0.1), Options{ModelName: "toy", MaxModelLen: 32, Batch: engine.BuiltinOptions{MaxBatch: 4}})
	defer srv.Close()
	f.Fuzz(func(t *testing.T, body string) {
		if len(body) > 4000 {
			return
		}
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/completions", bytes.NewBufferString(body)))
		switch rec.Code {
		case 200:
			var resp vllm.CompletionResponse
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &resp))
			require.NotEmpty(t, resp.Choices)
		case 400, 404:
			var e vllm.ErrorResponse
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &e))
			require.NotEmpty(t, e.Error.Message)
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body.String())
		}
	})
}

// TestServeBoundsBodiesByContext: a token-id body larger than the context
// could hold is refused 413 before it is decoded; the bound follows
// MaxModelLen, at least 1 MiB.
func TestServeBoundsBodiesByContext(t *testing.T) {
	ts := startToyServer(t, servetest.NewBackend(0), false)
	assert.Equal(t, int64(1<<20), ts.srv.bodyLimit(), "a 64-token context gets the 1 MiB floor")
	big := `{"model":"toy","prompt":[` + strings.Repeat("1,", 600_000) + `1],"max_tokens":1}`
	status, body := post(t, ts.URL+"/v1/completions", big)
	assert.Equal(t, http.StatusRequestEntityTooLarge, status, body)
	assert.Contains(t, body, "more than the model's context can hold")
	status, body = post(t, ts.URL+"/v1/completions", `{"model":"toy","prompt":[1,2],"max_tokens":1,"logprobs":0,"return_token_ids":true}`)
	assert.Equal(t, http.StatusOK, status, body)

	wide := startToyServer(t, servetest.NewBackend(0), false, func(o *Options) { o.MaxModelLen = 32768 })
	assert.Equal(t, int64(64*12*32768), wide.srv.bodyLimit())
	none := startToyServer(t, servetest.NewBackend(0), false, func(o *Options) { o.MaxModelLen = 0 })
	assert.Equal(t, int64(maxBodyBytes), none.srv.bodyLimit())
}
