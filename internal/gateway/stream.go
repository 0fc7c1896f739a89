package gateway

import (
	"net/http"
)

// The engine returns a completion whole, so a streamed reply is written
// after sampling, in the chunk order the openai client accumulates: the
// role, the content, each tool call (its id, type and name once, then its
// arguments), the finish reason, the usage when asked for, and [DONE].
// Every failure happens before the first byte, so errors keep their HTTP
// status.

// sseWriter writes Server-Sent Events data lines.
type sseWriter struct {
	w       http.ResponseWriter
	flusher http.Flusher
	err     error
}

func newSSEWriter(w http.ResponseWriter) *sseWriter {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	return &sseWriter{w: w, flusher: f}
}

// event writes one "data: {json}" event; after a failed write (the client
// went away) it does nothing.
func (s *sseWriter) event(v any) {
	data, err := marshal(v)
	if err != nil {
		s.err = err
	}
	s.data(data)
}

func (s *sseWriter) data(payload []byte) {
	if s.err != nil {
		return
	}
	buf := make([]byte, 0, len(payload)+8)
	buf = append(append(append(buf, "data: "...), payload...), "\n\n"...)
	if _, s.err = s.w.Write(buf); s.err == nil && s.flusher != nil {
		s.flusher.Flush()
	}
}

func (s *sseWriter) done() { s.data([]byte("[DONE]")) }

// named writes one "event: name" / "data: {json}" event, as the Responses
// and Messages streams have them; after a failed write it does nothing.
func (s *sseWriter) named(name string, v any) {
	if s.err != nil {
		return
	}
	data, err := marshal(v)
	if err != nil {
		s.err = err
		return
	}
	buf := make([]byte, 0, len(name)+len(data)+16)
	buf = append(append(append(buf, "event: "...), name...), "\ndata: "...)
	buf = append(append(buf, data...), "\n\n"...)
	if _, s.err = s.w.Write(buf); s.err == nil && s.flusher != nil {
		s.flusher.Flush()
	}
}

type chatChunk struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []chunkChoice `json:"choices"`
	Usage   *usage        `json:"usage,omitempty"`
}

type chunkChoice struct {
	Index        int           `json:"index"`
	Delta        chunkDelta    `json:"delta"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

type chunkDelta struct {
	Role      string        `json:"role,omitempty"`
	Content   *string       `json:"content,omitempty"`
	ToolCalls []toolCallOut `json:"tool_calls,omitempty"`
}

func (g *Gateway) streamChat(w http.ResponseWriter, r chatReply, includeUsage bool) {
	sse := newSSEWriter(w)
	chunk := func(choices []chunkChoice, u *usage) chatChunk {
		return chatChunk{ID: r.id, Object: "chat.completion.chunk", Created: r.created, Model: r.model, Choices: choices, Usage: u}
	}
	delta := func(d chunkDelta, lp *chatLogprobs, finish *string) chatChunk {
		return chunk([]chunkChoice{{Index: 0, Delta: d, Logprobs: lp, FinishReason: finish}}, nil)
	}
	// The first chunk carries content "" only when the reply has content, so
	// a reply of only tool calls reassembles with content null, as sent
	// whole. The log-probs of the whole completion ride on it; the client
	// concatenates them across chunks.
	first := chunkDelta{Role: "assistant"}
	if r.content != nil {
		first.Content = new(string)
	}
	sse.event(delta(first, r.logprobs, nil))
	if r.content != nil && *r.content != "" {
		sse.event(delta(chunkDelta{Content: r.content}, nil, nil))
	}
	for _, c := range r.toolCalls {
		head := toolCallOut{Index: c.Index, ID: c.ID, Type: c.Type, Function: functionOut{Name: c.Function.Name}}
		sse.event(delta(chunkDelta{ToolCalls: []toolCallOut{head}}, nil, nil))
		args := toolCallOut{Index: c.Index, Function: functionOut{Arguments: c.Function.Arguments}}
		sse.event(delta(chunkDelta{ToolCalls: []toolCallOut{args}}, nil, nil))
	}
	finish := r.finish
	sse.event(delta(chunkDelta{}, nil, &finish))
	if includeUsage {
		u := r.usage
		sse.event(chunk([]chunkChoice{}, &u))
	}
	sse.done()
	if sse.err != nil {
		g.log.Debug().Err(sse.err).Str("id", r.id).Msg("stream ended early")
	}
}
