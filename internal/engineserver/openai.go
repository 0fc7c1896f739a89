package engineserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/gateway"
)

// This file is serve-engine's OpenAI side: POST /v1/chat/completions, and
// POST /v1/completions with a text prompt, are served by the same
// gateway.Gateway code that serves rollouts during training (single-tenant
// mode), sampling through the server's batchers and pause gate. Token-id
// prompts keep going to the vLLM-style handler, which supports what
// ortrain's vLLM path needs and the gateway does not (n > 1, several
// prompts, return_token_ids, stop_token_ids, token-id log-prob tokens).

// maxBodyBytes bounds a completion request body on every completion route;
// with a context bound, bodyLimit is tighter.
const maxBodyBytes = 64 << 20

// bodyLimit bounds a completion body at what the context can hold, before
// any of it is decoded: 64 prompts of MaxModelLen token ids (at most 12
// bytes each as JSON) or texts as long, at least 1 MiB, at most
// maxBodyBytes.
func (s *Server) bodyLimit() int64 {
	if s.opts.MaxModelLen <= 0 {
		return maxBodyBytes
	}
	return min(maxBodyBytes, max(1<<20, 64*12*int64(s.opts.MaxModelLen)))
}

// TextChat is what text prompts and chat completions need from the model
// directory: its tokenizer, its chat template and the syntax its tool calls
// are written in. Build it with NewTextChat.
type TextChat struct {
	tok *chat.Tokenizer
	// tmpl renders chat requests; without the model's own template it is a
	// placeholder that refuses to render, and chat is refused up front.
	tmpl        *chat.Template
	hasTemplate bool
	format      chat.ToolCallFormat
	// refuseTools: the format was to be detected and the template matched
	// none; a request with tools is refused rather than answered with the
	// calls left unparsed in its content.
	refuseTools bool
	// Warnings say what the server will refuse with this model, for the
	// startup log.
	Warnings []string
}

// NewTextChat prepares text and chat completions over tok (the model's
// tokenizer). format is a chat.ToolCallFormat name, or "auto" (or "") to
// detect it from the chat template. A model without a chat template still
// serves text prompts; chat requests are then refused.
func NewTextChat(tok *chat.Tokenizer, format string) (*TextChat, error) {
	if tok == nil {
		return nil, errors.New("no tokenizer")
	}
	if len(tok.Special().EndOfTurn) == 0 {
		return nil, errors.New("the tokenizer names no end-of-sequence or end-of-turn token to stop generation at")
	}
	tc := &TextChat{tok: tok}
	tmpl, err := tok.Template("")
	switch {
	case err == nil:
		tc.tmpl, tc.hasTemplate = tmpl, true
	case errors.Is(err, chat.ErrNoChatTemplate):
		// The gateway requires a template even for text completions; this
		// one is never rendered (chat is refused before it), and would fail
		// loudly if it were.
		tc.tmpl, err = chat.NewTemplate("{{ raise_exception('this model has no chat template') }}", nil, nil)
		if err != nil {
			return nil, fmt.Errorf("placeholder chat template: %w", err)
		}
		tc.Warnings = append(tc.Warnings, "the model has no chat template: /v1/chat/completions answers 400 (text and token-id completions are served)")
	default:
		return nil, fmt.Errorf("chat template: %w", err)
	}
	switch {
	case format != "" && format != "auto":
		if tc.format, err = chat.ParseToolCallFormat(format); err != nil {
			return nil, err
		}
	case tc.hasTemplate:
		if tc.format, err = chat.DetectToolCallFormat(tc.tmpl.Source()); err != nil {
			tc.refuseTools = true
			tc.Warnings = append(tc.Warnings, "the chat template writes tool calls in no syntax ortrain recognizes: chat requests with tools answer 400 (name one with --tool-call-format)")
		}
	}
	return tc, nil
}

// Format is the tool-call syntax replies are parsed with.
func (tc *TextChat) Format() chat.ToolCallFormat { return tc.format }

// newGateway builds the gateway that answers for one served model name:
// the base model, or a loaded LoRA adapter. Replies name that model, as
// /v1/models lists it.
func (s *Server) newGateway(served, adapter string) (*gateway.Gateway, error) {
	tc := s.opts.TextChat
	return gateway.New(gateway.Options{
		Model: served, Tokenizer: tc.tok, Template: tc.tmpl, Format: tc.format,
		Sampler:      gatewaySampler{s: s, adapter: adapter},
		MaxModelLen:  s.opts.MaxModelLen,
		MaxBodyBytes: s.bodyLimit(),
		// ServeHTTP has checked the key already; the gateway checks it
		// again so nothing routed to it is ever served unauthenticated.
		SingleTenant: &gateway.SingleTenant{APIKey: s.opts.APIKey},
		Logger:       s.opts.Logger,
		Now:          s.opts.Now,
	})
}

// gatewayFor returns the gateway for a request's "model": "" or the served
// name is the base model, a loaded adapter's name is that adapter, and
// anything else is not found (as the token-id handler and vLLM answer; a
// misspelt adapter must not silently sample the base weights).
func (s *Server) gatewayFor(model string) (*gateway.Gateway, *apiError) {
	if model == "" {
		model = s.opts.ModelName
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if g, ok := s.gateways[model]; ok {
		return g, nil
	}
	adapter := ""
	if model != s.opts.ModelName {
		if _, ok := s.adapters[model]; !ok {
			return nil, &apiError{status: http.StatusNotFound, param: "model", code: "model_not_found",
				message: fmt.Sprintf("The model `%s` does not exist.", model)}
		}
		adapter = model
	}
	g, err := s.newGateway(model, adapter)
	if err != nil {
		return nil, &apiError{status: http.StatusInternalServerError, typ: "server_error", message: err.Error()}
	}
	s.gateways[model] = g
	return g, nil
}

// gatewaySampler is the engine.Generator a gateway samples with: each
// request goes through its adapter's batcher (so chat, text and token-id
// requests share batches) and the pause gate (so /pause holds and aborts
// it like any completion).
type gatewaySampler struct {
	s       *Server
	adapter string // "" for the base weights
}

// errAborted is the generation error of a request /pause?mode=abort ended.
var errAborted = errors.New("aborted by POST /pause?mode=abort (the weights are being updated); retry after /resume")

func (g gatewaySampler) Generate(ctx context.Context, req engine.Request) (engine.Result, error) {
	ctx, leave, err := g.s.gate.Enter(ctx)
	if err != nil {
		return engine.Result{}, err
	}
	defer leave()
	model := g.adapter
	if model == "" {
		model = g.s.opts.ModelName
	}
	b, err := g.s.batcher(model)
	if err != nil {
		return engine.Result{}, err
	}
	// The gateway sends seed 0 when the request names none; the token-id
	// handler gives such requests a random seed, and so does this.
	if req.Seed == 0 {
		req.Seed = randomSeed()
	}
	res, err := b.Generate(ctx, req)
	if err != nil && ctx.Err() != nil && g.s.gate.Aborting() {
		return res, errAborted
	}
	return res, err
}

func (gatewaySampler) SyncWeights(context.Context, int) error { return nil }
func (gatewaySampler) Close() error                           { return nil }

// completionPeek is what dispatch reads of a body before handing it on.
type completionPeek struct {
	Model      json.RawMessage `json:"model"`
	Prompt     json.RawMessage `json:"prompt"`
	Tools      json.RawMessage `json:"tools"`
	ToolChoice json.RawMessage `json:"tool_choice"`
}

// readPeek reads the body, puts it back for the handler that serves it,
// and peeks at it. ok is false when the body is not a JSON object: the
// handler it goes to names the fault.
func readPeek(w http.ResponseWriter, r *http.Request, limit int64) (p completionPeek, ok bool, e *apiError) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return p, false, &apiError{status: http.StatusRequestEntityTooLarge, message: fmt.Sprintf("request body is larger than %d bytes, more than the model's context can hold", limit)}
		}
		return p, false, &apiError{status: http.StatusBadRequest, message: "reading the request body: " + err.Error()}
	}
	r.Body = io.NopCloser(bytes.NewReader(data))
	r.ContentLength = int64(len(data))
	ok = json.Unmarshal(data, &p) == nil
	return p, ok, nil
}

// peekedModel is the "model" string; ok is false for any other JSON value,
// which the gateway refuses naming the field.
func peekedModel(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", true
	}
	var m string
	err := json.Unmarshal(raw, &m)
	return m, err == nil
}

// promptKind is how POST /v1/completions routes a prompt.
type promptKind int

const (
	promptMissing promptKind = iota
	promptText               // a string or a list of strings: the gateway
	promptIDs                // a list of token ids, or of such lists: the vLLM-style handler
	promptEmpty              // []
	promptInvalid            // any other JSON value
)

// classifyPrompt looks only at the prompt's first byte and its first
// element's: each handler checks the rest.
func classifyPrompt(raw json.RawMessage) promptKind {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return promptMissing
	}
	switch raw[0] {
	case '"':
		return promptText
	case '[':
		var items []json.RawMessage
		if json.Unmarshal(raw, &items) != nil {
			return promptInvalid
		}
		if len(items) == 0 {
			return promptEmpty
		}
		first := bytes.TrimSpace(items[0])
		switch {
		case first[0] == '"':
			return promptText
		case first[0] == '[', first[0] == '-', first[0] >= '0' && first[0] <= '9':
			return promptIDs
		}
	}
	return promptInvalid
}

const promptForms = "a string (or a list holding one string) for a text completion, or token ids (a list of ints, or a list of such lists)"

// handleCompletionsDispatch serves POST /v1/completions: a text prompt goes
// to the gateway, token ids to the vLLM-style handler. Without a tokenizer
// every body goes to the vLLM-style handler, which refuses text.
func (s *Server) handleCompletionsDispatch(w http.ResponseWriter, r *http.Request) {
	if s.opts.TextChat == nil {
		s.handleCompletions(w, r)
		return
	}
	p, isObject, e := readPeek(w, r, s.bodyLimit())
	if e != nil {
		writeOpenAIError(w, e)
		return
	}
	if !isObject {
		s.serveGateway(w, r, s.opts.ModelName) // the gateway names what is wrong with the body
		return
	}
	switch classifyPrompt(p.Prompt) {
	case promptIDs:
		s.handleCompletions(w, r)
		return
	case promptMissing:
		writeOpenAIError(w, badRequest("prompt", "prompt is required: "+promptForms))
		return
	case promptEmpty:
		writeOpenAIError(w, badRequest("prompt", "prompt is empty: send "+promptForms))
		return
	case promptInvalid:
		writeOpenAIError(w, badRequest("prompt", "prompt must be "+promptForms))
		return
	}
	model, ok := peekedModel(p.Model)
	if !ok {
		model = s.opts.ModelName
	}
	s.serveGateway(w, r, model)
}

// handleChat serves POST /v1/chat/completions through the gateway.
func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	tc := s.opts.TextChat
	switch {
	case tc == nil:
		writeOpenAIError(w, badRequest("", "chat completions need the model's tokenizer (tokenizer.json or vocab.json + merges.txt) and chat template; serve-engine found none in the model directory, so it serves token-id completions only"))
		return
	case !tc.hasTemplate:
		writeOpenAIError(w, badRequest("messages", "this model has no chat template (tokenizer_config.json chat_template or chat_template.jinja): send a text prompt to /v1/completions instead"))
		return
	}
	p, isObject, e := readPeek(w, r, s.bodyLimit())
	if e != nil {
		writeOpenAIError(w, e)
		return
	}
	if isObject && tc.refuseTools && offersTools(p) {
		writeOpenAIError(w, badRequest("tools", "this model's chat template writes tool calls in no syntax serve-engine recognizes, so its calls could not be parsed; restart it with --tool-call-format"))
		return
	}
	model, ok := peekedModel(p.Model)
	if !isObject || !ok {
		model = s.opts.ModelName
	}
	s.serveGateway(w, r, model)
}

// offersTools: the request lists tools and does not set tool_choice "none"
// (with "none" the gateway returns the whole reply as content anyway).
func offersTools(p completionPeek) bool {
	var tools []json.RawMessage
	if json.Unmarshal(p.Tools, &tools) != nil || len(tools) == 0 {
		return false
	}
	var choice string
	return json.Unmarshal(p.ToolChoice, &choice) != nil || choice != "none"
}

// serveGateway hands the request to the gateway of the named model.
func (s *Server) serveGateway(w http.ResponseWriter, r *http.Request, model string) {
	g, e := s.gatewayFor(model)
	if e != nil {
		writeOpenAIError(w, e)
		return
	}
	g.Handler().ServeHTTP(w, r)
}

// forgetGateway drops an unloaded adapter's gateway (s.mu held).
func (s *Server) forgetGateway(model string) { delete(s.gateways, model) }

// apiError is an OpenAI error reply: {"error": {"message", "type", "param",
// "code"}}, which the openai clients parse.
type apiError struct {
	status  int
	message string
	typ     string // "" is invalid_request_error
	param   string // "" is null
	code    string // "" is null
}

func (e *apiError) Error() string { return e.message }

func badRequest(param, msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, param: param, message: msg}
}

func writeOpenAIError(w http.ResponseWriter, e *apiError) {
	gateway.WriteError(w, e.status, e.typ, e.param, e.code, e.message)
}
