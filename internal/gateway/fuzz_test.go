package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// FuzzChatRequest sends arbitrary bodies through the chat handler: every
// one is answered 200 (a completion or a stream ending in [DONE]) or with an
// OpenAI error (400 or 413), never a panic or a 500; a 200 is recorded,
// an error counted as rejected and not recorded.
func FuzzChatRequest(f *testing.F) {
	for _, seed := range []string{
		`{"messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"tools":[` + string(weatherToolJSON) + `],"tool_choice":"required","messages":[{"role":"system","content":"s"},{"role":"user","content":"u"},` +
			`{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"x\"}"}}]},` +
			`{"role":"tool","tool_call_id":"c","content":"ok"}],"stop":["x","y"],"logprobs":true,"top_logprobs":3,"max_tokens":5,"seed":1}`,
		`{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":{"a":[1,2]}}}]}],"n":1,"temperature":0}`,
		`{"messages":[{"role":"tool","content":null}],"tool_choice":{"type":"function","function":{"name":"f"}}}`,
		`{"messages":[],"n":2}`, `{"messages":"x"}`, `null`, `[]`, `{`, ``, `{"messages":[{"role":"user","content":"a"}],"max_tokens":1e400}`,
	} {
		f.Add([]byte(seed))
	}
	h := newHarness(f, func(o *Options) { o.Logger = zerolog.Nop(); o.MaxBodyBytes = 1 << 16 })
	h.sampler.setKeep(false)
	handler := h.gw.Handler()
	f.Fuzz(func(t *testing.T, body []byte) {
		// A fresh rollout per input keeps memory flat over long fuzzing runs.
		key, rec, err := h.gw.Open("fuzz")
		if err != nil {
			t.Fatal(err)
		}
		defer h.gw.Close("fuzz")
		req := httptest.NewRequest(http.MethodPost, chatPath("fuzz"), bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, req)
		out := w.Body.Bytes()
		switch w.Code {
		case http.StatusOK:
			if strings.HasPrefix(w.Header().Get("Content-Type"), "text/event-stream") {
				if !bytes.HasSuffix(out, []byte("data: [DONE]\n\n")) {
					t.Fatalf("stream does not end with [DONE]: %q", out)
				}
			} else if !json.Valid(out) {
				t.Fatalf("invalid JSON reply: %q", out)
			}
			if len(rec.Calls()) != 1 {
				t.Fatalf("a served call was not recorded")
			}
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			var e clientError
			if err := json.Unmarshal(out, &e); err != nil || e.Error.Message == "" {
				t.Fatalf("error reply is not OpenAI's shape: %q", out)
			}
			if rec.Rejected() != 1 || len(rec.Calls()) != 0 {
				t.Fatalf("a refused request must be counted and not recorded")
			}
		default:
			t.Fatalf("status %d for body %q: %s", w.Code, body, out)
		}
	})
}
