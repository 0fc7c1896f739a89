// Package engineserver is `ortrain serve-engine`: an HTTP server that imitates the
// subset of vLLM's API ortrain uses, over a Backend that samples batches;
// WorkerBackend is that backend over the libtorch worker, with LoRA adapters
// swapped through one slot. It lets the vLLM engine path run and be tested
// without vLLM, answering as a chosen vLLM version does (profile.go) and,
// on demand, as a broken one would (faults.go). With the model's tokenizer
// (Options.TextChat) it also serves OpenAI's text and chat completions,
// tools and streaming included, through package gateway, so any OpenAI
// client can talk to it.
package engineserver

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/gateway"
	"github.com/ortrain/ortrain/internal/vllm"
)

// Backend is what `ortrain serve-engine` serves: a model that samples
// batches (with a named LoRA adapter, "" for the base weights) and takes new
// weights. The HTTP layer is tested over a pure-Go backend; the command wires
// the libtorch worker.
type Backend interface {
	SampleBatch(ctx context.Context, adapter string, reqs []engine.Request) ([]engine.Result, error)
	// ReloadWeights loads HF-named safetensors from dir into the base model.
	ReloadWeights(ctx context.Context, dir string) error
	// LoadAdapter reads the PEFT adapter in dir under name (replacing one of
	// that name); UnloadAdapter forgets it.
	LoadAdapter(ctx context.Context, name, dir string) error
	UnloadAdapter(ctx context.Context, name string) error
	// Detokenize renders ids as text (for "text" and logprob "tokens").
	Detokenize(ids []int32) string
}

// Options describe the served model.
type Options struct {
	ModelName   string  // the served name clients send as "model"
	ModelRoot   string  // the model directory (/v1/models "root"; reload default)
	MaxModelLen int     // prompt + completion cap (0: unbounded)
	EOSIDs      []int32 // stop ids unless a request sets ignore_eos
	// VocabSize is the model's vocabulary (its embedding rows): a token-id
	// prompt naming an id outside it is refused with 400 before it reaches
	// the backend, which would fail the whole batch. 0: not checked.
	VocabSize int
	// LoRA is --enable-lora: adapters can be served. Their routes
	// (/v1/load_lora_adapter, /v1/unload_lora_adapter) also need
	// RuntimeLoRA, as in vLLM.
	LoRA bool
	// RuntimeLoRA is vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING=1.
	RuntimeLoRA bool
	// DevMode is vLLM's VLLM_SERVER_DEV_MODE=1: it attaches /pause,
	// /resume, /is_paused, /collective_rpc and /reset_prefix_cache (the
	// Profile says which of them need it).
	DevMode bool
	// APIKey, when set, is required as a Bearer token on the paths the
	// Profile guards (/v1 and the like); every other route answers
	// without it, as in vLLM.
	APIKey string
	// Version is the vLLM version imitated (a row of the profile table,
	// profile.go); "" is CurrentVLLM. NewServer panics on a version not in
	// the table: check it with LookupProfile first.
	Version string
	// Faults make the server misbehave on purpose (tests only).
	Faults Faults
	// Batch shapes request batching (MaxBatch, Linger, Timeout).
	Batch engine.BuiltinOptions
	// TextChat, when set, serves /v1/chat/completions and text prompts on
	// /v1/completions; nil refuses both (token ids only).
	TextChat *TextChat
	Logger   zerolog.Logger
	Now      func() time.Time
}

// Server serves the HTTP subset of vLLM that ortrain uses, with vLLM's JSON
// shapes: /health, /version, /v1/models, /v1/completions (token ids in and
// out, sampler log-probs), the dev routes /pause, /resume, /is_paused,
// /collective_rpc reload_weights and /reset_prefix_cache, and the LoRA
// adapter routes (control.go), each where the imitated vLLM has it; and,
// with Options.TextChat, OpenAI's /v1/chat/completions and text prompts on
// /v1/completions (openai.go). Concurrent completions of every kind are
// batched per adapter by an engine.Builtin.
type Server struct {
	backend Backend
	opts    Options
	mux     *http.ServeMux
	gate    *vllm.PauseGate
	profile Profile

	mu          sync.Mutex
	weightsPath string            // what reload_weights without weights_path reads
	adapters    map[string]string // name -> path
	batchers    map[string]*engine.Builtin
	gateways    map[string]*gateway.Gateway // served model name -> its OpenAI API
}

// NewServer builds the server; Close stops its batchers. It panics on an
// Options.Version that LookupProfile refuses (a caller's bug).
func NewServer(b Backend, opts Options) *Server {
	profile, err := LookupProfile(opts.Version)
	if err != nil {
		panic("engineserver.NewServer: " + err.Error())
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Server{backend: b, opts: opts, mux: http.NewServeMux(), gate: vllm.NewPauseGate(), profile: profile, weightsPath: opts.ModelRoot,
		adapters: map[string]string{}, batchers: map[string]*engine.Builtin{}, gateways: map[string]*gateway.Gateway{}}
	s.mux.HandleFunc("GET /health", s.handleHealth)
	s.mux.HandleFunc("GET /version", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": profile.Version})
	})
	s.mux.HandleFunc("GET /v1/models", s.handleModels)
	s.mux.HandleFunc("POST /v1/completions", s.handleCompletionsDispatch)
	s.mux.HandleFunc("POST /v1/chat/completions", s.handleChat)
	s.controlRoutes()
	return s
}

// ServeHTTP checks the API key and answers unknown routes the way vLLM's
// framework does.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(r) {
		// vLLM's AuthenticationMiddleware answers before routing, with
		// this body on every guarded path (OpenAI routes included).
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "Unauthorized"})
		return
	}
	if _, pattern := s.mux.Handler(r); pattern == "" {
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
		return
	}
	s.mux.ServeHTTP(w, r)
}

// authorized: no key is set, the path is one vLLM leaves unguarded (all but
// the Profile's prefixes; OPTIONS always), or the request carries the key
// as a Bearer token (scheme in any case, as vLLM's verify_token; compared
// in constant time).
func (s *Server) authorized(r *http.Request) bool {
	if s.opts.APIKey == "" || r.Method == http.MethodOptions || !s.profile.guards(r.URL.Path) {
		return true
	}
	scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	return strings.EqualFold(scheme, "bearer") && subtle.ConstantTimeCompare([]byte(token), []byte(s.opts.APIKey)) == 1
}

// Close stops the batchers; in-flight requests fail with engine.ErrClosed.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, b := range s.batchers {
		b.Close()
		delete(s.batchers, name)
	}
	return nil
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	created := s.opts.Now().Unix()
	list := vllm.ModelList{Object: "list", Data: []vllm.ModelCard{{ID: s.opts.ModelName, Object: "model", Created: created,
		OwnedBy: "vllm", Root: s.opts.ModelRoot, MaxModelLen: s.opts.MaxModelLen}}}
	s.mu.Lock()
	for name, path := range s.adapters {
		parent := s.opts.ModelName
		list.Data = append(list.Data, vllm.ModelCard{ID: name, Object: "model", Created: created, OwnedBy: "vllm", Root: path, Parent: &parent})
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, list)
}

// completionBody is the server's view of a completion request: pointers
// tell "absent" (vLLM's default applies) from zero.
type completionBody struct {
	Model                  string          `json:"model"`
	Prompt                 json.RawMessage `json:"prompt"`
	MaxTokens              *int            `json:"max_tokens"`
	N                      *int            `json:"n"`
	Temperature            *float64        `json:"temperature"`
	TopP                   *float64        `json:"top_p"`
	TopK                   *int            `json:"top_k"`
	MinP                   *float64        `json:"min_p"`
	RepetitionPenalty      *float64        `json:"repetition_penalty"`
	PresencePenalty        *float64        `json:"presence_penalty"`
	FrequencyPenalty       *float64        `json:"frequency_penalty"`
	Seed                   *int64          `json:"seed"`
	StopTokenIDs           []int32         `json:"stop_token_ids"`
	Stop                   json.RawMessage `json:"stop"`
	IgnoreEOS              bool            `json:"ignore_eos"`
	Logprobs               *int            `json:"logprobs"`
	PromptLogprobs         *int            `json:"prompt_logprobs"`
	ReturnTokenIDs         bool            `json:"return_token_ids"`
	ReturnTokensAsTokenIDs bool            `json:"return_tokens_as_token_ids"`
	Stream                 bool            `json:"stream"`
}

// parse validates the body against what the builtin engine can honour and
// returns the prompts and one engine.Request per prompt (seeds are set per sample).
func (s *Server) parse(b *completionBody) ([][]int32, engine.Request, int, error) {
	var prompts [][]int32
	var one []int32
	flat := false // one list of ids, not a list of prompts
	if err := json.Unmarshal(b.Prompt, &one); err == nil && len(one) > 0 {
		prompts, flat = [][]int32{one}, true
	} else if err := json.Unmarshal(b.Prompt, &prompts); err != nil || len(prompts) == 0 {
		return nil, engine.Request{}, 0, fmt.Errorf("prompt must be a non-empty list of token ids or a list of such lists (serve-engine does not tokenize text)")
	}
	for i, p := range prompts {
		if len(p) == 0 {
			return nil, engine.Request{}, 0, fmt.Errorf("prompt %d is empty", i)
		}
		for j, id := range p {
			if id < 0 {
				return nil, engine.Request{}, 0, fmt.Errorf("prompt %d has negative token id %d", i, id)
			}
			if v := s.opts.VocabSize; v > 0 && int(id) >= v {
				at := fmt.Sprintf("prompt[%d][%d]", i, j)
				if flat {
					at = fmt.Sprintf("prompt[%d]", j)
				}
				return nil, engine.Request{}, 0, badRequest("prompt", fmt.Sprintf("%s = %d is not a token id of this model's vocabulary (0 to %d)", at, id, v-1))
			}
		}
	}
	switch {
	case b.Stream:
		return nil, engine.Request{}, 0, fmt.Errorf("stream is not supported by serve-engine")
	case b.PromptLogprobs != nil:
		return nil, engine.Request{}, 0, fmt.Errorf("prompt_logprobs is not supported by serve-engine")
	case b.Logprobs != nil && *b.Logprobs != 0:
		return nil, engine.Request{}, 0, fmt.Errorf("logprobs=%d: serve-engine returns only the sampled token's log-prob (logprobs=0)", *b.Logprobs)
	case len(b.Stop) > 0 && string(b.Stop) != "null" && string(b.Stop) != "[]":
		return nil, engine.Request{}, 0, fmt.Errorf("stop strings are not supported by serve-engine; use stop_token_ids")
	case !neutral(b.RepetitionPenalty, 1) || !neutral(b.PresencePenalty, 0) || !neutral(b.FrequencyPenalty, 0):
		return nil, engine.Request{}, 0, fmt.Errorf("repetition, presence and frequency penalties are not supported by serve-engine")
	}
	req := engine.Request{MaxTokens: 16, Sampling: engine.SamplingParams{Temperature: 1, TopP: 1}, StopIDs: b.StopTokenIDs}
	if b.MaxTokens != nil {
		req.MaxTokens = *b.MaxTokens
	}
	if b.Temperature != nil {
		req.Sampling.Temperature = *b.Temperature
	}
	if b.TopP != nil {
		req.Sampling.TopP = *b.TopP
	}
	if b.TopK != nil && *b.TopK > 0 {
		req.Sampling.TopK = *b.TopK
	} else if b.TopK != nil && *b.TopK < -1 {
		return nil, engine.Request{}, 0, fmt.Errorf("top_k must be -1 (disable), 0 (disable) or at least 1, got %d", *b.TopK)
	}
	if b.MinP != nil {
		req.Sampling.MinP = *b.MinP
	}
	if !b.IgnoreEOS {
		req.StopIDs = append(append([]int32(nil), req.StopIDs...), s.opts.EOSIDs...)
	}
	n := 1
	if b.N != nil {
		n = *b.N
	}
	if n < 1 {
		return nil, engine.Request{}, 0, fmt.Errorf("n must be at least 1, got %d", n)
	}
	if len(prompts)*n > maxSamplesPerRequest {
		return nil, engine.Request{}, 0, fmt.Errorf("%d prompts × n=%d asks for more than %d samples in one request", len(prompts), n, maxSamplesPerRequest)
	}
	for _, p := range prompts {
		if s.opts.MaxModelLen > 0 && len(p)+req.MaxTokens > s.opts.MaxModelLen {
			return nil, engine.Request{}, 0, fmt.Errorf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
				s.opts.MaxModelLen, len(p)+req.MaxTokens, len(p), req.MaxTokens)
		}
	}
	probe := req
	probe.PromptIDs = prompts[0]
	if err := probe.Validate(); err != nil {
		return nil, engine.Request{}, 0, fmt.Errorf("%v", err)
	}
	return prompts, req, n, nil
}

// maxSamplesPerRequest bounds the work one request can ask for.
const maxSamplesPerRequest = 4096

func neutral(v *float64, want float64) bool { return v == nil || *v == want }

func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) {
	var body completionBody
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, s.bodyLimit())).Decode(&body); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is larger than %d bytes, more than the model's context can hold", tooBig.Limit))
			return
		}
		writeError(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return
	}
	prompts, base, n, err := s.parse(&body)
	var apiErr *apiError
	switch {
	case errors.As(err, &apiErr):
		writeOpenAIError(w, apiErr) // names the field, as the gateway's refusals do
		return
	case err != nil:
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	batcher, err := s.batcher(body.Model)
	if err != nil {
		writeError(w, http.StatusNotFound, err.Error())
		return
	}
	ctx, leave, err := s.gate.Enter(r.Context())
	if err != nil {
		return // the client went away while we were paused
	}
	defer leave()
	samples, err := s.sampleAll(ctx, batcher, prompts, base, n, body.Seed)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, s.response(&body, prompts, n, samples))
}

// sample is one choice's result, with the seed it was drawn with.
type sample struct {
	engine.Result
	seed    int64
	aborted bool // ended by an abort-mode pause
}

// sampleAll generates n samples per prompt concurrently (the batcher merges
// them). Sample j of a request with seed S uses seed S+j.
func (s *Server) sampleAll(ctx context.Context, b *engine.Builtin, prompts [][]int32, base engine.Request, n int, seed *int64) ([]sample, error) {
	total := len(prompts) * n
	samples := make([]sample, total)
	errs := make([]error, total)
	var wg sync.WaitGroup
	for i := range total {
		req := base
		req.PromptIDs = prompts[i/n]
		if seed != nil {
			req.Seed = *seed + int64(i%n)
		} else {
			req.Seed = randomSeed()
		}
		samples[i].seed = req.Seed
		wg.Add(1)
		go func() {
			defer wg.Done()
			samples[i].Result, errs[i] = b.Generate(ctx, req)
			if errs[i] != nil && ctx.Err() != nil && s.gate.Aborting() {
				samples[i].aborted, errs[i] = true, nil
			}
		}()
	}
	wg.Wait()
	return samples, errors.Join(errs...)
}

func randomSeed() int64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	v := int64(0)
	for _, x := range b {
		v = v<<8 | int64(x)
	}
	if v < 0 {
		v = -v
	}
	return v
}

func (s *Server) response(body *completionBody, prompts [][]int32, n int, samples []sample) vllm.CompletionResponse {
	var idb [12]byte
	_, _ = rand.Read(idb[:])
	resp := vllm.CompletionResponse{ID: "cmpl-" + hex.EncodeToString(idb[:]), Object: "text_completion", Created: s.opts.Now().Unix(), Model: body.Model}
	for _, p := range prompts {
		resp.Usage.PromptTokens += len(p)
	}
	for i, res := range samples {
		c := vllm.Choice{Index: i, Text: s.backend.Detokenize(res.IDs), StopReason: json.RawMessage("null"), PromptLogprobs: json.RawMessage("null")}
		finish := vllm.FinishLength
		switch {
		case res.aborted:
			finish = vllm.FinishAbort
		case res.StopReason == engine.StopToken && len(res.IDs) > 0:
			finish = vllm.FinishStop
			if !isEOS(res.IDs[len(res.IDs)-1], s.opts.EOSIDs) || body.IgnoreEOS {
				c.StopReason = json.RawMessage(strconv.Itoa(int(res.IDs[len(res.IDs)-1])))
			}
		}
		c.FinishReason = &finish
		if body.ReturnTokenIDs && !s.opts.Faults.NoTokenIDs {
			c.TokenIDs = append([]int32{}, res.IDs...)
			c.PromptTokenIDs = prompts[i/n]
		}
		if body.Logprobs != nil {
			c.Logprobs = s.logprobs(res, body.ReturnTokensAsTokenIDs)
		}
		resp.Choices = append(resp.Choices, c)
		resp.Usage.CompletionTokens += len(res.IDs)
	}
	resp.Usage.TotalTokens = resp.Usage.PromptTokens + resp.Usage.CompletionTokens
	return resp
}

func isEOS(id int32, eos []int32) bool {
	for _, e := range eos {
		if e == id {
			return true
		}
	}
	return false
}

// logprobs are a sample's log-probs in vLLM's completion shape; an entry
// the null-logprobs fault blanks is null, with a null top_logprobs entry,
// as vLLM writes a step that has no log-probs.
func (s *Server) logprobs(res sample, asIDs bool) *vllm.ChoiceLogprobs {
	lp := &vllm.ChoiceLogprobs{TextOffset: []int{}, TokenLogprobs: []*float64{}, Tokens: []string{}, TopLogprobs: []map[string]float64{}}
	off := 0
	for i, id := range res.IDs {
		tok := "token_id:" + strconv.Itoa(int(id))
		if !asIDs {
			tok = s.backend.Detokenize([]int32{id})
		}
		v := float64(res.Logprobs[i])
		lp.TextOffset = append(lp.TextOffset, off)
		lp.Tokens = append(lp.Tokens, tok)
		if s.opts.Faults.nullLogprob(res.seed, i) {
			lp.TokenLogprobs = append(lp.TokenLogprobs, nil)
			lp.TopLogprobs = append(lp.TopLogprobs, nil)
		} else {
			lp.TokenLogprobs = append(lp.TokenLogprobs, &v)
			lp.TopLogprobs = append(lp.TopLogprobs, map[string]float64{tok: v})
		}
		off += len(tok)
	}
	return lp
}

// batcher returns the batcher for a model name: the base model or a loaded
// adapter. vLLM answers an unknown model with 404.
func (s *Server) batcher(model string) (*engine.Builtin, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	adapter := ""
	if model != s.opts.ModelName && model != "" {
		if _, ok := s.adapters[model]; !ok {
			return nil, fmt.Errorf("The model `%s` does not exist.", model)
		}
		adapter = model
	}
	if b, ok := s.batchers[adapter]; ok {
		return b, nil
	}
	sampled := adapter
	if s.opts.Faults.ReloadNoop {
		sampled = "" // no adapter was ever loaded: the base weights answer
	}
	b := engine.NewBuiltin(adapterSampler{s.backend, sampled}, s.opts.Batch)
	s.batchers[adapter] = b
	return b, nil
}

type adapterSampler struct {
	backend Backend
	adapter string
}

func (a adapterSampler) SampleBatch(ctx context.Context, reqs []engine.Request) ([]engine.Result, error) {
	return a.backend.SampleBatch(ctx, a.adapter, reqs)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeText(w http.ResponseWriter, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, msg)
}

// writeError answers with vLLM's error body.
func writeError(w http.ResponseWriter, code int, msg string) {
	typ := map[int]string{400: "BadRequestError", 404: "NotFoundError", 413: "RequestEntityTooLargeError"}[code]
	if typ == "" {
		typ = "InternalServerError"
	}
	writeJSON(w, code, vllm.ErrorResponse{Error: vllm.ErrorInfo{Message: msg, Type: typ, Code: code}})
}
