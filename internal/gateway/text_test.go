package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type clientText struct {
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Text     string `json:"text"`
		Logprobs *struct {
			Tokens        []string             `json:"tokens"`
			TokenLogprobs []float64            `json:"token_logprobs"`
			TopLogprobs   []map[string]float64 `json:"top_logprobs"`
			TextOffset    []int                `json:"text_offset"`
		} `json:"logprobs"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *clientUsage `json:"usage"`
}

func TestTextCompletions(t *testing.T) {
	h := newHarness(t, nil)
	key, rec := h.open(t, "r")
	h.sampler.script("ok then", true)
	hello := h.tok.Encode("<|im_start|>user\nhello<|im_end|>")
	cases := []struct {
		name   string
		prompt any
		ids    []int32
	}{
		{"string, special tokens recognized", "<|im_start|>user\nhello<|im_end|>", hello},
		{"token ids", hello, hello},
		{"one-element list of a string", []string{"<|im_start|>user\nhello<|im_end|>"}, hello},
		{"one-element list of ids", [][]int32{hello}, hello},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, raw := h.post(t, textPath("r"), key, map[string]any{"model": "m", "prompt": tc.prompt, "logprobs": 0})
			require.Equal(t, http.StatusOK, status, string(raw))
			var resp clientText
			require.NoError(t, json.Unmarshal(raw, &resp))
			assert.Equal(t, "text_completion", resp.Object)
			require.Len(t, resp.Choices, 1)
			c := resp.Choices[0]
			assert.Equal(t, "ok then", c.Text, "special tokens are left out of text, as vLLM does")
			assert.Equal(t, "stop", *c.FinishReason)
			require.NotNil(t, c.Logprobs)
			assert.Equal(t, []string{"o", "k", " ", "t", "h", "e", "n", ""}, c.Logprobs.Tokens)
			assert.Equal(t, -0.01, c.Logprobs.TokenLogprobs[0])
			assert.Equal(t, map[string]float64{"o": -0.01}, c.Logprobs.TopLogprobs[0])
			assert.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, c.Logprobs.TextOffset)

			req := h.sampler.lastRequest(t)
			assert.Equal(t, tc.ids, req.PromptIDs)
			assert.Equal(t, "r", req.SessionKey)
			calls := rec.Calls()
			require.Len(t, calls, i+1)
			call := calls[i]
			assert.Equal(t, KindText, call.Kind)
			assert.Equal(t, tc.ids, call.PromptIDs)
			assert.Equal(t, append(h.tok.Encode("ok then"), h.sampler.imEnd), call.CompletionIDs)
			assert.Equal(t, *resp.Usage, clientUsage{PromptTokens: len(tc.ids), CompletionTokens: 8, TotalTokens: len(tc.ids) + 8})
		})
	}

	t.Run("stop string and stream", func(t *testing.T) {
		status, raw := h.post(t, textPath("r"), key, map[string]any{"prompt": "x", "stop": " th", "stream": true,
			"stream_options": map[string]any{"include_usage": true}})
		require.Equal(t, http.StatusOK, status, string(raw))
		var text, finish string
		var usage *clientUsage
		done := false
		sc := bufio.NewScanner(bytes.NewReader(raw))
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			if data == "[DONE]" {
				done = true
				continue
			}
			var chunk clientText
			require.NoError(t, json.Unmarshal([]byte(data), &chunk))
			assert.Equal(t, "text_completion", chunk.Object)
			for _, c := range chunk.Choices {
				text += c.Text
				if c.FinishReason != nil {
					finish = *c.FinishReason
				}
			}
			if chunk.Usage != nil {
				usage = chunk.Usage
			}
		}
		assert.True(t, done)
		assert.Equal(t, "ok", text)
		assert.Equal(t, "stop", finish)
		require.NotNil(t, usage)
		assert.Equal(t, len("ok th"), usage.CompletionTokens)
		last := rec.Calls()[len(rec.Calls())-1]
		assert.Equal(t, h.tok.Encode("ok th"), last.CompletionIDs)
	})
}

func TestTextCompletionBadRequests(t *testing.T) {
	h := newHarness(t, nil)
	key, rec := h.open(t, "r")
	cases := []struct {
		name, body, param string
	}{
		{"no prompt", `{"model":"m"}`, "prompt"},
		{"empty prompt", `{"prompt":""}`, "prompt"},
		{"empty ids", `{"prompt":[]}`, "prompt"},
		{"two prompts", `{"prompt":["a","b"]}`, "prompt"},
		{"id out of vocabulary", `{"prompt":[1,2,100000]}`, "prompt"},
		{"negative id", `{"prompt":[-1]}`, "prompt"},
		{"n=3", `{"prompt":"a","n":3}`, "n"},
		{"echo", `{"prompt":"a","echo":true}`, "echo"},
		{"best_of", `{"prompt":"a","best_of":2}`, "best_of"},
		{"logprobs 6", `{"prompt":"a","logprobs":6}`, "logprobs"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, raw := h.post(t, textPath("r"), key, tc.body)
			require.Equal(t, http.StatusBadRequest, status, string(raw))
			var e clientError
			require.NoError(t, json.Unmarshal(raw, &e))
			require.NotNil(t, e.Error.Param, e.Error.Message)
			assert.Equal(t, tc.param, *e.Error.Param)
		})
	}
	assert.Equal(t, len(cases), rec.Rejected())
}

func TestModels(t *testing.T) {
	h := newHarness(t, nil)
	key, _ := h.open(t, "r")
	status, raw := h.get(t, RolloutPath("r")+"/models", key)
	require.Equal(t, http.StatusOK, status, string(raw))
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Created int64  `json:"created"`
			OwnedBy string `json:"owned_by"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal(raw, &list))
	assert.Equal(t, "list", list.Object)
	require.Len(t, list.Data, 1)
	assert.Equal(t, "tiny-policy", list.Data[0].ID)
	assert.Equal(t, "model", list.Data[0].Object)
	assert.Equal(t, "ortrain", list.Data[0].OwnedBy)
	assert.Positive(t, list.Data[0].Created)
	status, _ = h.get(t, RolloutPath("r")+"/models", "")
	assert.Equal(t, http.StatusUnauthorized, status)
}

func TestSingleTenant(t *testing.T) {
	cases := []struct {
		name   string
		apiKey string
		sent   string
		status int
	}{
		{"open", "", "", http.StatusOK},
		{"open ignores a key", "", "whatever", http.StatusOK},
		{"key required and sent", "secret", "secret", http.StatusOK},
		{"key required, none sent", "secret", "", http.StatusUnauthorized},
		{"key required, wrong sent", "secret", "other", http.StatusUnauthorized},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *Options) { o.SingleTenant = &SingleTenant{APIKey: tc.apiKey} })
			status, raw := h.post(t, "/v1/chat/completions", tc.sent, `{"messages":[{"role":"user","content":"hi"}]}`)
			require.Equal(t, tc.status, status, string(raw))
			status, _ = h.get(t, "/v1/models", tc.sent)
			assert.Equal(t, tc.status, status)
			if tc.status == http.StatusOK {
				assert.Equal(t, "", h.sampler.lastRequest(t).SessionKey, "no session outside rollouts")
			}
			// Rollouts are served beside it.
			key, rec := h.open(t, "r")
			status, _ = h.post(t, chatPath("r"), key, `{"messages":[{"role":"user","content":"hi"}]}`)
			assert.Equal(t, http.StatusOK, status)
			assert.Len(t, rec.Calls(), 1)
		})
	}
	// Without SingleTenant, /v1 is not served.
	h := newHarness(t, nil)
	status, _ := h.post(t, "/v1/chat/completions", "", `{"messages":[{"role":"user","content":"hi"}]}`)
	assert.Equal(t, http.StatusNotFound, status)
}

func TestMaxTokensLimits(t *testing.T) {
	cases := []struct {
		name        string
		maxModelLen int
		cap         int
		request     any // max_tokens; nil leaves it out
		want        int // MaxTokens the engine gets; -1: refused
	}{
		{"default", 0, 0, nil, 1024},
		{"requested", 0, 0, 50, 50},
		{"capped", 0, 40, 50, 40},
		{"default capped", 0, 40, nil, 40},
		{"context room", 100, 0, 500, -2}, // filled in below: 100 - prompt
		{"prompt fills the context", 3, 0, 5, -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *Options) { o.MaxModelLen = tc.maxModelLen; o.Defaults.MaxTokensCap = tc.cap })
			key, _ := h.open(t, "r")
			body := map[string]any{"prompt": "hello"}
			if tc.request != nil {
				body["max_tokens"] = tc.request
			}
			status, raw := h.post(t, textPath("r"), key, body)
			if tc.want == -1 {
				require.Equal(t, http.StatusBadRequest, status, string(raw))
				assert.Contains(t, string(raw), "context_length_exceeded")
				return
			}
			require.Equal(t, http.StatusOK, status, string(raw))
			want := tc.want
			if want == -2 {
				want = tc.maxModelLen - len(h.tok.Encode("hello"))
			}
			assert.Equal(t, want, h.sampler.lastRequest(t).MaxTokens)
		})
	}
}

func TestNewChecksOptions(t *testing.T) {
	tok, tmpl := tinyChat(t)
	s := newFakeSampler(t, tok)
	base := Options{Model: "m", Tokenizer: tok, Template: tmpl, Sampler: s}
	cases := []struct {
		name   string
		modify func(*Options)
		errMsg string
	}{
		{"no tokenizer", func(o *Options) { o.Tokenizer = nil }, "Tokenizer"},
		{"no template", func(o *Options) { o.Template = nil }, "Template"},
		{"no sampler", func(o *Options) { o.Sampler = nil }, "Sampler"},
		{"no model", func(o *Options) { o.Model = "" }, "Model"},
		{"bad top_p", func(o *Options) { o.Defaults.Sampling.TopP = 2 }, "top_p"},
		{"negative cap", func(o *Options) { o.Defaults.MaxTokensCap = -1 }, "MaxTokensCap"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.modify(&o)
			_, err := New(o)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.errMsg)
		})
	}
	_, err := New(base)
	assert.NoError(t, err)
}
