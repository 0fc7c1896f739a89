package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/engine"
)

func TestChatBadRequests(t *testing.T) {
	user := `"messages":[{"role":"user","content":"hi"}]`
	cases := []struct {
		name  string
		body  string
		param string // "" when the error names no field
		msg   string // part of the message
	}{
		{"n=2", `{"n":2,` + user + `}`, "n", "n=2"},
		{"bad JSON", `{"messages":[`, "", "invalid JSON"},
		{"empty body", ``, "", "empty"},
		{"not an object", `[1,2]`, "", "JSON object"},
		{"wrong type", `{"temperature":"hot",` + user + `}`, "temperature", "temperature"},
		{"no messages", `{"model":"m"}`, "messages", "at least one"},
		{"unknown role", `{"messages":[{"role":"function","content":"x"}]}`, "messages[0].role", "function"},
		{"image part", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, "messages[0].content[0].type", "image_url"},
		{"content object", `{"messages":[{"role":"user","content":{"a":1}}]}`, "messages[0].content", "string or a list"},
		{"tool type", `{"tools":[{"type":"retrieval"}],` + user + `}`, "tools[0].type", "retrieval"},
		{"tool without name", `{"tools":[{"type":"function","function":{}}],` + user + `}`, "tools[0].function.name", "required"},
		{"call without name", `{"messages":[{"role":"assistant","tool_calls":[{"type":"function","function":{"arguments":"{}"}}]}]}`,
			"messages[0].tool_calls[0].function.name", "required"},
		{"tool_choice unknown function", `{"tools":[` + string(weatherToolJSON) + `],"tool_choice":{"type":"function","function":{"name":"nope"}},` + user + `}`, "tool_choice", "nope"},
		{"tool_choice required without tools", `{"tool_choice":"required",` + user + `}`, "tool_choice", "needs tools"},
		{"tool_choice bad string", `{"tool_choice":"always",` + user + `}`, "tool_choice", "always"},
		{"negative temperature", `{"temperature":-1,` + user + `}`, "temperature", ">= 0"},
		{"top_p 0", `{"top_p":0,` + user + `}`, "top_p", "(0, 1]"},
		{"max_tokens 0", `{"max_tokens":0,` + user + `}`, "max_tokens", "at least 1"},
		{"max_completion_tokens -1", `{"max_completion_tokens":-1,` + user + `}`, "max_completion_tokens", "at least 1"},
		{"empty stop", `{"stop":["a",""],` + user + `}`, "stop", "stop[1]"},
		{"stop number", `{"stop":3,` + user + `}`, "stop", "string"},
		{"top_logprobs 21", `{"logprobs":true,"top_logprobs":21,` + user + `}`, "top_logprobs", "[0, 20]"},
		{"top_k -2", `{"top_k":-2,` + user + `}`, "top_k", "top_k"},
	}
	h := newHarness(t, nil)
	key, rec := h.open(t, "r")
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, raw := h.post(t, chatPath("r"), key, tc.body)
			require.Equal(t, http.StatusBadRequest, status, string(raw))
			var e clientError
			require.NoError(t, json.Unmarshal(raw, &e), string(raw))
			assert.Equal(t, "invalid_request_error", e.Error.Type)
			assert.Contains(t, e.Error.Message, tc.msg)
			if tc.param == "" {
				assert.Nil(t, e.Error.Param)
			} else if assert.NotNil(t, e.Error.Param, e.Error.Message) {
				assert.Equal(t, tc.param, *e.Error.Param)
			}
			assert.Equal(t, i+1, rec.Rejected(), "every refusal is counted")
		})
	}
	assert.Empty(t, rec.Calls(), "refused requests are not recorded")
	assert.Zero(t, rec.Failed())
	require.NotEmpty(t, rec.Rejections())
	assert.Equal(t, "n", rec.Rejections()[0].Param)
}

func TestBodyTooLarge(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.MaxBodyBytes = 256 })
	key, rec := h.open(t, "r")
	status, raw := h.post(t, chatPath("r"), key, `{"messages":[{"role":"user","content":"`+strings.Repeat("x", 300)+`"}]}`)
	assert.Equal(t, http.StatusRequestEntityTooLarge, status, string(raw))
	assert.Contains(t, string(raw), `"error"`)
	assert.Equal(t, 1, rec.Rejected())
}

// A conversation the template refuses (raise_exception) is the client's
// error: 400 naming messages.
func TestTemplateCannotRender(t *testing.T) {
	tok, _ := tinyChat(t)
	strict, err := chat.NewTemplate(`{%- if messages[0].role != 'system' %}{{ raise_exception('a system message must come first') }}{%- endif %}{%- for m in messages %}{{ m.content }}{%- endfor %}`, tok.SpecialStrings(), nil)
	require.NoError(t, err)
	h := newHarness(t, func(o *Options) { o.Template = strict })
	key, rec := h.open(t, "r")
	status, raw := h.post(t, chatPath("r"), key, `{"messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, http.StatusBadRequest, status, string(raw))
	var e clientError
	require.NoError(t, json.Unmarshal(raw, &e))
	assert.Equal(t, "messages", *e.Error.Param)
	assert.Contains(t, e.Error.Message, "a system message must come first")
	assert.Equal(t, 1, rec.Rejected())
}

func TestAuth(t *testing.T) {
	h := newHarness(t, nil)
	keyA, recA := h.open(t, "a")
	keyB, recB := h.open(t, "b")
	body := `{"messages":[{"role":"user","content":"hi"}]}`
	cases := []struct {
		name   string
		path   string
		header string // Authorization; "" sends none
		status int
		code   string
	}{
		{"own key", chatPath("a"), "Bearer " + keyA, http.StatusOK, ""},
		{"scheme in lower case", chatPath("a"), "bearer " + keyA, http.StatusOK, ""},
		{"no key", chatPath("a"), "", http.StatusUnauthorized, "invalid_api_key"},
		{"another rollout's key", chatPath("a"), "Bearer " + keyB, http.StatusUnauthorized, "invalid_api_key"},
		{"key as basic auth", chatPath("a"), "Basic " + keyA, http.StatusUnauthorized, "invalid_api_key"},
		{"key with a suffix", chatPath("a"), "Bearer " + keyA + "x", http.StatusUnauthorized, "invalid_api_key"},
		{"unknown rollout, with an open rollout's key", chatPath("zzz"), "Bearer " + keyA, http.StatusNotFound, "rollout_not_found"},
		{"unknown rollout, without a key: the same 401 as an open one", chatPath("zzz"), "", http.StatusUnauthorized, "invalid_api_key"},
		{"unknown rollout, a made-up key", chatPath("zzz"), "Bearer sk-ortrain-guess", http.StatusUnauthorized, "invalid_api_key"},
		{"unknown route", "/rollouts/a/v1/embeddings", "Bearer " + keyA, http.StatusNotFound, "unknown_url"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, h.url+tc.path, strings.NewReader(body))
			require.NoError(t, err)
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			status, raw := h.do(t, req)
			require.Equal(t, tc.status, status, string(raw))
			if tc.code != "" {
				var e clientError
				require.NoError(t, json.Unmarshal(raw, &e), string(raw))
				require.NotNil(t, e.Error.Code)
				assert.Equal(t, tc.code, *e.Error.Code)
				assert.NotContains(t, string(raw), keyA, "keys are never echoed")
			}
		})
	}
	// A refusal counts against the rollout whose key was presented, never
	// the targeted one: b's agent reached into a; the rest held no key. a's
	// own calls to a rollout that is not open and to a route the gateway
	// does not serve are a's bad requests.
	assert.Equal(t, 2, recA.Rejected(), "a is blamed only for its own requests, not for requests others send to its URL")
	assert.Equal(t, "POST /rollouts/zzz/v1/chat/completions", recA.Rejections()[0].Route)
	assert.Equal(t, "POST /rollouts/a/v1/embeddings", recA.Rejections()[1].Route)
	assert.Equal(t, 1, recB.Rejected(), "using its key on another rollout counts against b")
	assert.Equal(t, int64(5), h.gw.Unauthorized(), "no key, Basic, a made-up key, twice without a key on a closed id")
	assert.Len(t, recA.Calls(), 2)

	h.gw.Close("a")
	status, raw := h.post(t, chatPath("a"), keyA, body)
	assert.Equal(t, http.StatusUnauthorized, status, "a closed rollout's key opens nothing: %s", raw)
	status, _ = h.get(t, RolloutPath("a")+"/models", keyB)
	assert.Equal(t, http.StatusNotFound, status, "an open rollout's key learns that a is closed")
	assert.Len(t, recA.Calls(), 2, "a closed rollout records nothing more")
}

func TestOpenErrors(t *testing.T) {
	h := newHarness(t, nil)
	h.open(t, "dup")
	_, _, err := h.gw.Open("dup")
	assert.ErrorIs(t, err, ErrRolloutExists)
	for _, id := range []string{"", "a/b", "..", "sp ace", strings.Repeat("x", 129)} {
		_, _, err := h.gw.Open(id)
		assert.ErrorIs(t, err, ErrInvalidRolloutID, "%q", id)
	}
	h.gw.Close("never-opened") // a no-op
	key1, _ := h.open(t, "k1")
	key2, _ := h.open(t, "k2")
	assert.NotEqual(t, key1, key2)
}

// Close cancels a call in flight; the agent gets 404 and nothing is recorded.
func TestCloseCancelsInFlight(t *testing.T) {
	h := newHarness(t, nil)
	key, rec := h.open(t, "r")
	h.sampler.mu.Lock()
	h.sampler.block = true
	h.sampler.mu.Unlock()
	done := h.postAsync(chatPath("r"), key, `{"messages":[{"role":"user","content":"hi"}]}`)
	require.Eventually(t, func() bool {
		h.sampler.mu.Lock()
		defer h.sampler.mu.Unlock()
		return len(h.sampler.requests) == 1
	}, 5*time.Second, 5*time.Millisecond)
	h.gw.Close("r")
	select {
	case res := <-done:
		require.NoError(t, res.err)
		assert.Equal(t, http.StatusNotFound, res.status, string(res.body))
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not cancel the call in flight")
	}
	assert.Empty(t, rec.Calls())
	assert.Zero(t, rec.Failed(), "a closed rollout counts nothing more")
}

// An engine failure is a 500 counted as a failure, not a rejection.
func TestEngineFailure(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.CallTimeout = 50 * time.Millisecond })
	key, rec := h.open(t, "r")
	h.sampler.mu.Lock()
	h.sampler.block = true
	h.sampler.mu.Unlock()
	status, raw := h.post(t, chatPath("r"), key, `{"messages":[{"role":"user","content":"hi"}]}`)
	assert.Equal(t, http.StatusGatewayTimeout, status, string(raw))
	assert.Contains(t, string(raw), "server_error")
	assert.Equal(t, 1, rec.Failed())
	assert.Zero(t, rec.Rejected())
	assert.Empty(t, rec.Calls())
}

// A completion the generation server left without a log-prob is a 502
// counted apart (the rollout ends generation_invalid), never an answer.
func TestEngineInvalidResult(t *testing.T) {
	h := newHarness(t, nil)
	key, rec := h.open(t, "r")
	h.sampler.mu.Lock()
	h.sampler.fail = &engine.InvalidResultError{Server: "http://127.0.0.1:8000", Request: "POST /v1/completions",
		Err: errors.New("completion answer: choice 0: logprobs.token_logprobs[0]: null")}
	h.sampler.mu.Unlock()
	status, raw := h.post(t, chatPath("r"), key, `{"messages":[{"role":"user","content":"hi"}]}`)
	assert.Equal(t, http.StatusBadGateway, status, string(raw))
	assert.Contains(t, string(raw), `"code":"generation_invalid"`)
	assert.Equal(t, 1, rec.Failed())
	assert.Equal(t, 1, rec.InvalidResults())
	assert.Empty(t, rec.Calls())
}

// An agent that hangs up before its completion is ready is counted as a
// rejection, not an engine failure, and nothing is recorded.
func TestClientGoneIsRejected(t *testing.T) {
	h := newHarness(t, nil)
	key, rec := h.open(t, "r")
	h.sampler.mu.Lock()
	h.sampler.block = true
	h.sampler.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url+chatPath("r"), strings.NewReader(`{"messages":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	done := make(chan error, 1)
	go func() {
		resp, err := h.client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	require.Eventually(t, func() bool {
		h.sampler.mu.Lock()
		defer h.sampler.mu.Unlock()
		return len(h.sampler.requests) == 1
	}, 5*time.Second, 5*time.Millisecond)
	cancel()
	require.Error(t, <-done)
	require.Eventually(t, func() bool { return rec.Rejected() == 1 }, 5*time.Second, 5*time.Millisecond)
	assert.Zero(t, rec.Failed())
	assert.Empty(t, rec.Calls())
	assert.Equal(t, statusClientClosed, rec.Rejections()[0].Status)
}
