package vllm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStatusErrorShapes(t *testing.T) {
	tests := []struct {
		name         string
		code         int
		body         string
		msg          string
		routeMissing bool
	}{
		{"current vLLM", 400, `{"error":{"message":"max_tokens too large","type":"BadRequestError","param":null,"code":400}}`, "max_tokens too large", false},
		{"older vLLM", 400, `{"object":"error","message":"bad seed","type":"BadRequestError","code":400}`, "bad seed", false},
		{"missing route", 404, `{"detail":"Not Found"}`, "Not Found", true},
		{"adapter not found", 404, `{"error":{"message":"The lora adapter 'x' cannot be found.","type":"NotFoundError","code":404}}`, "The lora adapter 'x' cannot be found.", false},
		{"validation detail", 422, `{"detail":[{"loc":["body","prompt"],"msg":"field required"}]}`, `[{"loc":["body","prompt"],"msg":"field required"}]`, false},
		{"plain text", 500, "Internal Server Error", "Internal Server Error", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := statusError("http://h/x", tt.code, []byte(tt.body))
			assert.Equal(t, tt.msg, e.Message)
			assert.Equal(t, tt.routeMissing, e.RouteMissing)
			assert.Equal(t, tt.code, e.Code)
		})
	}
}

func FuzzStatusError(f *testing.F) {
	for _, s := range []string{`{"error":{"message":"m"}}`, `{"detail":"Not Found"}`, `{"message":1}`, `{"detail":[1,2]}`, `null`, ``, `{"error":null}`} {
		f.Add(404, s)
	}
	f.Fuzz(func(t *testing.T, code int, body string) {
		e := statusError("http://h", code, []byte(body))
		require.NotNil(t, e)
		require.LessOrEqual(t, len(e.Message), 1000+len("…"))
		if e.RouteMissing {
			require.Equal(t, 404, e.Code)
		}
	})
}

func TestRetryable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := "http://" + l.Addr().String()
	l.Close()
	c, err := NewClient(dead, nil)
	require.NoError(t, err)
	refused := c.Health(context.Background())
	require.Error(t, refused)

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	live, _ := NewClient(srv.URL, nil)
	ctxErr := live.Health(cancelled)

	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused", refused, true},
		{"500", &StatusError{Code: 500}, true},
		{"503 wrapped", fmt.Errorf("x: %w", &StatusError{Code: 503}), true},
		{"400", &StatusError{Code: 400}, false},
		{"404", &StatusError{Code: 404}, false},
		{"cancelled", ctxErr, false},
		{"deadline", context.DeadlineExceeded, false},
		{"nil", nil, false},
		{"other", errors.New("decode failure"), false},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, Retryable(tt.err), tt.name)
	}
}

func TestNewClientRejectsBadURLs(t *testing.T) {
	for _, u := range []string{"localhost:8000", "", "ftp://x", "http://"} {
		_, err := NewClient(u, nil)
		assert.Error(t, err, u)
	}
	c, err := NewClient("http://127.0.0.1:8000/", nil)
	require.NoError(t, err)
	assert.Equal(t, "http://127.0.0.1:8000", c.URL())
}

// TestDecodeVLLMShapes decodes bodies shaped as vLLM documents them
// (vllm-integration.md §1.3, §2.1), including fields ortrain ignores.
func TestDecodeVLLMShapes(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			fmt.Fprint(w, `{"object":"list","data":[{"id":"policy","object":"model","created":1,"owned_by":"vllm","root":"/models/q","parent":null,"max_model_len":4096,
				"permission":[{"id":"modelperm-1","object":"model_permission","allow_sampling":true}]},
				{"id":"policy-v3","object":"model","created":1,"owned_by":"vllm","root":"/sync/policy-v3","parent":"policy","max_model_len":null,"permission":[]}]}`)
		case "/v1/completions":
			fmt.Fprint(w, `{"id":"cmpl-9","object":"text_completion","created":2,"model":"policy","system_fingerprint":null,
				"choices":[{"index":0,"text":"hi","logprobs":{"text_offset":[0,1],"token_logprobs":[-0.5,-0.25],"tokens":["h","i"],"top_logprobs":[{"h":-0.5},{"i":-0.25}]},
				"finish_reason":"stop","stop_reason":2,"prompt_logprobs":null,"prompt_token_ids":[7,8],"token_ids":[104,2]}],
				"service_tier":null,"usage":{"prompt_tokens":2,"total_tokens":4,"completion_tokens":2,"prompt_tokens_details":null},"kv_transfer_params":null}`)
		}
	}))
	defer srv.Close()
	c, err := NewClient(srv.URL, nil)
	require.NoError(t, err)
	models, err := c.Models(context.Background())
	require.NoError(t, err)
	require.Len(t, models.Data, 2)
	assert.Equal(t, 4096, models.Data[0].MaxModelLen)
	assert.Nil(t, models.Data[0].Parent)
	require.NotNil(t, models.Data[1].Parent)
	assert.Equal(t, "policy", *models.Data[1].Parent)

	resp, err := c.Complete(context.Background(), &CompletionRequest{Model: "policy", Prompt: []int32{7, 8}})
	require.NoError(t, err)
	require.NoError(t, resp.Validate(1))
	ch := resp.Choices[0]
	assert.Equal(t, []int32{104, 2}, ch.TokenIDs)
	require.Len(t, ch.Logprobs.TokenLogprobs, 2)
	assert.Equal(t, -0.5, *ch.Logprobs.TokenLogprobs[0])
	assert.Equal(t, -0.25, *ch.Logprobs.TokenLogprobs[1])
	assert.Equal(t, "stop", *ch.FinishReason)
	id, ok := ch.StopTokenID()
	assert.True(t, ok)
	assert.Equal(t, int32(2), id)
	assert.Equal(t, Usage{PromptTokens: 2, CompletionTokens: 2, TotalTokens: 4}, resp.Usage)

	var re *ResponseError
	require.ErrorAs(t, resp.Validate(2), &re)
	assert.Equal(t, ResponseError{Choice: -1, Field: "choices", Token: -1, Problem: "1 choices, want 2"}, *re)
}

// TestValidateRefusesWhatCannotBeTrained decodes answers a vLLM can give
// (its token_logprobs is list[float | None]) and checks that every gap is
// a *ResponseError naming the choice, field and token, never a number.
func TestValidateRefusesWhatCannotBeTrained(t *testing.T) {
	const ok = `{"index":0,"finish_reason":"stop","token_ids":[5,6],"logprobs":{"token_logprobs":[-0.5,-0.25]}}`
	cases := []struct {
		name, choice string
		field        string
		token        int
	}{
		{"null log-prob", `{"index":0,"finish_reason":"stop","token_ids":[5,6],"logprobs":{"token_logprobs":[-0.5,null]}}`, "logprobs.token_logprobs", 1},
		{"no log-probs", `{"index":0,"finish_reason":"stop","token_ids":[5,6],"logprobs":null}`, "logprobs.token_logprobs", -1},
		{"null log-prob list", `{"index":0,"finish_reason":"stop","token_ids":[5,6],"logprobs":{"token_logprobs":null}}`, "logprobs.token_logprobs", -1},
		{"short log-probs", `{"index":0,"finish_reason":"stop","token_ids":[5,6,7],"logprobs":{"token_logprobs":[-0.5,-0.25]}}`, "logprobs.token_logprobs", -1},
		{"positive log-prob", `{"index":0,"finish_reason":"stop","token_ids":[5,6],"logprobs":{"token_logprobs":[-0.5,0.5]}}`, "logprobs.token_logprobs", 1},
		{"no token ids", `{"index":0,"finish_reason":"stop","logprobs":{"token_logprobs":[]}}`, "token_ids", -1},
		{"no finish reason", `{"index":0,"finish_reason":null,"token_ids":[5],"logprobs":{"token_logprobs":[-1]}}`, "finish_reason", -1},
		{"wrong index", `{"index":3,"finish_reason":"stop","token_ids":[5],"logprobs":{"token_logprobs":[-1]}}`, "index", -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var resp CompletionResponse
			require.NoError(t, json.Unmarshal([]byte(`{"choices":[`+tc.choice+`]}`), &resp))
			var re *ResponseError
			require.ErrorAs(t, resp.Validate(1), &re)
			assert.Equal(t, 0, re.Choice)
			assert.Equal(t, tc.field, re.Field)
			assert.Equal(t, tc.token, re.Token)
		})
	}
	var resp CompletionResponse
	require.NoError(t, json.Unmarshal([]byte(`{"choices":[`+ok+`]}`), &resp))
	require.NoError(t, resp.Validate(1))
}
