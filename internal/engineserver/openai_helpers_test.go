package engineserver

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/engineserver/servetest"
	"github.com/ortrain/ortrain/internal/model"
)

// tinyModelDir writes `ortrain init-model --preset tiny` into a temp dir:
// a byte-level tokenizer and the Qwen2.5 ChatML template with tools.
func tinyModelDir(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tiny")
	preset, ok := model.PresetByName("tiny")
	require.True(t, ok)
	require.NoError(t, model.InitOverwrite(dir, preset, 1))
	return dir
}

// tinyTextChat is the tiny model's tokenizer and TextChat (tool calls
// detected as hermes).
func tinyTextChat(t testing.TB) (*chat.Tokenizer, *TextChat) {
	t.Helper()
	tok, err := chat.LoadTokenizer(tinyModelDir(t))
	require.NoError(t, err)
	tc, err := NewTextChat(tok, "auto")
	require.NoError(t, err)
	require.Equal(t, chat.FormatHermes, tc.Format())
	return tok, tc
}

// scriptedBackend is the toy backend whose samples are the ids of a fixed
// reply instead (cut after the first stop id, or at max_tokens), so what
// the gateway parses (tool calls) can be checked through serve.
type scriptedBackend struct {
	*servetest.Backend
	ids []int32
}

// newScriptedBackend scripts reply; "<|im_end|>" in it encodes to the end
// of turn.
func newScriptedBackend(tok *chat.Tokenizer, reply string) *scriptedBackend {
	return &scriptedBackend{Backend: servetest.NewBackend(0), ids: tok.Encode(reply)}
}

func (b *scriptedBackend) SampleBatch(ctx context.Context, adapter string, reqs []engine.Request) ([]engine.Result, error) {
	b.Batches.Add(1)
	out := make([]engine.Result, len(reqs))
	for i, r := range reqs {
		ids, stop := b.ids, engine.StopLength
		if j := slices.IndexFunc(ids, func(id int32) bool { return slices.Contains(r.StopIDs, id) }); j >= 0 {
			ids, stop = ids[:j+1], engine.StopToken
		}
		if len(ids) > r.MaxTokens {
			ids, stop = ids[:r.MaxTokens], engine.StopLength
		}
		lp := make([]float32, len(ids))
		for k := range lp {
			lp[k] = -0.25
		}
		out[i] = engine.Result{IDs: slices.Clone(ids), Logprobs: lp, StopReason: stop}
	}
	return out, nil
}

// weatherCall is what the scripted model answers when offered weatherTools.
const weatherCall = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>"

const weatherTools = `[{"type":"function","function":{"name":"get_weather","description":"Current weather in a city",
	"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`

// chatServer is a Server with text and chat completions, served by Run on
// 127.0.0.1:0 (the way the command serves it).
type chatServer struct {
	url string
	srv *Server
	key string
}

// startChatServer serves backend as "toy" with tc; configure adjusts the
// options first.
func startChatServer(t testing.TB, backend Backend, tc *TextChat, configure func(*Options)) *chatServer {
	t.Helper()
	opts := Options{ModelName: "toy", ModelRoot: "/models/toy", MaxModelLen: 4096, EOSIDs: []int32{7}, TextChat: tc,
		Batch:  engine.BuiltinOptions{MaxBatch: 16, Linger: time.Millisecond},
		Logger: zerolog.New(zerolog.NewTestWriter(t)), Now: func() time.Time { return time.Unix(1700000000, 0) }}
	if configure != nil {
		configure(&opts)
	}
	srv := NewServer(backend, opts)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, l, srv) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		srv.Close()
	})
	return &chatServer{url: "http://" + l.Addr().String(), srv: srv, key: opts.APIKey}
}

// post sends body to path with the server's key (if any) and returns the
// status and the body.
func (cs *chatServer) post(t testing.TB, path, body string) (int, string) {
	t.Helper()
	resp := cs.send(t, path, body, cs.key)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// send posts body with token as the Bearer key ("" sends none); the caller
// closes the response.
func (cs *chatServer) send(t testing.TB, path, body, token string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, cs.url+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	return resp
}

// openAIErrorBody and openAIErrorInfo are OpenAI's error JSON as a client
// reads it.
type openAIErrorBody struct {
	Error openAIErrorInfo `json:"error"`
}

type openAIErrorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// openAIErr decodes an OpenAI error body.
func openAIErr(t testing.TB, body string) openAIErrorInfo {
	t.Helper()
	var e openAIErrorBody
	require.NoError(t, json.Unmarshal([]byte(body), &e), body)
	require.NotEmpty(t, e.Error.Message, body)
	require.NotEmpty(t, e.Error.Type, body)
	return e.Error
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// sseEvents reads a stream's data payloads up to [DONE], which must end it.
func sseEvents(t testing.TB, r io.Reader) []map[string]any {
	t.Helper()
	var events []map[string]any
	sc := bufio.NewScanner(r)
	done := false
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		require.False(t, done, "data after [DONE]: %q", line)
		data, ok := strings.CutPrefix(line, "data: ")
		require.True(t, ok, "SSE line without data: %q", line)
		if data == "[DONE]" {
			done = true
			continue
		}
		events = append(events, decodeMap(t, data))
	}
	require.NoError(t, sc.Err())
	require.True(t, done, "the stream ends with [DONE]")
	return events
}
