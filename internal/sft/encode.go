package sft

import (
	"errors"
	"fmt"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/grpo"
)

// Encoder turns examples into training rows through the chat pipeline
// rollouts use: the prompt rendered as a rollout renders it (the
// configured system prompt when the row has none, the row's tools unless
// tools are hidden), each assistant turn appended as the tokens the model
// would sample for it (chat.Conversation.AppendAssistant), and tool or
// user turns as the template renders them between turns.
type Encoder struct {
	Tokenizer *chat.Tokenizer
	Template  *chat.Template
	Format    *chat.ToolCallFormat
	Kwargs    map[string]any
	// System is the system prompt rows without one get (chat.system_prompt).
	System string
	// HideTools leaves the tools out of the prompt (chat.render_tools false);
	// they still type the calls' arguments.
	HideTools bool
	// AssistantOnly trains on assistant tokens only; otherwise on every
	// token after the first. CompletionOnly is the same for the completion
	// of prompt-completion rows.
	AssistantOnly, CompletionOnly bool
	// MaxLength bounds a row's tokens; Refuse makes a longer row an error
	// instead of cutting it (keeping the start).
	MaxLength int
	Refuse    bool
}

// Encoded is one example as a training row.
type Encoded struct {
	Row       grpo.Row
	Truncated bool // cut at MaxLength
	// Tokens is the row's length before truncation.
	Tokens int
}

// ErrNothingToTrain: after truncation the row has no trained token left.
var ErrNothingToTrain = errors.New("no trained token within max_length")

// Encode tokenizes one example. Errors are *RowError (file and line left
// for the caller) wrapping what the chat pipeline said.
func (e *Encoder) Encode(ex Example) (Encoded, error) {
	var ids []int32
	var mask []int8
	var err error
	if ex.Messages == nil {
		ids, mask = e.encodeText(ex)
	} else if ids, mask, err = e.encodeConversation(ex); err != nil {
		return Encoded{}, err
	}
	out := Encoded{Tokens: len(ids)}
	if len(ids) > e.MaxLength {
		if e.Refuse {
			return Encoded{}, rowErr("", "%d tokens, more than max_length %d (sft.truncation_mode: refuse)", len(ids), e.MaxLength)
		}
		ids, mask, out.Truncated = ids[:e.MaxLength], mask[:e.MaxLength], true
	}
	first := -1
	for i, m := range mask {
		if m == 1 && i > 0 {
			first = i
			break
		}
	}
	if first < 0 {
		return Encoded{}, &RowError{Reason: ErrNothingToTrain.Error()}
	}
	row := grpo.Row{Tokens: ids, PromptLen: first, LossMask: make([]uint8, len(ids)-first)}
	for i := first; i < len(ids); i++ {
		row.LossMask[i-first] = uint8(mask[i])
	}
	out.Row = row
	return out, nil
}

// encodeText is a plain-text prompt-completion row: the prompt, then the
// completion and the end-of-sequence token (TRL appends it), trained on
// the completion (or everything, without completion_only_loss).
func (e *Encoder) encodeText(ex Example) ([]int32, []int8) {
	p := e.Tokenizer.Encode(ex.PromptText)
	c := e.Tokenizer.Encode(ex.CompletionText)
	if eos := e.Tokenizer.Special().EndOfTurn; len(eos) > 0 {
		c = append(c, eos[0])
	}
	ids := append(p, c...)
	mask := make([]int8, len(ids))
	for i := range mask {
		if !e.CompletionOnly || i >= len(p) {
			mask[i] = 1
		}
	}
	return ids, mask
}

// encodeConversation assembles a conversational (or conversational
// prompt-completion) row turn by turn.
func (e *Encoder) encodeConversation(ex Example) ([]int32, []int8, error) {
	msgs := ex.Messages
	promptEnd := 0
	for promptEnd < len(msgs) && msgs[promptEnd].Role != "assistant" {
		promptEnd++
	}
	prompt := msgs[:promptEnd]
	if e.System != "" && prompt[0].Role != "system" {
		prompt = append([]chat.Message{{Role: "system", Content: e.System}}, prompt...)
	}
	rendered := ex.Tools
	if e.HideTools {
		rendered = nil
	}
	conv, err := chat.NewConversationMessages(e.Tokenizer, e.Template, prompt, chat.ConversationOptions{
		Tools: rendered, ParseTools: ex.Tools, Kwargs: e.Kwargs, Policy: chat.RequireExact, Format: e.Format,
	})
	if err != nil {
		return nil, nil, rowErr("messages", "render the prompt: %v", err)
	}
	// trained[i]: whether assistant turn i is trained on (all of them,
	// or a prompt-completion row's completion turns only).
	promptTurns := 0
	for _, m := range msgs[:ex.PromptLen] {
		if m.Role == "assistant" {
			promptTurns++
		}
	}
	turn := 0
	var pendingIdx []int // message indices of non-assistant messages to append
	flush := func() error {
		if len(pendingIdx) == 0 {
			return nil
		}
		batch := make([]chat.Message, len(pendingIdx))
		for k, j := range pendingIdx {
			batch[k] = msgs[j]
		}
		if _, err := conv.AppendMessages(batch); err != nil {
			return rowErr(fmt.Sprintf("messages[%d]", pendingIdx[0]), "render: %v", err)
		}
		pendingIdx = nil
		return nil
	}
	var untrained [][2]int // [start, end) token ranges of assistant turns not trained on
	for i := promptEnd; i < len(msgs); i++ {
		m := msgs[i]
		if m.Role != "assistant" {
			pendingIdx = append(pendingIdx, i)
			continue
		}
		if err := flush(); err != nil {
			return nil, nil, err
		}
		start := len(conv.IDs())
		turnIDs, err := conv.AppendAssistant(m)
		if err != nil {
			return nil, nil, &RowError{Field: fmt.Sprintf("messages[%d]", i), Reason: err.Error(), Err: err}
		}
		if turn < promptTurns {
			untrained = append(untrained, [2]int{start, start + len(turnIDs)})
		}
		turn++
	}
	// Trailing tool or user messages after the last assistant turn teach
	// nothing; they are left out, as a rollout ends at its last turn.
	ids := conv.IDs()
	mask := make([]int8, len(ids))
	completion := conv.LossMask()
	promptLen := len(ids) - len(completion)
	assistantOnly := e.AssistantOnly
	if ex.PromptLen > 0 {
		assistantOnly = e.CompletionOnly
	}
	for i := range mask {
		switch {
		case !assistantOnly:
			mask[i] = 1
		case i >= promptLen:
			mask[i] = completion[i-promptLen]
		}
	}
	if assistantOnly {
		for _, r := range untrained {
			for i := r[0]; i < r[1]; i++ {
				mask[i] = 0
			}
		}
	}
	return ids, mask, nil
}
