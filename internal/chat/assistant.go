package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
)

// Supervised fine-tuning trains on written assistant turns instead of
// sampled ones. AppendAssistant turns such a turn into the token ids the
// model would have sampled for it, so a conversation assembled from data is
// token for token what a rollout of the same exchange holds: the template
// renders the turn after the held history, and the ids from the end of the
// history up to and including the turn's end-of-turn token are appended with
// loss mask 1. No `{% generation %}` markers are needed.

// ErrConsecutiveAssistant: an assistant turn follows an assistant turn; the
// template has no generation prompt between them to anchor the second.
var ErrConsecutiveAssistant = errors.New("an assistant turn directly after another assistant turn")

// TurnRenderError says a written assistant turn does not survive the chat
// template: the rendering does not continue the held history, has no
// end-of-turn token, or loses or changes tool calls, so the tokens trained
// on would not be what the model later samples.
type TurnRenderError struct {
	Turn   int    // index of the assistant turn in the conversation (0-based)
	Reason string // what went wrong
}

func (e *TurnRenderError) Error() string {
	return fmt.Sprintf("assistant turn %d: %s", e.Turn, e.Reason)
}

// AppendAssistant appends a written assistant turn as the tokens the model
// would sample for it (mask 1, end-of-turn token included) and returns
// them. The message is kept as given (its tool-call ids are what the tool
// messages after it answer). The turn's tool calls must parse back from the
// rendered tokens with the template's tool-call format, names and
// arguments unchanged.
func (c *Conversation) AppendAssistant(msg Message) ([]int32, error) {
	turn := c.assistantTurns()
	if msg.Role != "assistant" {
		return nil, fmt.Errorf("AppendAssistant: role %q, want assistant", msg.Role)
	}
	if _, ended := c.closingEndID(); ended {
		return nil, &TurnRenderError{Turn: turn, Reason: ErrConsecutiveAssistant.Error()}
	}
	next := append(slices.Clone(c.messages), msg)
	text, err := c.tmpl.Render(next, c.tools, false, c.kwargs)
	if err != nil {
		return nil, fmt.Errorf("render assistant turn %d: %w", turn, err)
	}
	full := c.tok.Encode(text)
	if !hasPrefix(full, c.ids) {
		at := 0
		for at < len(full) && at < len(c.ids) && full[at] == c.ids[at] {
			at++
		}
		return nil, &TurnRenderError{Turn: turn, Reason: fmt.Sprintf(
			"the template renders the conversation with this turn differently before it (from token %d): the history is not kept verbatim, so the turn's tokens cannot be placed", at)}
	}
	rest := full[len(c.ids):]
	end := -1
	for i, id := range rest {
		if slices.Contains(c.endIDs, id) {
			end = i
			break
		}
	}
	if end < 0 {
		return nil, &TurnRenderError{Turn: turn, Reason: "the template renders no end-of-turn token after it"}
	}
	ids := rest[:end+1]
	parsed, perr := c.parseTurn(ids)
	if reason := sameCalls(msg.ToolCalls, parsed.ToolCalls, perr); reason != "" {
		return nil, &TurnRenderError{Turn: turn, Reason: reason}
	}
	c.ids = append(c.ids, ids...)
	for range ids {
		c.mask = append(c.mask, 1)
	}
	c.messages = next
	return slices.Clone(ids), nil
}

// assistantTurns counts the assistant messages held.
func (c *Conversation) assistantTurns() int {
	n := 0
	for _, m := range c.messages {
		if m.Role == "assistant" {
			n++
		}
	}
	return n
}

// sameCalls compares the written calls with those parsed back from the
// rendered turn ("" when they agree).
func sameCalls(want, got []ToolCall, parseErr error) string {
	if parseErr != nil {
		return fmt.Sprintf("its rendered tool calls do not parse back (%v); the template cannot render them in the format the model is parsed with", parseErr)
	}
	if len(want) != len(got) {
		return fmt.Sprintf("it has %d tool calls, but %d parse back from the rendered turn (set chat.tool_call_format to the template's format?)", len(want), len(got))
	}
	for i := range want {
		if want[i].Name != got[i].Name {
			return fmt.Sprintf("tool call %d: %q renders as %q", i, want[i].Name, got[i].Name)
		}
		if !sameJSON(want[i].Arguments, got[i].Arguments) {
			return fmt.Sprintf("tool call %d (%s): arguments %s render as %s", i, want[i].Name, want[i].Arguments, got[i].Arguments)
		}
	}
	return ""
}

// sameJSON compares two JSON values semantically (an empty value is {}).
func sameJSON(a, b json.RawMessage) bool {
	norm := func(r json.RawMessage) any {
		r = bytes.TrimSpace(r)
		if len(r) == 0 || string(r) == "null" {
			r = json.RawMessage("{}")
		}
		var v any
		if err := json.Unmarshal(r, &v); err != nil {
			return string(r)
		}
		if s, ok := v.(string); ok {
			// A JSON string holding an object (OpenAI's form) compares as
			// the object.
			var inner any
			if json.Unmarshal([]byte(s), &inner) == nil {
				return inner
			}
		}
		return v
	}
	x, _ := json.Marshal(norm(a))
	y, _ := json.Marshal(norm(b))
	return bytes.Equal(x, y)
}
