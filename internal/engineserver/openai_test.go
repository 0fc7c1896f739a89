package engineserver

import (
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/engineserver/servetest"
	"github.com/ortrain/ortrain/internal/vllm"
)

// TestServeTextPrompt: a text prompt on /v1/completions is answered by the
// gateway with OpenAI's text_completion shape, encoded with the model's
// tokenizer (what the openai client's completions.create(prompt="hello")
// sends).
func TestServeTextPrompt(t *testing.T) {
	tok, tc := tinyTextChat(t)
	cs := startChatServer(t, servetest.NewBackend(0.3), tc, nil)
	tests := []struct {
		name, prompt string
	}{
		{"string", `"hello"`},
		{"list of one string", `["hello"]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := cs.post(t, "/v1/completions", `{"model":"toy","prompt":`+tt.prompt+`,"max_tokens":3,"seed":5,"logprobs":1}`)
			require.Equal(t, 200, code, body)
			m := decodeMap(t, body)
			assert.ElementsMatch(t, []string{"id", "object", "created", "model", "choices", "usage"}, keys(m))
			assert.True(t, strings.HasPrefix(m["id"].(string), "cmpl-"), m["id"])
			assert.Equal(t, "text_completion", m["object"])
			assert.Equal(t, "toy", m["model"], "replies name the model as /v1/models lists it")
			prompt := float64(len(tok.Encode("hello")))
			assert.Equal(t, map[string]any{"prompt_tokens": prompt, "completion_tokens": 3.0, "total_tokens": prompt + 3}, m["usage"])
			choices := m["choices"].([]any)
			require.Len(t, choices, 1)
			c := choices[0].(map[string]any)
			assert.Equal(t, "length", c["finish_reason"])
			assert.Len(t, c["logprobs"].(map[string]any)["token_logprobs"], 3)
			assert.IsType(t, "", c["text"])
		})
	}

	// Streamed text: the gateway's chunks, where the token-id handler
	// refuses stream.
	resp := cs.send(t, "/v1/completions", `{"model":"toy","prompt":"hello","max_tokens":3,"stream":true}`, "")
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	events := sseEvents(t, resp.Body)
	require.NotEmpty(t, events)
	assert.Equal(t, "text_completion", events[0]["object"])
}

// TestServeCompletionsDispatch: /v1/completions routes by the prompt alone:
// strings to the gateway (OpenAI errors), token ids to the vLLM-style
// handler (vLLM errors and fields), and anything else is refused naming
// prompt.
func TestServeCompletionsDispatch(t *testing.T) {
	_, tc := tinyTextChat(t)
	cs := startChatServer(t, servetest.NewBackend(0.3), tc, nil)
	tests := []struct {
		name, body string
		code       int
		// openAI: an OpenAI error naming param; vllm: vLLM's error; ok: a
		// vLLM completion with this many choices.
		openAI, param, code_ string
		vllmMsg              string
		choices              int
	}{
		{name: "ids", body: `{"model":"toy","prompt":[1,2],"max_tokens":2,"logprobs":0,"return_token_ids":true}`, code: 200, choices: 1},
		{name: "id lists and n", body: `{"model":"toy","prompt":[[1],[2,3]],"n":2,"max_tokens":2,"logprobs":0,"return_token_ids":true}`, code: 200, choices: 4},
		{name: "ids with stop strings", body: `{"model":"toy","prompt":[1],"stop":["x"]}`, code: 400, vllmMsg: "stop strings are not supported"},
		{name: "ids, unknown model", body: `{"model":"nope","prompt":[1]}`, code: 404, vllmMsg: "The model `nope` does not exist."},
		{name: "missing prompt", body: `{"model":"toy"}`, code: 400, openAI: "prompt is required", param: "prompt"},
		{name: "null prompt", body: `{"model":"toy","prompt":null}`, code: 400, openAI: "prompt is required", param: "prompt"},
		{name: "empty list", body: `{"model":"toy","prompt":[]}`, code: 400, openAI: "prompt is empty", param: "prompt"},
		{name: "object prompt", body: `{"model":"toy","prompt":{"text":"hi"}}`, code: 400, openAI: "prompt must be", param: "prompt"},
		{name: "number prompt", body: `{"model":"toy","prompt":5}`, code: 400, openAI: "prompt must be", param: "prompt"},
		{name: "list of bools", body: `{"model":"toy","prompt":[true]}`, code: 400, openAI: "prompt must be", param: "prompt"},
		{name: "empty string", body: `{"model":"toy","prompt":""}`, code: 400, openAI: "prompt is empty", param: "prompt"},
		{name: "two strings", body: `{"model":"toy","prompt":["a","b"]}`, code: 400, openAI: "holds 2 prompts; send one per request", param: "prompt"},
		{name: "text, n=2", body: `{"model":"toy","prompt":"hi","n":2}`, code: 400, openAI: "n=2", param: "n"},
		{name: "text, unknown model", body: `{"model":"nope","prompt":"hi"}`, code: 404, openAI: "The model `nope` does not exist.", param: "model", code_: "model_not_found"},
		{name: "text, model not a string", body: `{"model":3,"prompt":"hi"}`, code: 400, openAI: "model", param: "model"},
		{name: "bad json", body: `{"model":`, code: 400, openAI: "invalid JSON body"},
		{name: "not an object", body: `[1,2]`, code: 400, openAI: "must be a JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := cs.post(t, "/v1/completions", tt.body)
			require.Equal(t, tt.code, code, body)
			switch {
			case tt.openAI != "":
				e := openAIErr(t, body)
				assert.Contains(t, e.Message, tt.openAI)
				assert.Equal(t, tt.param, deref(e.Param))
				assert.Equal(t, tt.code_, deref(e.Code))
			case tt.vllmMsg != "":
				var e vllm.ErrorResponse
				require.NoError(t, json.Unmarshal([]byte(body), &e), body)
				assert.Contains(t, e.Error.Message, tt.vllmMsg)
				assert.Equal(t, tt.code, e.Error.Code, "vLLM's numeric code: the token-id handler answered")
			default:
				var resp vllm.CompletionResponse
				require.NoError(t, json.Unmarshal([]byte(body), &resp), body)
				require.NoError(t, resp.Validate(tt.choices))
				assert.NotEmpty(t, resp.Choices[0].TokenIDs, "return_token_ids: the token-id handler answered")
			}
		})
	}
}

// TestServeChat: chat completions through serve, with and without tools;
// tool calls are parsed in the template's format (hermes for the tiny
// model), and the reply names the served model as /v1/models does.
func TestServeChat(t *testing.T) {
	tok, tc := tinyTextChat(t)
	toy := startChatServer(t, servetest.NewBackend(0.3), tc, nil)
	scripted := startChatServer(t, newScriptedBackend(tok, weatherCall), tc, nil)
	scriptedText := startChatServer(t, newScriptedBackend(tok, "It is sunny.<|im_end|>"), tc, nil)
	user := `"messages":[{"role":"user","content":"Weather in Paris?"}]`
	tests := []struct {
		name   string
		cs     *chatServer
		body   string
		finish string
		check  func(t *testing.T, msg map[string]any)
	}{
		{"toy, no tools", toy, `{"model":"toy",` + user + `,"max_tokens":4,"seed":3}`, "length", func(t *testing.T, msg map[string]any) {
			assert.IsType(t, "", msg["content"])
			assert.NotContains(t, msg, "tool_calls")
		}},
		{"toy, tools offered", toy, `{"model":"toy",` + user + `,"tools":` + weatherTools + `,"max_tokens":4}`, "length", func(t *testing.T, msg map[string]any) {
			assert.IsType(t, "", msg["content"])
		}},
		{"answer, no tools", scriptedText, `{"model":"toy",` + user + `}`, "stop", func(t *testing.T, msg map[string]any) {
			assert.Equal(t, "It is sunny.", msg["content"])
		}},
		{"tool call", scripted, `{"model":"toy",` + user + `,"tools":` + weatherTools + `}`, "tool_calls", func(t *testing.T, msg map[string]any) {
			assert.Nil(t, msg["content"])
			calls := msg["tool_calls"].([]any)
			require.Len(t, calls, 1)
			call := calls[0].(map[string]any)
			assert.True(t, strings.HasPrefix(call["id"].(string), "call_"))
			assert.Equal(t, "function", call["type"])
			fn := call["function"].(map[string]any)
			assert.Equal(t, "get_weather", fn["name"])
			assert.JSONEq(t, `{"city":"Paris"}`, fn["arguments"].(string))
		}},
		{"tool_choice none", scripted, `{"model":"toy",` + user + `,"tools":` + weatherTools + `,"tool_choice":"none"}`, "stop", func(t *testing.T, msg map[string]any) {
			assert.Contains(t, msg["content"], "<tool_call>", "with tool_choice none the reply is content")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := tt.cs.post(t, "/v1/chat/completions", tt.body)
			require.Equal(t, 200, code, body)
			m := decodeMap(t, body)
			assert.Equal(t, "chat.completion", m["object"])
			assert.True(t, strings.HasPrefix(m["id"].(string), "chatcmpl-"), m["id"])
			assert.Equal(t, "toy", m["model"])
			choice := m["choices"].([]any)[0].(map[string]any)
			assert.Equal(t, tt.finish, choice["finish_reason"])
			msg := choice["message"].(map[string]any)
			assert.Equal(t, "assistant", msg["role"])
			tt.check(t, msg)
			u := m["usage"].(map[string]any)
			assert.Positive(t, u["prompt_tokens"])
			assert.Equal(t, u["prompt_tokens"].(float64)+u["completion_tokens"].(float64), u["total_tokens"])
		})
	}

	// The tools are rendered into the prompt.
	_, plain := toy.post(t, "/v1/chat/completions", `{"model":"toy",`+user+`,"max_tokens":1}`)
	_, withTools := toy.post(t, "/v1/chat/completions", `{"model":"toy",`+user+`,"tools":`+weatherTools+`,"max_tokens":1}`)
	plainUsage := decodeMap(t, plain)["usage"].(map[string]any)
	toolsUsage := decodeMap(t, withTools)["usage"].(map[string]any)
	assert.Greater(t, toolsUsage["prompt_tokens"], plainUsage["prompt_tokens"])

	// "model" in replies is an id /v1/models lists.
	_, models := get(t, toy.url+"/v1/models")
	var list vllm.ModelList
	require.NoError(t, json.Unmarshal([]byte(models), &list))
	require.Len(t, list.Data, 1)
	assert.Equal(t, "toy", list.Data[0].ID)
	code, body := toy.post(t, "/v1/chat/completions", `{"model":"gpt-4o",`+user+`}`)
	assert.Equal(t, 404, code)
	assert.Equal(t, "model_not_found", deref(openAIErr(t, body).Code))
}

// TestServeChatStream: a streamed chat reply is OpenAI's chunk sequence,
// ending with the usage chunk (when asked for) and [DONE].
func TestServeChatStream(t *testing.T) {
	tok, tc := tinyTextChat(t)
	tests := []struct {
		name, reply, tools string
		content            string
		call               string // the streamed call's name; "" for none
		finish             string
	}{
		{"content", "It is sunny.<|im_end|>", "", "It is sunny.", "", "stop"},
		{"tool call", weatherCall, `,"tools":` + weatherTools, "", "get_weather", "tool_calls"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs := startChatServer(t, newScriptedBackend(tok, tt.reply), tc, nil)
			resp := cs.send(t, "/v1/chat/completions", `{"model":"toy","messages":[{"role":"user","content":"Weather?"}]`+tt.tools+
				`,"stream":true,"stream_options":{"include_usage":true}}`, "")
			defer resp.Body.Close()
			require.Equal(t, 200, resp.StatusCode)
			assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
			events := sseEvents(t, resp.Body)
			require.GreaterOrEqual(t, len(events), 3)
			var content, name, args, finish string
			for _, ev := range events[:len(events)-1] {
				assert.Equal(t, "chat.completion.chunk", ev["object"])
				assert.Equal(t, "toy", ev["model"])
				choice := ev["choices"].([]any)[0].(map[string]any)
				delta := choice["delta"].(map[string]any)
				if c, ok := delta["content"].(string); ok {
					content += c
				}
				for _, c := range asList(delta["tool_calls"]) {
					fn := c.(map[string]any)["function"].(map[string]any)
					if n, ok := fn["name"].(string); ok {
						name += n
					}
					args += fn["arguments"].(string)
				}
				if f, ok := choice["finish_reason"].(string); ok {
					finish = f
				}
			}
			first := events[0]["choices"].([]any)[0].(map[string]any)["delta"].(map[string]any)
			assert.Equal(t, "assistant", first["role"])
			assert.Equal(t, tt.content, content)
			assert.Equal(t, tt.call, name)
			if tt.call != "" {
				assert.JSONEq(t, `{"city":"Paris"}`, args)
			}
			assert.Equal(t, tt.finish, finish)
			last := events[len(events)-1]
			assert.Empty(t, last["choices"])
			assert.Positive(t, last["usage"].(map[string]any)["completion_tokens"])
		})
	}
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

// TestServeOpenAIRoutesNeedAPIKey: with a key, chat and every completion
// answer 401 without it or with a wrong one, in vLLM's shape (its
// middleware answers before any route), and serve with it.
func TestServeOpenAIRoutesNeedAPIKey(t *testing.T) {
	_, tc := tinyTextChat(t)
	cs := startChatServer(t, servetest.NewBackend(0), tc, func(o *Options) { o.APIKey = "k-123" })
	tests := []struct{ name, path, body string }{
		{"chat", "/v1/chat/completions", `{"model":"toy","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`},
		{"text", "/v1/completions", `{"model":"toy","prompt":"hi","max_tokens":2}`},
		{"token ids", "/v1/completions", `{"model":"toy","prompt":[1],"max_tokens":2}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, token := range []string{"", "k-12", "k-1234"} {
				resp := cs.send(t, tt.path, tt.body, token)
				b, _ := readAll(resp)
				assert.Equal(t, 401, resp.StatusCode, "key %q", token)
				assert.JSONEq(t, `{"error":"Unauthorized"}`, b)
			}
			code, body := cs.post(t, tt.path, tt.body)
			assert.Equal(t, 200, code, body)
		})
	}
}

// TestServeChatUsesAdapters: "model" naming a loaded adapter samples with
// it (the toy's log-probs move with the adapter's slope) and is named in
// the reply; once unloaded it is not found.
func TestServeChatUsesAdapters(t *testing.T) {
	_, tc := tinyTextChat(t)
	cs := startChatServer(t, servetest.NewBackend(0), tc, func(o *Options) { o.LoRA, o.RuntimeLoRA = true, true })
	dir := t.TempDir()
	servetest.WriteWeights(t, dir, servetest.Weights{Slope: 1})
	code, body := cs.post(t, "/v1/load_lora_adapter", `{"lora_name":"policy-v1","lora_path":"`+dir+`"}`)
	require.Equal(t, 200, code, body)
	chatBody := `{"model":"policy-v1","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"temperature":1,"logprobs":true}`
	tests := []struct {
		name, path, body string
		logprobs         func(m map[string]any) []any
	}{
		{"chat", "/v1/chat/completions", chatBody, func(m map[string]any) []any {
			var out []any
			for _, c := range m["choices"].([]any)[0].(map[string]any)["logprobs"].(map[string]any)["content"].([]any) {
				out = append(out, c.(map[string]any)["logprob"])
			}
			return out
		}},
		{"text", "/v1/completions", `{"model":"policy-v1","prompt":"hi","max_tokens":3,"temperature":1,"logprobs":0}`, func(m map[string]any) []any {
			return m["choices"].([]any)[0].(map[string]any)["logprobs"].(map[string]any)["token_logprobs"].([]any)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := cs.post(t, tt.path, tt.body)
			require.Equal(t, 200, code, body)
			m := decodeMap(t, body)
			assert.Equal(t, "policy-v1", m["model"])
			lps := tt.logprobs(m)
			require.Len(t, lps, 3)
			for _, lp := range lps {
				assert.True(t, slices.ContainsFunc([]int32{0, 1, 2, 3, 4, 5, 6, 7}, func(id int32) bool {
					return math.Abs(lp.(float64)-float64(servetest.Logprob(1, id))) < 1e-4
				}), "log-prob %v is the adapter's (slope 1), not the base's (slope 0)", lp)
			}
		})
	}
	code, body = cs.post(t, "/v1/unload_lora_adapter", `{"lora_name":"policy-v1"}`)
	require.Equal(t, 200, code, body)
	code, body = cs.post(t, "/v1/chat/completions", chatBody)
	assert.Equal(t, 404, code)
	assert.Equal(t, "model", deref(openAIErr(t, body).Param))
}

// TestServeChatHeldByPause: /pause holds chat requests until /resume, and
// abort ends an in-flight one with an error that says why.
func TestServeChatHeldByPause(t *testing.T) {
	_, tc := tinyTextChat(t)
	backend := servetest.NewBackend(0)
	cs := startChatServer(t, backend, tc, func(o *Options) { o.DevMode = true })
	body := `{"model":"toy","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
	code, _ := cs.post(t, "/pause?mode=wait", "")
	require.Equal(t, 200, code)
	done := make(chan int, 1)
	go func() { c, _ := cs.post(t, "/v1/chat/completions", body); done <- c }()
	select {
	case <-done:
		t.Fatal("a chat request completed while paused")
	case <-time.After(200 * time.Millisecond):
	}
	cs.post(t, "/resume", "")
	select {
	case c := <-done:
		assert.Equal(t, 200, c)
	case <-time.After(10 * time.Second):
		t.Fatal("chat request not served after resume")
	}

	backend.Delay = 2 * time.Second
	got := make(chan string, 1)
	go func() { _, b := cs.post(t, "/v1/chat/completions", body); got <- b }()
	require.Eventually(t, func() bool { return backend.Batches.Load() >= 2 }, 5*time.Second, 5*time.Millisecond)
	code, _ = cs.post(t, "/pause?mode=abort", "")
	require.Equal(t, 200, code)
	assert.Contains(t, openAIErr(t, <-got).Message, "aborted by POST /pause?mode=abort")
	cs.post(t, "/resume", "")
}

// TestServeWithoutTextChat: a server built without a tokenizer still
// serves token ids and refuses chat with an OpenAI error.
func TestServeWithoutTextChat(t *testing.T) {
	cs := startChatServer(t, servetest.NewBackend(0), nil, nil)
	code, body := cs.post(t, "/v1/chat/completions", `{"model":"toy","messages":[{"role":"user","content":"hi"}]}`)
	assert.Equal(t, 400, code)
	assert.Contains(t, openAIErr(t, body).Message, "need the model's tokenizer")
	code, body = cs.post(t, "/v1/completions", `{"model":"toy","prompt":"hi"}`)
	assert.Equal(t, 400, code)
	assert.Contains(t, body, "does not tokenize text")
	code, body = cs.post(t, "/v1/completions", `{"model":"toy","prompt":[1],"max_tokens":1}`)
	assert.Equal(t, 200, code, body)
}

// TestNewTextChat: the tool-call format is detected or named; a model
// without a chat template serves text but not chat; one whose template
// writes no known tool syntax refuses requests with tools.
func TestNewTextChat(t *testing.T) {
	load := func(t *testing.T, edit func(dir string)) *chat.Tokenizer {
		dir := tinyModelDir(t)
		if edit != nil {
			edit(dir)
		}
		tok, err := chat.LoadTokenizer(dir)
		require.NoError(t, err)
		return tok
	}
	noTemplate := func(dir string) {
		path := filepath.Join(dir, "tokenizer_config.json")
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		var cfg map[string]any
		require.NoError(t, json.Unmarshal(raw, &cfg))
		delete(cfg, "chat_template")
		raw, err = json.Marshal(cfg)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, raw, 0o644))
	}
	plainChatML := func(dir string) {
		src := "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
		require.NoError(t, os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte(src), 0o644))
	}
	t.Run("named format", func(t *testing.T) {
		tc, err := NewTextChat(load(t, nil), "llama3_json")
		require.NoError(t, err)
		assert.Equal(t, chat.FormatLlama3JSON, tc.Format())
		assert.Empty(t, tc.Warnings)
	})
	t.Run("unknown format name", func(t *testing.T) {
		_, err := NewTextChat(load(t, nil), "yaml")
		assert.ErrorContains(t, err, `unknown tool-call format "yaml"`)
	})
	t.Run("no tokenizer", func(t *testing.T) {
		_, err := NewTextChat(nil, "auto")
		assert.ErrorContains(t, err, "no tokenizer")
	})
	t.Run("no chat template", func(t *testing.T) {
		tc, err := NewTextChat(load(t, noTemplate), "auto")
		require.NoError(t, err)
		require.Len(t, tc.Warnings, 1)
		cs := startChatServer(t, servetest.NewBackend(0), tc, nil)
		code, body := cs.post(t, "/v1/chat/completions", `{"model":"toy","messages":[{"role":"user","content":"hi"}]}`)
		assert.Equal(t, 400, code)
		assert.Contains(t, openAIErr(t, body).Message, "no chat template")
		code, body = cs.post(t, "/v1/completions", `{"model":"toy","prompt":"hi","max_tokens":2}`)
		assert.Equal(t, 200, code, body)
	})
	t.Run("template without tool syntax", func(t *testing.T) {
		tc, err := NewTextChat(load(t, plainChatML), "auto")
		require.NoError(t, err)
		assert.Equal(t, chat.FormatNone, tc.Format())
		require.Len(t, tc.Warnings, 1)
		cs := startChatServer(t, servetest.NewBackend(0), tc, nil)
		user := `"messages":[{"role":"user","content":"hi"}],"max_tokens":2`
		code, body := cs.post(t, "/v1/chat/completions", `{"model":"toy",`+user+`,"tools":`+weatherTools+`}`)
		assert.Equal(t, 400, code)
		assert.Equal(t, "tools", deref(openAIErr(t, body).Param))
		for _, ok := range []string{`{"model":"toy",` + user + `}`, `{"model":"toy",` + user + `,"tools":[]}`,
			`{"model":"toy",` + user + `,"tools":` + weatherTools + `,"tool_choice":"none"}`} {
			code, body = cs.post(t, "/v1/chat/completions", ok)
			assert.Equal(t, 200, code, body)
		}
	})
}

func readAll(resp *http.Response) (string, error) {
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// FuzzServeCompletionsDispatch: with text and chat enabled, any body on
// /v1/completions gets 200 or a JSON error (OpenAI's or vLLM's), never a
// panic or a hang.
func FuzzServeCompletionsDispatch(f *testing.F) {
	for _, s := range []string{
		`{"model":"toy","prompt":[1,2],"max_tokens":3,"n":2,"seed":1,"logprobs":0,"return_token_ids":true}`,
		`{"prompt":"hi","max_tokens":2}`, `{"prompt":["hi"],"max_tokens":2}`, `{"prompt":["a",[1]]}`, `{"prompt":[[1],"a"]}`,
		`{"prompt":[-1]}`, `{"prompt":[1e3]}`, `{"prompt":[{}]}`, `{"prompt":"hi","model":["x"]}`, `{}`, `[`, `null`, `"x"`,
	} {
		f.Add(s)
	}
	_, tc := tinyTextChat(f)
	srv := NewServer(servetest.NewBackend(0.1), Options{ModelName: "toy", MaxModelLen: 256, TextChat: tc, Batch: engine.BuiltinOptions{MaxBatch: 4}})
	defer srv.Close()
	f.Fuzz(func(t *testing.T, body string) {
		if len(body) > 4000 {
			return
		}
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body)))
		var m map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &m), "status %d: %s", rec.Code, rec.Body.String())
		switch rec.Code {
		case 200:
			require.Contains(t, m, "choices")
		case 400, 404:
			require.Contains(t, m, "error")
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body.String())
		}
	})
}
