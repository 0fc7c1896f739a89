package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
)

// textRequest is the part of an OpenAI (legacy) completion request the
// gateway reads; unknown fields are ignored.
type textRequest struct {
	samplingFields
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	Logprobs      *int            `json:"logprobs"`
	Echo          bool            `json:"echo"`
	BestOf        *int            `json:"best_of"`
	Stream        *bool           `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
}

// maxTextLogprobs is OpenAI's bound on completions' logprobs.
const maxTextLogprobs = 5

// handleText serves POST completions: a prompt string is encoded without
// the chat template; a list of token ids is used as is.
func (g *Gateway) handleText(w http.ResponseWriter, r *http.Request, ro *rollout) {
	data, e := readBody(w, r, g.opts.MaxBodyBytes)
	if e != nil {
		g.fail(w, ro, e)
		return
	}
	var req textRequest
	if e := decodeJSON(data, &req); e != nil {
		g.fail(w, ro, e)
		return
	}
	promptIDs, e := g.textPrompt(&req)
	if e != nil {
		g.fail(w, ro, e)
		return
	}
	spec, e := g.resolve(&req.samplingFields, req.MaxTokens, "max_tokens", promptIDs, "prompt")
	if e != nil {
		g.fail(w, ro, e)
		return
	}
	spec.kind, spec.skipSpecial = KindText, true
	s, e := g.sample(r.Context(), ro, spec)
	if e != nil {
		g.fail(w, ro, e)
		return
	}
	g.record(ro, spec, s, s.finish, 0)
	reply := textCompletion{ID: "cmpl-" + randomHex(12), Object: "text_completion", Created: g.opts.Now().Unix(), Model: g.opts.Model,
		Usage: usage{PromptTokens: len(promptIDs), CompletionTokens: len(s.ids), TotalTokens: len(promptIDs) + len(s.ids)}}
	choice := textChoice{Text: s.text, FinishReason: &s.finish}
	if req.Logprobs != nil {
		choice.Logprobs = g.textLogprobs(s)
	}
	if req.Stream != nil && *req.Stream {
		g.streamText(w, reply, choice, req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
		return
	}
	reply.Choices = []textChoice{choice}
	writeJSON(w, http.StatusOK, reply)
}

// textPrompt checks the request and reads its one prompt: a string, a
// list of token ids, or a one-element list of either.
func (g *Gateway) textPrompt(req *textRequest) ([]int32, *apiError) {
	switch {
	case req.Echo:
		return nil, badRequest("echo", "echo is not supported")
	case req.BestOf != nil && *req.BestOf != 1:
		return nil, badRequest("best_of", "best_of=%d: this server samples one choice per request", *req.BestOf)
	case req.Logprobs != nil && (*req.Logprobs < 0 || *req.Logprobs > maxTextLogprobs):
		return nil, badRequest("logprobs", "logprobs must be in [0, %d], got %d", maxTextLogprobs, *req.Logprobs)
	}
	raw := req.Prompt
	var batch []json.RawMessage
	if json.Unmarshal(raw, &batch) == nil && len(batch) > 0 && nested(batch[0]) {
		if len(batch) > 1 {
			return nil, badRequest("prompt", "prompt holds %d prompts; send one per request", len(batch))
		}
		raw = batch[0]
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		if text == "" {
			return nil, badRequest("prompt", "prompt is empty")
		}
		if e := g.checkTextFits(text, "prompt"); e != nil {
			return nil, e
		}
		return g.opts.Tokenizer.Encode(text), nil
	}
	var ids []int32
	if json.Unmarshal(raw, &ids) != nil || len(ids) == 0 {
		return nil, badRequest("prompt", "prompt must be a non-empty string or a non-empty list of token ids")
	}
	vocab := g.opts.Tokenizer.VocabSize()
	for i, id := range ids {
		if id < 0 || int(id) >= vocab {
			return nil, badRequest("prompt", "prompt[%d] = %d is not a token id of this model's vocabulary (0 to %d)", i, id, vocab-1)
		}
	}
	return ids, nil
}

// textLogprobs lists each completion token with its log-prob; the "top"
// entries hold only the sampled token.
func (g *Gateway) textLogprobs(s sampled) *textLogprobs {
	lp := &textLogprobs{Tokens: []string{}, TokenLogprobs: []float64{}, TopLogprobs: []map[string]float64{}, TextOffset: []int{}}
	off := 0
	for i, id := range s.ids {
		tok := g.opts.Tokenizer.Decode([]int32{id}, true)
		v := finiteLogprob(s.logprobs[i])
		lp.Tokens = append(lp.Tokens, tok)
		lp.TokenLogprobs = append(lp.TokenLogprobs, v)
		lp.TopLogprobs = append(lp.TopLogprobs, map[string]float64{tok: v})
		lp.TextOffset = append(lp.TextOffset, off)
		off += len(tok)
	}
	return lp
}

func (g *Gateway) streamText(w http.ResponseWriter, reply textCompletion, choice textChoice, includeUsage bool) {
	sse := newSSEWriter(w)
	u := reply.Usage
	finish := choice.FinishReason
	choice.FinishReason = nil
	reply.Choices = []textChoice{choice}
	sse.event(textChunk{textCompletion: reply})
	reply.Choices = []textChoice{{FinishReason: finish}}
	sse.event(textChunk{textCompletion: reply})
	if includeUsage {
		reply.Choices = []textChoice{}
		sse.event(textChunk{textCompletion: reply, Usage: &u})
	}
	sse.done()
}

type textCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []textChoice `json:"choices"`
	Usage   usage        `json:"usage"`
}

// textChunk is a streamed text completion: usage only on the last chunk.
type textChunk struct {
	textCompletion
	Usage *usage `json:"usage,omitempty"`
}

type textChoice struct {
	Index        int           `json:"index"`
	Text         string        `json:"text"`
	Logprobs     *textLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

type textLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// nested reports whether a prompt list element is itself a prompt (a
// string or a list of ids) rather than a token id.
func nested(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && (raw[0] == '"' || raw[0] == '[')
}
