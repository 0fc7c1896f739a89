package chat

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// HistoryPolicy says what a Conversation does when the chat template,
// re-rendered with the new tool results, disagrees with the tokens it holds.
type HistoryPolicy int

const (
	// KeepSampled (the default) keeps the held tokens as the ground truth:
	// the model's sampled ids are never replaced. Each disagreement is
	// recorded as a Divergence, and the tool turn's tokens are found by
	// counting end-of-turn tokens when the template is not
	// prefix-preserving.
	KeepSampled HistoryPolicy = iota
	// RequireExact fails with *DivergenceError unless the held tokens are
	// exactly the tokenization of the full rendering.
	RequireExact
)

// DivergenceKind classifies a disagreement between held and rendered tokens.
type DivergenceKind int

const (
	// HistoryRerendered: the template renders the conversation so far
	// (with the sampled turn parsed back into a message) to other tokens
	// than those held: the model's text is not what the template writes
	// (JSON spacing, a different tokenization of the same text), or the
	// prompt glue differs.
	HistoryRerendered DivergenceKind = iota + 1
	// NotPrefixPreserving: adding the tool messages changed the rendering
	// of earlier turns (Qwen3 drops empty <think> blocks of earlier turns,
	// some templates trim whitespace).
	NotPrefixPreserving
)

func (k DivergenceKind) String() string {
	switch k {
	case HistoryRerendered:
		return "history re-rendered differently"
	case NotPrefixPreserving:
		return "template not prefix-preserving"
	}
	return fmt.Sprintf("DivergenceKind(%d)", int(k))
}

// Divergence records one disagreement, for metrics and debugging.
type Divergence struct {
	Kind DivergenceKind
	Turn int // index of the tool turn being appended (0-based)
	// At is the first token index where held and rendered ids differ.
	At int
	// Held and Rendered are the decoded tokens around At (for logs).
	Held, Rendered string
}

// DivergenceError is the error form of a Divergence under RequireExact.
type DivergenceError struct{ Divergence }

func (e *DivergenceError) Error() string {
	return fmt.Sprintf("turn %d: %s at token %d: held %q, rendered %q", e.Turn, e.Kind, e.At, e.Held, e.Rendered)
}

// ErrTurnNotEnded: the last sampled turn does not end with an end-of-turn
// token (generation was cut off), so no tool turn can follow it.
var ErrTurnNotEnded = errors.New("last assistant turn did not end with an end-of-turn token")

// Conversation holds the token ids of one multi-turn rollout and its loss
// mask. The assistant's sampled ids are appended verbatim (mask 1); tool
// turns are rendered with the chat template and appended as tokens (mask 0).
// It is not safe for concurrent use.
type Conversation struct {
	tok   *Tokenizer
	tmpl  *Template
	tools []Tool
	// parseTools type the arguments of sampled calls (see
	// ConversationOptions.ParseTools).
	parseTools []Tool
	kwargs     map[string]any
	policy     HistoryPolicy
	format     ToolCallFormat
	endIDs     []int32

	messages    []Message
	ids         []int32
	mask        []int8 // aligned with ids
	promptLen   int
	toolTurns   int
	divergences []Divergence
}

// ConversationOptions configures NewConversation.
type ConversationOptions struct {
	System string         // optional system message
	Tools  []Tool         // tools rendered into the prompt
	Kwargs map[string]any // extra template variables (enable_thinking, …)
	Policy HistoryPolicy
	// Format overrides the tool-call format detected from the template.
	Format *ToolCallFormat
	// ParseTools are the tools whose JSON Schemas type the arguments of
	// sampled calls; nil means Tools. Set it when the tools are callable
	// but not rendered into the prompt.
	ParseTools []Tool
}

// NewConversation renders the prompt ([system], user) with the generation
// prompt and tokenizes it.
func NewConversation(tok *Tokenizer, tmpl *Template, userPrompt string, opts ConversationOptions) (*Conversation, error) {
	var msgs []Message
	if opts.System != "" {
		msgs = append(msgs, Message{Role: "system", Content: opts.System})
	}
	return NewConversationMessages(tok, tmpl, append(msgs, Message{Role: "user", Content: userPrompt}), opts)
}

// NewConversationMessages starts from a list of prompt messages (opts.System
// is ignored); the last one is usually the user's.
func NewConversationMessages(tok *Tokenizer, tmpl *Template, prompt []Message, opts ConversationOptions) (*Conversation, error) {
	if len(prompt) == 0 {
		return nil, errors.New("conversation needs at least one prompt message")
	}
	c := &Conversation{
		tok: tok, tmpl: tmpl, tools: opts.Tools, parseTools: opts.ParseTools, kwargs: opts.Kwargs, policy: opts.Policy,
		endIDs: tok.Special().EndOfTurn,
	}
	if c.parseTools == nil {
		c.parseTools = opts.Tools
	}
	// An undetected format parses nothing; callers that offer tools check
	// DetectToolCallFormat's error at startup.
	c.format, _ = DetectToolCallFormat(tmpl.Source())
	if opts.Format != nil {
		c.format = *opts.Format
	}
	c.messages = slices.Clone(prompt)
	text, err := tmpl.Render(c.messages, c.tools, true, c.kwargs)
	if err != nil {
		return nil, fmt.Errorf("render prompt: %w", err)
	}
	c.ids = tok.Encode(text)
	c.mask = make([]int8, len(c.ids))
	c.promptLen = len(c.ids)
	return c, nil
}

// Format is the tool-call format used to parse sampled turns.
func (c *Conversation) Format() ToolCallFormat { return c.format }

// AppendSampled appends a sampled assistant turn verbatim (mask 1),
// including the end-of-turn token the model sampled, and parses it into a
// message: reasoning (<think>…</think>), content and tool calls. Calls that
// are malformed or violate their tool's schema are returned as
// ToolCallErrors (one *ToolCallError each, with the ID a tool turn answers)
// beside the message, which holds the good calls; the ids are appended
// either way.
func (c *Conversation) AppendSampled(ids []int32) (Message, error) {
	c.ids = append(c.ids, ids...)
	for range ids {
		c.mask = append(c.mask, 1)
	}
	msg, err := c.parseTurn(ids)
	c.messages = append(c.messages, msg)
	return msg, err
}

func (c *Conversation) parseTurn(ids []int32) (Message, error) {
	text := c.tok.Decode(ids, false)
	reasoning := ""
	if before, after, ok := strings.Cut(text, "</think>"); ok {
		if _, r, found := strings.Cut(before, "<think>"); found {
			before = r
		}
		reasoning = strings.Trim(before, "\n")
		text = strings.TrimLeft(after, "\n")
	}
	parsed := ParseToolCallsFor(c.format, text, c.parseTools)
	for i := range parsed.Calls {
		if parsed.Calls[i].ID == "" {
			parsed.Calls[i].ID = c.callID(i)
		}
	}
	for i, e := range parsed.Errors {
		if e.ID == "" {
			e.ID = c.callID(len(parsed.Calls) + i)
		}
	}
	return Message{Role: "assistant", Content: parsed.Content, ReasoningContent: reasoning, ToolCalls: parsed.Calls}, parsed.Err()
}

// callID names the i-th call of the current turn: 9 characters, as
// Mistral templates require.
func (c *Conversation) callID(i int) string { return fmt.Sprintf("call%05d", c.toolTurns*100+i) }

// AppendToolResults renders the tool messages, appends their tokens and
// the next assistant header (mask 0), and returns the whole sequence so
// far, which is the input of the next generation.
//
// The suffix is the part of the full rendering after the end-of-turn
// token closing the last assistant turn (the rendering without the tool
// messages, trimmed at its last end-of-turn token, as TRL does). When the
// template is prefix-preserving it is the tail after that prefix; when it
// is not, it is found by counting end-of-turn tokens, and the
// disagreement is recorded (KeepSampled) or returned (RequireExact).
func (c *Conversation) AppendToolResults(results []ToolResult) ([]int32, error) {
	msgs := make([]Message, len(results))
	for i, r := range results {
		msgs[i] = Message{Role: "tool", Content: r.Content, Name: r.Name, ToolCallID: r.ToolCallID}
	}
	return c.AppendMessages(msgs)
}

// AppendMessages is AppendToolResults for any non-assistant messages (tool
// results, or a user message such as an environment's feedback).
func (c *Conversation) AppendMessages(msgs []Message) ([]int32, error) {
	turn := c.toolTurns
	endID, ok := c.closingEndID()
	if !ok {
		return nil, ErrTurnNotEnded
	}
	for i, m := range msgs {
		if m.Role == "assistant" {
			return nil, fmt.Errorf("message %d: assistant turns are appended with AppendSampled", i)
		}
	}
	next := append(slices.Clone(c.messages), msgs...)
	oldText, err := c.tmpl.Render(c.messages, c.tools, false, c.kwargs)
	if err != nil {
		return nil, fmt.Errorf("render history for tool turn %d: %w", turn, err)
	}
	newText, err := c.tmpl.Render(next, c.tools, true, c.kwargs)
	if err != nil {
		return nil, fmt.Errorf("render tool turn %d: %w", turn, err)
	}
	oldIDs, newIDs := c.tok.Encode(oldText), c.tok.Encode(newText)
	last := lastIndex(oldIDs, endID)
	if last < 0 {
		return nil, fmt.Errorf("tool turn %d: the rendered history has no end-of-turn token %d", turn, endID)
	}
	oldIDs = oldIDs[:last+1]
	var suffix []int32
	if hasPrefix(newIDs, oldIDs) {
		suffix = newIDs[len(oldIDs):]
	} else {
		if err := c.diverge(NotPrefixPreserving, turn, oldIDs, newIDs); err != nil {
			return nil, err
		}
		pos := nthIndex(newIDs, endID, count(oldIDs, endID))
		if pos < 0 {
			return nil, fmt.Errorf("tool turn %d: the full rendering has fewer turns than the history; cannot align", turn)
		}
		suffix = newIDs[pos+1:]
	}
	if !slices.Equal(c.ids, oldIDs) {
		if err := c.diverge(HistoryRerendered, turn, c.ids, oldIDs); err != nil {
			return nil, err
		}
	}
	c.messages = next
	c.ids = append(c.ids, suffix...)
	c.mask = append(c.mask, make([]int8, len(suffix))...)
	c.toolTurns++
	return slices.Clone(c.ids), nil
}

// closingEndID is the end-of-turn token that ends the held ids.
func (c *Conversation) closingEndID() (int32, bool) {
	if len(c.ids) == c.promptLen {
		return 0, false
	}
	last := c.ids[len(c.ids)-1]
	return last, slices.Contains(c.endIDs, last)
}

func (c *Conversation) diverge(kind DivergenceKind, turn int, held, rendered []int32) error {
	at := 0
	for at < len(held) && at < len(rendered) && held[at] == rendered[at] {
		at++
	}
	window := func(ids []int32) string {
		lo, hi := max(at-3, 0), min(at+8, len(ids))
		if lo >= hi {
			return ""
		}
		return c.tok.Decode(ids[lo:hi], false)
	}
	d := Divergence{Kind: kind, Turn: turn, At: at, Held: window(held), Rendered: window(rendered)}
	if c.policy == RequireExact {
		return &DivergenceError{d}
	}
	c.divergences = append(c.divergences, d)
	return nil
}

// Messages returns the conversation as messages (sampled turns parsed).
func (c *Conversation) Messages() []Message { return slices.Clone(c.messages) }

// IDs returns every token id so far: prompt then completion.
func (c *Conversation) IDs() []int32 { return slices.Clone(c.ids) }

// PromptIDs returns the ids of the initial prompt.
func (c *Conversation) PromptIDs() []int32 { return slices.Clone(c.ids[:c.promptLen]) }

// CompletionIDs returns the ids after the prompt: sampled turns and the
// tool turns between them.
func (c *Conversation) CompletionIDs() []int32 { return slices.Clone(c.ids[c.promptLen:]) }

// LossMask is aligned with CompletionIDs: 1 on sampled tokens (including
// the end-of-turn token the model sampled), 0 on tool output and template
// glue.
func (c *Conversation) LossMask() []int8 { return slices.Clone(c.mask[c.promptLen:]) }

// Divergences lists the disagreements handled under KeepSampled.
func (c *Conversation) Divergences() []Divergence { return slices.Clone(c.divergences) }

func hasPrefix(ids, prefix []int32) bool {
	return len(ids) >= len(prefix) && slices.Equal(ids[:len(prefix)], prefix)
}

func lastIndex(ids []int32, id int32) int {
	for i := len(ids) - 1; i >= 0; i-- {
		if ids[i] == id {
			return i
		}
	}
	return -1
}

func count(ids []int32, id int32) int {
	n := 0
	for _, v := range ids {
		if v == id {
			n++
		}
	}
	return n
}

// nthIndex returns the index of the n-th (1-based) occurrence of id.
func nthIndex(ids []int32, id int32, n int) int {
	for i, v := range ids {
		if v == id {
			if n--; n == 0 {
				return i
			}
		}
	}
	return -1
}
