package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/ortrain/ortrain/internal/chat"
)

// Anthropic's Messages API (POST messages, what Anthropic's SDKs, the
// Claude Agent SDK and Claude Code call) goes through the chat pipeline:
// the request is converted into the chat messages and tools the same
// conversation would be in chat/completions (messages_input.go), so it
// renders, samples and records exactly as chat does, and an agent that
// sends a reply back continues the same training sequence. What differs is
// the wire: content blocks in and out, stop_reason, SSE with named events
// (messages_stream.go), and Anthropic's error shape.
//
// Decisions: thinking is not an API setting here (the model thinks as its
// template and Options.Kwargs say, and its thinking stays in the text block,
// as chat keeps it in content); thinking blocks sent back are skipped, since
// no reply of this server holds one. Server tools (web search, bash, text
// editor, computer, …: a tool with a "type") are dropped, not rendered, and
// counted (Recorder.DroppedMessageTools): the engine cannot run them and
// their schemas are Anthropic's. A tool call whose arguments are not a JSON
// object cannot be a tool_use block, so the reply is then the whole text, as
// for a malformed call (the parsers never produce one; this is a guard).
// tool_result's is_error is not rendered: chat templates have no place for
// it, and chat's tool messages carry none either.

// KindMessages is a call served by POST messages.
const KindMessages CallKind = "messages"

// messagesRequest is the part of a Messages API request the gateway reads;
// unknown fields (metadata, service_tier, container, …) are ignored.
type messagesRequest struct {
	Model         string          `json:"model"`
	System        json.RawMessage `json:"system"`
	Messages      []anthMessage   `json:"messages"`
	Tools         []anthTool      `json:"tools"`
	ToolChoice    json.RawMessage `json:"tool_choice"`
	MaxTokens     *int            `json:"max_tokens"`
	StopSequences []string        `json:"stop_sequences"`
	Temperature   *float64        `json:"temperature"`
	TopP          *float64        `json:"top_p"`
	TopK          *int            `json:"top_k"`
	Stream        *bool           `json:"stream"`
	// Accepted but not applied; noted once per run.
	Thinking          json.RawMessage `json:"thinking"`
	ContextManagement json.RawMessage `json:"context_management"`
	OutputConfig      json.RawMessage `json:"output_config"`
	MCPServers        json.RawMessage `json:"mcp_servers"`
}

// decodeMessagesRequest reads a Messages body; count_tokens has no
// max_tokens, a message request must send one (Anthropic has no default).
func decodeMessagesRequest(data []byte, needMaxTokens bool) (*messagesRequest, *apiError) {
	var req messagesRequest
	if err := decodeJSON(data, &req); err != nil {
		return nil, err
	}
	if needMaxTokens && req.MaxTokens == nil {
		return nil, badRequest("max_tokens", "max_tokens: field required (the Messages API has no default completion budget)")
	}
	if len(req.StopSequences) > maxStops {
		return nil, badRequest("stop_sequences", "stop_sequences has %d strings; at most %d are allowed", len(req.StopSequences), maxStops)
	}
	for i, s := range req.StopSequences {
		if s == "" {
			return nil, badRequest("stop_sequences", "stop_sequences[%d] is empty", i)
		}
	}
	return &req, nil
}

// samplingFields maps the request's sampling onto chat's, so resolve
// checks and defaults them the same way.
func (req *messagesRequest) samplingFields() samplingFields {
	f := samplingFields{MaxTokens: req.MaxTokens, Temperature: req.Temperature, TopP: req.TopP, TopK: req.TopK}
	if len(req.StopSequences) > 0 {
		f.Stop, _ = json.Marshal(req.StopSequences) // a []string always marshals
	}
	return f
}

// handleMessages serves POST messages (Anthropic's Messages API).
func (g *Gateway) handleMessages(w http.ResponseWriter, r *http.Request, ro *rollout) {
	data, e := readBody(w, r, g.opts.MaxBodyBytes)
	if e != nil {
		g.failMessages(w, ro, e)
		return
	}
	req, e := decodeMessagesRequest(data, true)
	if e != nil {
		g.failMessages(w, ro, e)
		return
	}
	plan, e := planMessages(req)
	if e != nil {
		g.failMessages(w, ro, e)
		return
	}
	g.noteMessages(ro, req, plan)
	promptIDs, e := g.render(&plan.chatPlan)
	if e != nil {
		g.failMessages(w, ro, e)
		return
	}
	f := req.samplingFields()
	spec, e := g.resolve(&f, req.MaxTokens, "max_tokens", promptIDs, "messages")
	if e != nil {
		g.failMessages(w, ro, e)
		return
	}
	spec.kind = KindMessages
	s, e := g.sample(r.Context(), ro, spec)
	if e != nil {
		g.failMessages(w, ro, e)
		return
	}
	reply := g.messagesReply(plan, s, spec.stops)
	reply.msg.Usage = messagesUsage{InputTokens: len(promptIDs), OutputTokens: len(s.ids)}
	if ro.rec != nil && len(plan.dropped) > 0 {
		ro.rec.dropMessageTools(len(plan.dropped))
	}
	// Record before answering: once the agent has the reply, the trainer
	// may close the rollout and read its calls.
	g.record(ro, spec, s, reply.finish, reply.malformed)
	if req.Stream != nil && *req.Stream {
		g.streamMessage(w, reply.msg)
		return
	}
	writeJSON(w, http.StatusOK, reply.msg)
}

// handleCountTokens serves POST messages/count_tokens: the prompt the same
// request would be sampled from, counted. Nothing is sampled or recorded.
func (g *Gateway) handleCountTokens(w http.ResponseWriter, r *http.Request, ro *rollout) {
	data, e := readBody(w, r, g.opts.MaxBodyBytes)
	if e != nil {
		g.failMessages(w, ro, e)
		return
	}
	req, e := decodeMessagesRequest(data, false)
	if e != nil {
		g.failMessages(w, ro, e)
		return
	}
	plan, e := planMessages(req)
	if e != nil {
		g.failMessages(w, ro, e)
		return
	}
	promptIDs, e := g.render(&plan.chatPlan)
	if e != nil {
		g.failMessages(w, ro, e)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		InputTokens int `json:"input_tokens"`
	}{len(promptIDs)})
}

// anthMessageOut is a Messages API reply.
type anthMessageOut struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	Role         string         `json:"role"`
	Model        string         `json:"model"`
	Content      []anthBlockOut `json:"content"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        messagesUsage  `json:"usage"`
}

// anthBlockOut is a text block (Text set, possibly to "") or a tool_use
// block (ID, Name, Input).
type anthBlockOut struct {
	Type  string          `json:"type"`
	Text  *string         `json:"text,omitempty"`
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
}

type messagesUsage struct {
	InputTokens              int `json:"input_tokens"`
	OutputTokens             int `json:"output_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
}

// messagesReply is a parsed completion and what its record needs.
type messagesReply struct {
	msg       anthMessageOut
	finish    string // chat's finish reason, recorded as chat records it
	malformed int
}

// messagesReply parses the sampled text as chatReply does (the model's own
// tool-call format; a malformed call returns the whole text) and lays it
// out as blocks: the text outside the calls, then one tool_use per call. A
// text block is sent whenever there are no calls, even empty, so a reply
// sent back renders as chat's content "" does.
func (g *Gateway) messagesReply(p *messagesPlan, s sampled, stops []string) messagesReply {
	out := messagesReply{finish: s.finish,
		msg: anthMessageOut{ID: "msg_" + randomHex(12), Type: "message", Role: "assistant", Model: g.opts.Model, Content: []anthBlockOut{}}}
	format := chat.FormatNone
	if p.parseCalls {
		format = g.opts.Format
	}
	parsed := chat.ParseToolCallsFor(format, s.text, p.tools)
	if len(parsed.Errors) > 0 || !objectArguments(parsed.Calls) {
		out.malformed = max(len(parsed.Errors), 1)
		parsed = chat.ParseToolCallsFor(chat.FormatNone, s.text, nil)
	}
	if parsed.Content != "" || len(parsed.Calls) == 0 {
		out.msg.Content = append(out.msg.Content, anthBlockOut{Type: "text", Text: &parsed.Content})
	}
	for _, c := range parsed.Calls {
		id := c.ID // a format that writes ids (Mistral, Kimi) must get them back
		if id == "" {
			id = "toolu_" + randomHex(12)
		}
		out.msg.Content = append(out.msg.Content, anthBlockOut{Type: "tool_use", ID: id, Name: c.Name, Input: c.Arguments})
	}
	reason := "end_turn"
	stop, cutByStop := g.matchedStop(s, stops)
	switch {
	case s.finish == "length":
		reason = "max_tokens"
	case len(parsed.Calls) > 0:
		reason, out.finish = "tool_use", "tool_calls"
	case cutByStop:
		reason, out.msg.StopSequence = "stop_sequence", &stop
	}
	out.msg.StopReason = &reason
	return out
}

// objectArguments: every call's arguments are a JSON object, as a tool_use
// input must be.
func objectArguments(calls []chat.ToolCall) bool {
	for _, c := range calls {
		a := bytes.TrimSpace(c.Arguments)
		if len(a) == 0 || a[0] != '{' || !json.Valid(a) {
			return false
		}
	}
	return true
}

// matchedStop names the stop sequence that ended the completion. sample
// keeps the ids through the token completing it and the text before it, so
// the decoded ids continue that text with the stop sequence; where several
// fit, cutAtStop took the first in the request's order.
func (g *Gateway) matchedStop(s sampled, stops []string) (string, bool) {
	if len(stops) == 0 || s.finish != "stop" {
		return "", false
	}
	rest, ok := strings.CutPrefix(g.opts.Tokenizer.Decode(s.ids, false), s.text)
	if !ok {
		return "", false
	}
	for _, stop := range stops {
		if strings.HasPrefix(rest, stop) {
			return stop, true
		}
	}
	return "", false
}

// anthErrorBody is Anthropic's error reply.
type anthErrorBody struct {
	Type  string        `json:"type"` // "error"
	Error anthErrorInfo `json:"error"`
}

type anthErrorInfo struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// anthErrorType is Anthropic's error type for a status.
func anthErrorType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusNotFound:
		return "not_found_error"
	case status == http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status == http.StatusGatewayTimeout:
		return "timeout_error"
	case status == http.StatusServiceUnavailable || status == 529:
		return "overloaded_error"
	case status >= 500:
		return "api_error"
	}
	return "invalid_request_error"
}

// failMessages is fail in Anthropic's error shape: counted against the
// rollout the same way, logged the same way. Anthropic's body has no param
// field, so the message names the field at fault.
func (g *Gateway) failMessages(w http.ResponseWriter, ro *rollout, e *apiError) {
	g.refuse(w, ro, e, "messages request refused")
	msg := e.message
	if e.param != "" && !strings.Contains(msg, e.param) {
		msg = e.param + ": " + msg
	}
	writeJSON(w, e.status, anthErrorBody{Type: "error", Error: anthErrorInfo{Type: anthErrorType(e.status), Message: msg}})
}

// messagesState is a rollout's Messages API bookkeeping, kept in its
// Recorder under Recorder.mu.
type messagesState struct {
	droppedTools int
}

// DroppedMessageTools counts the server tools (web search, bash, text
// editor, computer, …) dropped from the rollout's served Messages calls,
// summed over calls: the model never saw them offered.
func (r *Recorder) DroppedMessageTools() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.anthropic.droppedTools
}

func (r *Recorder) dropMessageTools(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.anthropic.droppedTools += n
	}
}

// noteMessages logs what a request asked for that is accepted but not
// applied: at info once per rollout (an agent sends the same settings on
// every call), at debug for the single tenant, which keeps no state.
func (g *Gateway) noteMessages(ro *rollout, req *messagesRequest, p *messagesPlan) {
	note := func(key, msg string) { g.noteOnce(ro, "messages."+key, msg) }
	if present(req.Thinking) {
		note("thinking", "messages: thinking is accepted but not applied; the model thinks as its chat template and kwargs say")
	}
	if present(req.ContextManagement) {
		note("context_management", "messages: context_management is accepted but not applied; the history is rendered as sent")
	}
	if present(req.OutputConfig) {
		note("output_config", "messages: output_config is accepted but not applied; decoding is not constrained")
	}
	if present(req.MCPServers) && string(bytes.TrimSpace(req.MCPServers)) != "[]" {
		note("mcp_servers", "messages: mcp_servers is accepted but not applied; this server calls no tools itself")
	}
	if p.forced {
		note("tool_choice", `messages: tool_choice "any"/"tool" is accepted but not enforced; the reply is parsed as for "auto"`)
	}
	if len(p.dropped) > 0 {
		note("server_tools", "messages: server tools are dropped (the engine cannot run them): "+strings.Join(p.dropped, ", "))
	}
}

// present: a field was sent with a value other than null.
func present(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && string(raw) != "null"
}
