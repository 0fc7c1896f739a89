package gateway

import (
	"crypto/rand"
	"encoding/hex"
	"math"
	"net/http"
	"strconv"

	"github.com/ortrain/ortrain/internal/chat"
)

// handleChat serves POST chat/completions.
func (g *Gateway) handleChat(w http.ResponseWriter, r *http.Request, ro *rollout) {
	data, e := readBody(w, r, g.opts.MaxBodyBytes)
	if e != nil {
		g.fail(w, ro, e)
		return
	}
	req, e := decodeChatRequest(data)
	if e != nil {
		g.fail(w, ro, e)
		return
	}
	plan, e := planChat(req)
	if e != nil {
		g.fail(w, ro, e)
		return
	}
	g.noteChat(ro, req, plan.choice)
	promptIDs, e := g.render(plan)
	if e != nil {
		g.fail(w, ro, e)
		return
	}
	maxTokens, maxParam := req.MaxTokens, "max_tokens"
	if req.MaxCompletionTokens != nil {
		maxTokens, maxParam = req.MaxCompletionTokens, "max_completion_tokens"
	}
	spec, e := g.resolve(&req.samplingFields, maxTokens, maxParam, promptIDs, "messages")
	if e != nil {
		g.fail(w, ro, e)
		return
	}
	spec.kind = KindChat
	s, e := g.sample(r.Context(), ro, spec)
	if e != nil {
		g.fail(w, ro, e)
		return
	}
	reply := g.chatReply(plan, s, req.Logprobs != nil && *req.Logprobs)
	reply.usage = usage{PromptTokens: len(promptIDs), CompletionTokens: len(s.ids), TotalTokens: len(promptIDs) + len(s.ids)}
	// Record before answering: once the agent has the reply, the trainer
	// may close the rollout and read its calls.
	g.record(ro, spec, s, reply.finish, reply.malformed)
	if req.Stream != nil && *req.Stream {
		g.streamChat(w, reply, req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
		return
	}
	writeJSON(w, http.StatusOK, reply.completion())
}

// chatReply is one parsed completion, written either whole or as chunks.
type chatReply struct {
	id        string
	created   int64
	model     string
	content   *string // nil when the reply is only tool calls
	toolCalls []toolCallOut
	finish    string
	malformed int           // tool calls that did not parse
	logprobs  *chatLogprobs // nil unless asked for
	usage     usage
}

// chatReply parses the sampled text: the tool calls in the model's format
// (when tools were offered and tool_choice is not "none") and the content
// outside them. A reply with a malformed call is returned whole as content,
// so the agent sees what the model wrote instead of a partial set of calls.
func (g *Gateway) chatReply(p *chatPlan, s sampled, withLogprobs bool) chatReply {
	reply := chatReply{id: "chatcmpl-" + randomHex(12), created: g.opts.Now().Unix(), model: g.opts.Model, finish: s.finish}
	format := chat.FormatNone
	if p.parseCalls {
		format = g.opts.Format
	}
	parsed := chat.ParseToolCallsFor(format, s.text, p.tools)
	if len(parsed.Errors) > 0 {
		reply.malformed = len(parsed.Errors)
		parsed = chat.ParseToolCallsFor(chat.FormatNone, s.text, nil)
	}
	for i, c := range parsed.Calls {
		id := c.ID // a format that writes ids (Mistral, Kimi) must get them back
		if id == "" {
			id = "call_" + randomHex(12)
		}
		reply.toolCalls = append(reply.toolCalls, toolCallOut{Index: &i, ID: id, Type: "function",
			Function: functionOut{Name: c.Name, Arguments: string(c.Arguments)}})
	}
	if parsed.Content != "" || len(reply.toolCalls) == 0 {
		reply.content = &parsed.Content
	}
	if len(reply.toolCalls) > 0 && reply.finish == "stop" {
		reply.finish = "tool_calls"
	}
	if withLogprobs {
		reply.logprobs = &chatLogprobs{Content: make([]tokenLogprob, len(s.ids))}
		for i, id := range s.ids {
			tok := g.opts.Tokenizer.Decode([]int32{id}, false)
			b := make([]int, len(tok))
			for j := range len(tok) {
				b[j] = int(tok[j])
			}
			reply.logprobs.Content[i] = tokenLogprob{Token: tok, Logprob: finiteLogprob(s.logprobs[i]), Bytes: b, TopLogprobs: []topLogprob{}}
		}
	}
	return reply
}

// completion is the non-streamed reply.
func (r *chatReply) completion() chatCompletion {
	msg := assistantMessage{Role: "assistant", Content: r.content, ToolCalls: stripIndex(r.toolCalls)}
	return chatCompletion{ID: r.id, Object: "chat.completion", Created: r.created, Model: r.model,
		Choices: []chatChoice{{Index: 0, Message: msg, Logprobs: r.logprobs, FinishReason: r.finish}}, Usage: r.usage}
}

// stripIndex drops the stream-only index from calls.
func stripIndex(calls []toolCallOut) []toolCallOut {
	out := make([]toolCallOut, len(calls))
	for i, c := range calls {
		c.Index = nil
		out[i] = c
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// finiteLogprob widens a sampler log-prob to the float64 that prints as the
// float32 does (-0.01, not -0.009999999776482582), and maps -Inf and NaN,
// which JSON cannot carry, to OpenAI's floor of -9999.
func finiteLogprob(v float32) float64 {
	f := float64(v)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return -9999
	}
	f, _ = strconv.ParseFloat(strconv.FormatFloat(f, 'g', -1, 32), 64)
	return f
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand never fails on supported platforms
	return hex.EncodeToString(b)
}

type chatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   usage        `json:"usage"`
}

type chatChoice struct {
	Index        int              `json:"index"`
	Message      assistantMessage `json:"message"`
	Logprobs     *chatLogprobs    `json:"logprobs"`
	FinishReason string           `json:"finish_reason"`
}

type assistantMessage struct {
	Role      string        `json:"role"`
	Content   *string       `json:"content"`
	ToolCalls []toolCallOut `json:"tool_calls,omitempty"`
}

// toolCallOut is a call in a reply; Index is set only in stream deltas.
type toolCallOut struct {
	Index    *int        `json:"index,omitempty"`
	ID       string      `json:"id,omitempty"`
	Type     string      `json:"type,omitempty"`
	Function functionOut `json:"function"`
}

type functionOut struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"` // a JSON object, as a string
}

type chatLogprobs struct {
	Content []tokenLogprob `json:"content"`
}

type tokenLogprob struct {
	Token       string       `json:"token"`
	Logprob     float64      `json:"logprob"`
	Bytes       []int        `json:"bytes"`
	TopLogprobs []topLogprob `json:"top_logprobs"`
}

type topLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}
