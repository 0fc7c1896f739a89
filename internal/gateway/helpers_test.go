package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/model"
)

// tinyChat loads the byte-level tokenizer and the Qwen2.5 ChatML tool
// template that `ortrain init-model --preset tiny` writes.
func tinyChat(tb testing.TB) (*chat.Tokenizer, *chat.Template) {
	tb.Helper()
	dir := tb.TempDir()
	preset, ok := model.PresetByName("tiny")
	require.True(tb, ok)
	require.NoError(tb, model.InitOverwrite(dir, preset, 1))
	tok, err := chat.LoadTokenizer(dir)
	require.NoError(tb, err)
	tmpl, err := tok.Template("")
	require.NoError(tb, err)
	return tok, tmpl
}

// fakeSampler is a deterministic engine.Generator: it "samples" the ids of
// a scripted text (plus <|im_end|> when the turn ends), with log-probs
// -0.01·(i+1), and keeps the requests it got.
type fakeSampler struct {
	tok   *chat.Tokenizer
	imEnd int32
	keep  bool // record requests (off in benchmarks)

	mu       sync.Mutex
	reply    func(req engine.Request) (text string, endTurn bool)
	block    bool  // wait for the context instead of answering
	fail     error // answer every request with this error
	requests []engine.Request
}

func newFakeSampler(tb testing.TB, tok *chat.Tokenizer) *fakeSampler {
	id, ok := tok.TokenID(model.TokenIMEnd)
	require.True(tb, ok)
	return &fakeSampler{tok: tok, imEnd: id, keep: true,
		reply: func(engine.Request) (string, bool) { return "Hello there.", true }}
}

// script sets the text every later request samples.
func (f *fakeSampler) script(text string, endTurn bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reply = func(engine.Request) (string, bool) { return text, endTurn }
}

var _ engine.Generator = (*fakeSampler)(nil)

// setKeep turns request recording on or off.
func (f *fakeSampler) setKeep(keep bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keep = keep
}

func (f *fakeSampler) Generate(ctx context.Context, req engine.Request) (engine.Result, error) {
	f.mu.Lock()
	reply, block, fail := f.reply, f.block, f.fail
	if f.keep {
		f.requests = append(f.requests, req)
	}
	f.mu.Unlock()
	if block {
		<-ctx.Done()
		return engine.Result{}, ctx.Err()
	}
	if fail != nil {
		return engine.Result{}, fail
	}
	text, end := reply(req)
	ids := f.tok.Encode(text)
	stop := engine.StopLength
	if end {
		ids, stop = append(ids, f.imEnd), engine.StopToken
	}
	if len(ids) > req.MaxTokens {
		ids, stop = ids[:req.MaxTokens], engine.StopLength
	}
	return engine.Result{IDs: ids, Logprobs: fakeLogprobs(len(ids)), StopReason: stop}, nil
}

func fakeLogprobs(n int) []float32 {
	lp := make([]float32, n)
	for i := range lp {
		lp[i] = -0.01 * float32(i+1)
	}
	return lp
}

func (f *fakeSampler) SyncWeights(context.Context, int) error { return nil }
func (f *fakeSampler) Close() error                           { return nil }

func (f *fakeSampler) lastRequest(tb testing.TB) engine.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	require.NotEmpty(tb, f.requests, "the sampler got no request")
	return f.requests[len(f.requests)-1]
}

// harness is a gateway over the tiny chat stack and a fake sampler, served
// on 127.0.0.1:0.
type harness struct {
	tok     *chat.Tokenizer
	tmpl    *chat.Template
	sampler *fakeSampler
	gw      *Gateway
	url     string
	client  *http.Client
	version atomic.Int64
}

func newHarness(tb testing.TB, configure func(*Options)) *harness {
	tb.Helper()
	tok, tmpl := tinyChat(tb)
	h := &harness{tok: tok, tmpl: tmpl, sampler: newFakeSampler(tb, tok)}
	format, err := chat.DetectToolCallFormat(tmpl.Source())
	require.NoError(tb, err)
	opts := Options{Model: "tiny-policy", Tokenizer: tok, Template: tmpl, Format: format, Sampler: h.sampler,
		WeightVersion: func() int { return int(h.version.Load()) },
		Logger:        zerolog.New(zerolog.NewTestWriter(tb)).Level(zerolog.InfoLevel)}
	if configure != nil {
		configure(&opts)
	}
	h.gw, err = New(opts)
	require.NoError(tb, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	srv := &http.Server{Handler: h.gw.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	h.url = "http://" + ln.Addr().String()
	h.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	tb.Cleanup(h.client.CloseIdleConnections)
	return h
}

// open starts a rollout that the test closes on cleanup.
func (h *harness) open(tb testing.TB, id string) (string, *Recorder) {
	tb.Helper()
	key, rec, err := h.gw.Open(id)
	require.NoError(tb, err)
	tb.Cleanup(func() { h.gw.Close(id) })
	return key, rec
}

// post sends body (a string is sent as is, anything else as JSON) with the
// bearer key ("" sends none).
func (h *harness) post(tb testing.TB, path, key string, body any) (int, []byte) {
	tb.Helper()
	data, ok := body.(string)
	if !ok {
		raw, err := json.Marshal(body)
		require.NoError(tb, err)
		data = string(raw)
	}
	req, err := http.NewRequest(http.MethodPost, h.url+path, strings.NewReader(data))
	require.NoError(tb, err)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	return h.do(tb, req)
}

func (h *harness) get(tb testing.TB, path, key string) (int, []byte) {
	tb.Helper()
	req, err := http.NewRequest(http.MethodGet, h.url+path, nil)
	require.NoError(tb, err)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	return h.do(tb, req)
}

func (h *harness) do(tb testing.TB, req *http.Request) (int, []byte) {
	tb.Helper()
	resp, err := h.client.Do(req)
	require.NoError(tb, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(tb, err)
	return resp.StatusCode, out
}

// render is what the gateway must send the engine for msgs and tools.
func (h *harness) render(tb testing.TB, msgs []chat.Message, tools []chat.Tool) []int32 {
	tb.Helper()
	text, err := h.tmpl.Render(msgs, tools, true, nil)
	require.NoError(tb, err)
	return h.tok.Encode(text)
}

// The client's view of the wire, decoded independently of the server's types.

type clientCompletion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int             `json:"index"`
		Message      clientMessage   `json:"message"`
		Logprobs     *clientLogprobs `json:"logprobs"`
		FinishReason string          `json:"finish_reason"`
	} `json:"choices"`
	Usage *clientUsage `json:"usage"`
}

type clientMessage struct {
	Role      string           `json:"role"`
	Content   *string          `json:"content"`
	ToolCalls []clientToolCall `json:"tool_calls,omitempty"`
}

type clientToolCall struct {
	Index    *int   `json:"index,omitempty"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type clientLogprobs struct {
	Content []struct {
		Token       string            `json:"token"`
		Logprob     float64           `json:"logprob"`
		Bytes       []int             `json:"bytes"`
		TopLogprobs []json.RawMessage `json:"top_logprobs"`
	} `json:"content"`
}

type clientUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type clientError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// streamedChat is a chat stream reassembled as the openai client does it:
// string fields of deltas are concatenated, tool calls merged by index.
type streamedChat struct {
	message  clientMessage
	finish   string
	usage    *clientUsage
	logprobs int // log-prob entries received
	chunks   int
	done     bool
}

func readChatStream(tb testing.TB, body []byte) streamedChat {
	tb.Helper()
	var out streamedChat
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		require.True(tb, ok, "SSE line without data: %q", line)
		require.False(tb, out.done, "data after [DONE]")
		if data == "[DONE]" {
			out.done = true
			continue
		}
		var chunk struct {
			Object  string `json:"object"`
			Choices []struct {
				Index int `json:"index"`
				Delta struct {
					Role      string           `json:"role"`
					Content   *string          `json:"content"`
					ToolCalls []clientToolCall `json:"tool_calls"`
				} `json:"delta"`
				Logprobs     *clientLogprobs `json:"logprobs"`
				FinishReason *string         `json:"finish_reason"`
			} `json:"choices"`
			Usage *clientUsage `json:"usage"`
		}
		require.NoError(tb, json.Unmarshal([]byte(data), &chunk), "chunk %s", data)
		require.Equal(tb, "chat.completion.chunk", chunk.Object)
		out.chunks++
		if chunk.Usage != nil {
			out.usage = chunk.Usage
		}
		for _, c := range chunk.Choices {
			d := c.Delta
			if d.Role != "" {
				out.message.Role = d.Role
			}
			if d.Content != nil {
				if out.message.Content == nil {
					out.message.Content = new(string)
				}
				*out.message.Content += *d.Content
			}
			for _, tc := range d.ToolCalls {
				require.NotNil(tb, tc.Index, "a tool call delta needs an index")
				for len(out.message.ToolCalls) <= *tc.Index {
					out.message.ToolCalls = append(out.message.ToolCalls, clientToolCall{})
				}
				acc := &out.message.ToolCalls[*tc.Index]
				acc.ID += tc.ID
				if tc.Type != "" {
					acc.Type = tc.Type
				}
				acc.Function.Name += tc.Function.Name
				acc.Function.Arguments += tc.Function.Arguments
			}
			if c.Logprobs != nil {
				out.logprobs += len(c.Logprobs.Content)
			}
			if c.FinishReason != nil {
				out.finish = *c.FinishReason
			}
		}
	}
	require.NoError(tb, sc.Err())
	return out
}

func chatPath(id string) string { return RolloutPath(id) + "/chat/completions" }
func textPath(id string) string { return RolloutPath(id) + "/completions" }

// weatherTool is the tool of most tests, as an agent sends it.
var weatherToolJSON = json.RawMessage(`{"type":"function","function":{"name":"get_weather","description":"Current weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}`)

func weatherTool() chat.Tool {
	return chat.Tool{Name: "get_weather", Description: "Current weather of a city",
		Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`)}
}

type postResult struct {
	status int
	body   []byte
	err    error
}

// postAsync posts from another goroutine without failing the test there
// (FailNow must run on the test's goroutine); the result comes on the
// channel.
func (h *harness) postAsync(path, key, body string) <-chan postResult {
	out := make(chan postResult, 1)
	go func() {
		req, err := http.NewRequest(http.MethodPost, h.url+path, strings.NewReader(body))
		if err != nil {
			out <- postResult{err: err}
			return
		}
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := h.client.Do(req)
		if err != nil {
			out <- postResult{err: err}
			return
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		out <- postResult{status: resp.StatusCode, body: data, err: err}
	}()
	return out
}
