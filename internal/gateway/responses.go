package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/ortrain/ortrain/internal/chat"
)

// OpenAI's Responses API (POST responses, what the openai clients'
// responses.create, the Agents SDK and Codex CLI call) goes through the
// chat pipeline: the request is converted into the chat messages and tools
// the same conversation would be in chat/completions (responses_input.go),
// so it renders, samples and records exactly as chat does, and an agent
// that sends its output items back continues the same training sequence.
// What differs is the wire: items in and out, status instead of a finish
// reason, SSE with named events (responses_stream.go).
//
// Decisions: instructions are a leading system message and, as OpenAI
// does, are not carried over by previous_response_id. A tenant keeps the
// conversation of each response it served (unless store is false), at most
// maxStoredResponses, for previous_response_id only: responses cannot be
// retrieved, deleted or listed. Hosted and custom tools (web_search,
// file_search, code_interpreter, custom, …) are dropped, not rendered, and
// counted (Recorder.DroppedResponseTools): the engine cannot run them. A
// namespace's functions are offered under flatName and their calls carry
// the namespace back, as Codex routes MCP tools. reasoning, include,
// parallel_tool_calls, truncation, text.format and a forcing tool_choice
// are accepted, not applied, and logged once per gateway. background,
// conversation and prompt (stored prompt templates) are refused: they need
// state this server does not keep. A completion cut by the token budget is
// status "incomplete" (incomplete_details.reason max_output_tokens).

// KindResponses is a call served by POST responses.
const KindResponses CallKind = "responses"

// responsesRequest is the part of a Responses request the gateway reads;
// unknown fields (prompt_cache_key, service_tier, safety_identifier,
// max_tool_calls, …) are ignored.
type responsesRequest struct {
	Model              string            `json:"model"`
	Instructions       json.RawMessage   `json:"instructions"`
	Input              json.RawMessage   `json:"input"`
	Tools              []json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	MaxOutputTokens    *int              `json:"max_output_tokens"`
	Temperature        *float64          `json:"temperature"`
	TopP               *float64          `json:"top_p"`
	Stream             *bool             `json:"stream"`
	Store              *bool             `json:"store"`
	PreviousResponseID *string           `json:"previous_response_id"`
	// Echoed, and noted once when they ask for what is not done.
	ParallelToolCalls *bool           `json:"parallel_tool_calls"`
	Reasoning         json.RawMessage `json:"reasoning"`
	Include           json.RawMessage `json:"include"`
	Text              json.RawMessage `json:"text"`
	Truncation        *string         `json:"truncation"`
	Metadata          json.RawMessage `json:"metadata"`
	User              *string         `json:"user"`
	// Refused when set.
	Background   *bool           `json:"background"`
	Conversation json.RawMessage `json:"conversation"`
	Prompt       json.RawMessage `json:"prompt"`
}

// decodeResponsesRequest reads and checks a Responses body.
func decodeResponsesRequest(data []byte) (*responsesRequest, *apiError) {
	var req responsesRequest
	if err := decodeJSON(data, &req); err != nil {
		return nil, err
	}
	switch {
	case req.Background != nil && *req.Background:
		return nil, badRequest("background", "background responses are not supported: this server answers each request when it is done")
	case hasValue(req.Conversation):
		return nil, badRequest("conversation", "conversations are not supported; send the items, or previous_response_id")
	case hasValue(req.Prompt):
		return nil, badRequest("prompt", "stored prompt templates are not supported; send instructions and input")
	case req.Truncation != nil && *req.Truncation != "auto" && *req.Truncation != "disabled":
		return nil, badRequest("truncation", `truncation must be "auto" or "disabled", got %q`, *req.Truncation)
	}
	return &req, nil
}

// handleResponses serves POST responses.
func (g *Gateway) handleResponses(w http.ResponseWriter, r *http.Request, ro *rollout) {
	data, e := readBody(w, r, g.opts.MaxBodyBytes)
	if e != nil {
		g.fail(w, ro, e)
		return
	}
	req, e := decodeResponsesRequest(data)
	if e != nil {
		g.fail(w, ro, e)
		return
	}
	var prev []chat.Message
	if id := req.PreviousResponseID; id != nil && *id != "" {
		var ok bool
		if prev, ok = ro.responses.get(*id); !ok {
			e := badRequest("previous_response_id", "Previous response with id '%s' not found.", *id)
			e.code = "previous_response_not_found"
			g.fail(w, ro, e)
			return
		}
	}
	plan, e := planResponses(req, prev)
	if e != nil {
		g.fail(w, ro, e)
		return
	}
	g.noteResponses(ro, req, plan)
	promptIDs, e := g.render(&plan.chatPlan)
	if e != nil {
		if e.param == "messages" {
			e.param = "input"
		}
		g.fail(w, ro, e)
		return
	}
	f := samplingFields{Temperature: req.Temperature, TopP: req.TopP}
	spec, e := g.resolve(&f, req.MaxOutputTokens, "max_output_tokens", promptIDs, "input")
	if e != nil {
		g.fail(w, ro, e)
		return
	}
	spec.kind = KindResponses
	s, e := g.sample(r.Context(), ro, spec)
	if e != nil {
		g.fail(w, ro, e)
		return
	}
	reply := g.responsesReply(req, plan, spec, s)
	if ro.rec != nil && len(plan.dropped) > 0 {
		ro.rec.dropResponseTools(len(plan.dropped))
	}
	// Record before answering: once the agent has the reply, the trainer
	// may close the rollout and read its calls.
	g.record(ro, spec, s, reply.finish, reply.malformed)
	if reply.resp.Store {
		ro.responses.put(reply.resp.ID, slices.Concat(plan.conversation, []chat.Message{reply.turn}))
	}
	if req.Stream != nil && *req.Stream {
		g.streamResponse(w, &reply.resp)
		return
	}
	writeJSON(w, http.StatusOK, reply.resp)
}

// responseOut is a Responses API response object.
type responseOut struct {
	ID                 string             `json:"id"`
	Object             string             `json:"object"`
	CreatedAt          int64              `json:"created_at"`
	Status             string             `json:"status"`
	CompletedAt        *int64             `json:"completed_at"`
	Error              *struct{}          `json:"error"` // always null: a failed call is an HTTP error
	IncompleteDetails  *incompleteDetails `json:"incomplete_details"`
	Instructions       *string            `json:"instructions"`
	MaxOutputTokens    int                `json:"max_output_tokens"`
	Model              string             `json:"model"`
	Output             []any              `json:"output"` // respMessageOut and respFunctionCallOut
	ParallelToolCalls  bool               `json:"parallel_tool_calls"`
	PreviousResponseID *string            `json:"previous_response_id"`
	Reasoning          json.RawMessage    `json:"reasoning"`
	Store              bool               `json:"store"`
	Temperature        float64            `json:"temperature"`
	Text               json.RawMessage    `json:"text"`
	ToolChoice         json.RawMessage    `json:"tool_choice"`
	Tools              []json.RawMessage  `json:"tools"`
	TopP               float64            `json:"top_p"`
	Truncation         string             `json:"truncation"`
	Usage              *responsesUsage    `json:"usage"`
	User               *string            `json:"user"`
	Metadata           json.RawMessage    `json:"metadata"`
}

type incompleteDetails struct {
	Reason string `json:"reason"`
}

type respMessageOut struct {
	Type    string         `json:"type"` // "message"
	ID      string         `json:"id"`
	Status  string         `json:"status"`
	Role    string         `json:"role"`
	Content []respTextPart `json:"content"`
}

type respTextPart struct {
	Type        string `json:"type"` // "output_text"
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

type respFunctionCallOut struct {
	Type      string `json:"type"` // "function_call"
	ID        string `json:"id"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
	Arguments string `json:"arguments"` // a JSON object, as a string
	Status    string `json:"status"`
}

type responsesUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens     int `json:"cached_tokens"`
		CacheWriteTokens int `json:"cache_write_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

// responsesReply is a parsed completion, what its record needs, and the
// assistant turn as the conversation continues it.
type responsesReply struct {
	resp      responseOut
	finish    string // chat's finish reason, recorded as chat records it
	malformed int
	// turn is the assistant message the output items convert back into
	// (convertInput), so a continuation by previous_response_id renders as
	// one that sends the items back.
	turn chat.Message
}

// responsesReply parses the sampled text as chatReply does (the model's
// own tool-call format; a malformed call returns the whole text) and lays
// it out as items: a message with the text outside the calls (sent
// whenever there are no calls, even empty), then one function_call per
// call.
func (g *Gateway) responsesReply(req *responsesRequest, p *responsesPlan, spec sampleSpec, s sampled) responsesReply {
	out := responsesReply{finish: s.finish, resp: g.responseShell(req, spec)}
	format := chat.FormatNone
	if p.parseCalls {
		format = g.opts.Format
	}
	parsed := chat.ParseToolCallsFor(format, s.text, p.tools)
	if len(parsed.Errors) > 0 {
		out.malformed = len(parsed.Errors)
		parsed = chat.ParseToolCallsFor(chat.FormatNone, s.text, nil)
	}
	status := "completed"
	if s.finish == "length" {
		status = "incomplete"
		out.resp.IncompleteDetails = &incompleteDetails{Reason: "max_output_tokens"}
	} else {
		done := s.end.Unix()
		out.resp.CompletedAt = &done
	}
	out.resp.Status = status
	out.turn = chat.Message{Role: "assistant", Content: parsed.Content}
	if parsed.Content != "" || len(parsed.Calls) == 0 {
		out.resp.Output = append(out.resp.Output, respMessageOut{Type: "message", ID: "msg_" + randomHex(12), Status: status,
			Role: "assistant", Content: []respTextPart{{Type: "output_text", Text: parsed.Content, Annotations: []any{}}}})
	} else {
		out.turn.NullContent = true
	}
	for _, c := range parsed.Calls {
		id := c.ID // a format that writes ids (Mistral, Kimi) must get them back
		if id == "" {
			id = "call_" + randomHex(12)
		}
		q, ok := p.namespaced[c.Name]
		if !ok {
			q = qualifiedName{name: c.Name}
		}
		args := string(c.Arguments)
		out.resp.Output = append(out.resp.Output, respFunctionCallOut{Type: "function_call", ID: "fc_" + randomHex(12), CallID: id,
			Name: q.name, Namespace: q.namespace, Arguments: args, Status: "completed"})
		quoted, _ := json.Marshal(args) // a string always marshals
		out.turn.ToolCalls = append(out.turn.ToolCalls, chat.ToolCall{ID: id, Name: c.Name, Arguments: callArguments(quoted)})
	}
	if len(parsed.Calls) > 0 && out.finish == "stop" {
		out.finish = "tool_calls"
	}
	u := &responsesUsage{InputTokens: len(spec.promptIDs), OutputTokens: len(s.ids), TotalTokens: len(spec.promptIDs) + len(s.ids)}
	out.resp.Usage = u
	return out
}

// responseShell is the response object without its output: the request's
// settings echoed, the sampling the engine used.
func (g *Gateway) responseShell(req *responsesRequest, spec sampleSpec) responseOut {
	resp := responseOut{ID: "resp_" + randomHex(16), Object: "response", CreatedAt: g.opts.Now().Unix(), Status: "in_progress",
		MaxOutputTokens: spec.maxTokens, Model: g.opts.Model, Output: []any{}, ParallelToolCalls: true,
		PreviousResponseID: req.PreviousResponseID, Reasoning: compactRaw(req.Reasoning), Store: true,
		Temperature: spec.sampling.Temperature, Text: compactRaw(req.Text), ToolChoice: compactRaw(req.ToolChoice),
		Tools: make([]json.RawMessage, 0, len(req.Tools)), TopP: spec.sampling.TopP, Truncation: "disabled",
		User: req.User, Metadata: compactRaw(req.Metadata)}
	if hasValue(req.Instructions) {
		var text string
		_ = json.Unmarshal(req.Instructions, &text) // checked by planResponses
		resp.Instructions = &text
	}
	if req.ParallelToolCalls != nil {
		resp.ParallelToolCalls = *req.ParallelToolCalls
	}
	if req.Store != nil {
		resp.Store = *req.Store
	}
	if req.Truncation != nil {
		resp.Truncation = *req.Truncation
	}
	for _, t := range req.Tools {
		resp.Tools = append(resp.Tools, compactRaw(t))
	}
	if resp.Text == nil {
		resp.Text = json.RawMessage(`{"format":{"type":"text"}}`)
	}
	if resp.ToolChoice == nil {
		resp.ToolChoice = json.RawMessage(`"auto"`)
	}
	if resp.Metadata == nil {
		resp.Metadata = json.RawMessage(`{}`)
	}
	return resp
}

// compactRaw is a sent value to echo, or nil for absent or null.
func compactRaw(raw json.RawMessage) json.RawMessage {
	if !hasValue(raw) {
		return nil
	}
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return nil
	}
	return b.Bytes()
}

// hasValue: a field was sent with a value other than null.
func hasValue(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && string(raw) != "null"
}

// respCounters is a rollout's Responses API bookkeeping, kept in its
// Recorder under Recorder.mu.
type respCounters struct {
	droppedTools int
}

// DroppedResponseTools counts the hosted and custom tools (web_search,
// file_search, code_interpreter, custom, …) dropped from the rollout's
// served Responses calls, summed over calls: the model never saw them
// offered.
func (r *Recorder) DroppedResponseTools() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.responses.droppedTools
}

func (r *Recorder) dropResponseTools(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.responses.droppedTools += n
	}
}

// noteResponses logs, once per gateway (an agent sends the same settings
// on every call), what a request asked for that is accepted but not
// applied.
func (g *Gateway) noteResponses(ro *rollout, req *responsesRequest, p *responsesPlan) {
	note := func(key, msg string) { g.noteOnce(ro, "responses."+key, "responses: "+msg) }
	if req.ParallelToolCalls != nil {
		note("parallel_tool_calls", "parallel_tool_calls is accepted but not enforced; the model writes as many calls as it writes")
	}
	if hasValue(req.Reasoning) {
		note("reasoning", "reasoning is accepted but not applied; the model thinks as its chat template and kwargs say, in its text")
	}
	if hasValue(req.Include) && string(compactRaw(req.Include)) != "[]" {
		note("include", "include is accepted but not applied; no reasoning items or log-probs are returned")
	}
	if req.Store != nil && *req.Store {
		note("store", fmt.Sprintf("store is the default here; responses are kept (at most %d per rollout) only for "+
			"previous_response_id and cannot be retrieved", maxStoredResponses))
	}
	if req.Truncation != nil && *req.Truncation == "auto" {
		note("truncation", `truncation "auto" is accepted but not applied; a conversation too long for the context is refused`)
	}
	var text struct {
		Format *struct {
			Type string `json:"type"`
		} `json:"format"`
	}
	if hasValue(req.Text) && json.Unmarshal(req.Text, &text) == nil && text.Format != nil && text.Format.Type != "text" {
		note("text.format", "text.format "+text.Format.Type+" is accepted but not enforced; decoding is not constrained")
	}
	if p.forced {
		note("tool_choice", `tool_choice "required" or a named tool is accepted but not enforced; the reply is parsed as for "auto"`)
	}
	if len(p.dropped) > 0 {
		note("dropped_tools", "tools the engine cannot run are dropped: "+strings.Join(p.dropped, ", "))
	}
}
