package gateway

// noteOnce logs msg at info the first time the gateway sees key (a request
// field it accepts but does not apply), at debug after that: a run says
// once per field what its agents asked for that was not done, without a
// line per call.
func (g *Gateway) noteOnce(ro *rollout, key, msg string) {
	ev := g.log.Debug()
	if _, seen := g.noted.LoadOrStore(key, true); !seen {
		ev = g.log.Info()
	}
	ev.Str("rollout", ro.id).Str("field", key).Msg(msg)
}

// noteChat notes the chat fields accepted but not applied.
func (g *Gateway) noteChat(ro *rollout, req *chatRequest, choice toolChoice) {
	if req.ParallelToolCalls != nil {
		g.noteOnce(ro, "chat.parallel_tool_calls", "chat: parallel_tool_calls is accepted but not enforced; the model writes as many calls as it writes")
	}
	if req.Store != nil && *req.Store {
		g.noteOnce(ro, "chat.store", "chat: store is accepted but nothing is stored; completions cannot be retrieved")
	}
	switch choice {
	case choiceRequired, choiceNamed:
		g.noteOnce(ro, "chat.tool_choice", `chat: tool_choice "required" or a named function is accepted but not enforced; decoding is not constrained and the reply is parsed as for "auto"`)
	}
	if req.ResponseFormat != nil && string(*req.ResponseFormat) != "null" {
		g.noteOnce(ro, "chat.response_format", "chat: response_format is accepted but not enforced; decoding is not constrained")
	}
}
