// Package sft is supervised fine-tuning: chat data in TRL's dataset forms,
// tokenized by the same chat pipeline rollouts use (so what SFT trains is
// token for token what GRPO later samples), batched into the trainer's
// optimizer step (train.BatchSource) with TRL's SFTConfig semantics.
package sft

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/ortrain/ortrain/internal/chat"
)

// Example is one dataset row: a conversation (messages, or prompt then
// completion messages) with the tools its assistant may call, or plain
// prompt and completion text.
type Example struct {
	Line int // 1-based line in the file
	// Messages is the conversation; for the prompt-completion form,
	// PromptLen messages are the prompt.
	Messages  []chat.Message
	PromptLen int
	Tools     []chat.Tool
	// PromptText and CompletionText are set for plain-text
	// prompt-completion rows (Messages is empty then).
	PromptText, CompletionText string
}

// Completion reports whether the row is in the prompt-completion form.
func (e Example) Completion() bool { return e.PromptLen > 0 || e.CompletionText != "" }

// RowError is a dataset row that cannot be used: the file, the line, the
// field and what is wrong with it.
type RowError struct {
	File   string
	Line   int
	Field  string // JSON path within the row, such as messages[2].tool_call_id
	Reason string
	Err    error // the cause, when another package reported it
}

func (e *RowError) Unwrap() error { return e.Err }

func (e *RowError) Error() string {
	loc := fmt.Sprintf("%s:%d", e.File, e.Line)
	if e.Field != "" {
		return fmt.Sprintf("%s: %s: %s", loc, e.Field, e.Reason)
	}
	return fmt.Sprintf("%s: %s", loc, e.Reason)
}

// ErrEmptyData: the file holds no rows.
var ErrEmptyData = errors.New("no rows")

// ReadOptions say what to do with rows that cannot be used.
type ReadOptions struct {
	// SkipBad skips rows that fail to parse or validate (each is returned
	// in Skipped) instead of stopping at the first.
	SkipBad bool
}

// Dataset is a file's usable rows and the rows skipped.
type Dataset struct {
	File     string
	Examples []Example
	Skipped  []*RowError
}

// maxLine bounds one JSONL line (long multi-turn conversations fit).
const maxLine = 64 << 20

// ReadFile reads a JSONL dataset.
func ReadFile(path string, opts ReadOptions) (*Dataset, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("sft data: %w", err)
	}
	defer f.Close()
	return Read(f, path, opts)
}

// Read reads JSONL rows from r; name is the file name used in errors.
func Read(r io.Reader, name string, opts ReadOptions) (*Dataset, error) {
	ds := &Dataset{File: name}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), maxLine)
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		ex, rerr := parseRow(b)
		if rerr != nil {
			rerr.File, rerr.Line = name, line
			if !opts.SkipBad {
				return nil, rerr
			}
			ds.Skipped = append(ds.Skipped, rerr)
			continue
		}
		ex.Line = line
		ds.Examples = append(ds.Examples, ex)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: line %d: %w", name, line+1, err)
	}
	if len(ds.Examples) == 0 {
		if len(ds.Skipped) > 0 {
			return nil, fmt.Errorf("%s: %w: all %d rows were skipped (first: %v)", name, ErrEmptyData, len(ds.Skipped), ds.Skipped[0])
		}
		return nil, fmt.Errorf("%s: %w: the file is empty (one JSON object per line expected)", name, ErrEmptyData)
	}
	return ds, nil
}

// wireRow is a row as written: TRL's conversational and prompt-completion
// forms (unknown keys, such as reward or task_id, are ignored).
type wireRow struct {
	Messages   json.RawMessage `json:"messages"`
	Prompt     json.RawMessage `json:"prompt"`
	Completion json.RawMessage `json:"completion"`
	Tools      json.RawMessage `json:"tools"`
	Text       json.RawMessage `json:"text"`
}

type wireMessage struct {
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	ReasoningContent string          `json:"reasoning_content"`
	ToolCalls        []wireToolCall  `json:"tool_calls"`
	Name             string          `json:"name"`
	ToolCallID       string          `json:"tool_call_id"`
}

type wireToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
	// Some datasets write the call flat.
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

type wireTool struct {
	Type     string `json:"type"`
	Function *struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"function"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
}

func rowErr(field, format string, args ...any) *RowError {
	return &RowError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

func parseRow(b []byte) (Example, *RowError) {
	var ex Example
	if b[0] != '{' {
		return ex, rowErr("", "not a JSON object (the file must be JSONL: one object per line)")
	}
	var w wireRow
	if err := json.Unmarshal(b, &w); err != nil {
		return ex, rowErr("", "invalid JSON: %v", err)
	}
	tools, rerr := parseTools(w.Tools)
	if rerr != nil {
		return ex, rerr
	}
	ex.Tools = tools
	switch {
	case present(w.Messages):
		msgs, rerr := parseMessages("messages", w.Messages)
		if rerr != nil {
			return ex, rerr
		}
		ex.Messages = msgs
	case present(w.Prompt) || present(w.Completion):
		if !present(w.Prompt) || !present(w.Completion) {
			return ex, rowErr("completion", "a prompt-completion row needs both prompt and completion")
		}
		var ps, cs string
		if json.Unmarshal(w.Prompt, &ps) == nil {
			if json.Unmarshal(w.Completion, &cs) != nil {
				return ex, rowErr("completion", "a string, as the prompt is")
			}
			if cs == "" {
				return ex, rowErr("completion", "empty: nothing to train on")
			}
			ex.PromptText, ex.CompletionText = ps, cs
			return ex, nil
		}
		prompt, rerr := parseMessages("prompt", w.Prompt)
		if rerr != nil {
			return ex, rerr
		}
		completion, rerr := parseMessages("completion", w.Completion)
		if rerr != nil {
			return ex, rerr
		}
		ex.Messages, ex.PromptLen = append(prompt, completion...), len(prompt)
	case present(w.Text):
		return ex, rowErr("text", "the language-modelling form is not supported: use messages, or prompt and completion")
	default:
		return ex, rowErr("messages", "missing: a row needs messages (conversational) or prompt and completion")
	}
	return ex, checkConversation(ex)
}

func present(r json.RawMessage) bool { return len(r) > 0 && string(r) != "null" }

func parseMessages(field string, raw json.RawMessage) ([]chat.Message, *RowError) {
	var wms []wireMessage
	if err := json.Unmarshal(raw, &wms); err != nil {
		return nil, rowErr(field, "a list of messages ({\"role\", \"content\"}): %v", err)
	}
	if len(wms) == 0 {
		return nil, rowErr(field, "empty")
	}
	out := make([]chat.Message, len(wms))
	for i, wm := range wms {
		f := fmt.Sprintf("%s[%d]", field, i)
		m := chat.Message{Role: wm.Role, ReasoningContent: wm.ReasoningContent, Name: wm.Name, ToolCallID: wm.ToolCallID}
		switch wm.Role {
		case "system", "user", "assistant", "tool":
		default:
			return nil, rowErr(f+".role", "%q: one of system, user, assistant, tool", wm.Role)
		}
		text, null, err := contentText(wm.Content)
		if err != nil {
			return nil, rowErr(f+".content", "%v", err)
		}
		m.Content, m.NullContent = text, null
		if len(wm.ToolCalls) > 0 && wm.Role != "assistant" {
			return nil, rowErr(f+".tool_calls", "only assistant messages call tools (this one is %s)", wm.Role)
		}
		for j, tc := range wm.ToolCalls {
			call, err := toolCall(tc)
			if err != nil {
				return nil, rowErr(fmt.Sprintf("%s.tool_calls[%d]", f, j), "%v", err)
			}
			m.ToolCalls = append(m.ToolCalls, call)
		}
		out[i] = m
	}
	return out, nil
}

// contentText is a message's content as text: a string, null, or a list of
// {"type": "text", "text": …} blocks.
func contentText(raw json.RawMessage) (text string, null bool, err error) {
	if !present(raw) {
		return "", true, nil
	}
	if json.Unmarshal(raw, &text) == nil {
		return text, false, nil
	}
	var blocks []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &blocks) != nil {
		return "", false, errors.New("a string or a list of {\"type\": \"text\", \"text\": …} blocks")
	}
	var sb strings.Builder
	for i, b := range blocks {
		if b.Type != "text" {
			return "", false, fmt.Errorf("block %d has type %q: only text blocks are supported", i, b.Type)
		}
		sb.WriteString(b.Text)
	}
	return sb.String(), false, nil
}

func toolCall(tc wireToolCall) (chat.ToolCall, error) {
	name, args := tc.Function.Name, tc.Function.Arguments
	if name == "" {
		name, args = tc.Name, tc.Arguments
	}
	if name == "" {
		return chat.ToolCall{}, errors.New("function.name is missing")
	}
	if !present(args) {
		args = json.RawMessage("{}")
	}
	// OpenAI writes arguments as a JSON string holding the object; the
	// templates render the object.
	var s string
	if json.Unmarshal(args, &s) == nil {
		if !json.Valid([]byte(s)) {
			return chat.ToolCall{}, fmt.Errorf("function.arguments is a string that is not JSON: %q", s)
		}
		args = json.RawMessage(s)
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(args, &obj) != nil {
		return chat.ToolCall{}, fmt.Errorf("function.arguments must be a JSON object, got %s", args)
	}
	return chat.ToolCall{ID: tc.ID, Name: name, Arguments: args}, nil
}

func parseTools(raw json.RawMessage) ([]chat.Tool, *RowError) {
	if !present(raw) {
		return nil, nil
	}
	var wts []wireTool
	if err := json.Unmarshal(raw, &wts); err != nil {
		return nil, rowErr("tools", "a list of function specs ({\"type\": \"function\", \"function\": {…}}): %v", err)
	}
	out := make([]chat.Tool, len(wts))
	for i, wt := range wts {
		t := chat.Tool{Name: wt.Name, Description: wt.Description, Parameters: wt.Parameters}
		if wt.Function != nil {
			t = chat.Tool{Name: wt.Function.Name, Description: wt.Function.Description, Parameters: wt.Function.Parameters}
		}
		if t.Name == "" {
			return nil, rowErr(fmt.Sprintf("tools[%d].function.name", i), "missing")
		}
		if string(t.Parameters) == "null" {
			t.Parameters = nil
		}
		out[i] = t
	}
	return out, nil
}

// checkConversation checks the turn structure: something to train on, and
// every tool message answering a call of the assistant turn before it.
func checkConversation(ex Example) *RowError {
	field := "messages"
	if ex.PromptLen > 0 {
		field = "completion"
	}
	first := -1
	for i, m := range ex.Messages {
		if m.Role == "assistant" && i >= ex.PromptLen {
			first = i
			break
		}
	}
	if first < 0 {
		return rowErr(field, "no assistant message to train on")
	}
	if first == 0 {
		return rowErr(field+"[0]", "the conversation starts with the assistant: a prompt (a user message) must come first")
	}
	var open map[string]bool // ids of the calls the last assistant turn made
	var names map[string]bool
	for i, m := range ex.Messages {
		switch m.Role {
		case "assistant":
			open, names = map[string]bool{}, map[string]bool{}
			for _, c := range m.ToolCalls {
				open[c.ID] = true
				names[c.Name] = true
			}
		case "tool":
			f := fmt.Sprintf("messages[%d]", i)
			switch {
			case open == nil || len(names) == 0:
				return rowErr(f, "a tool message with no tool call before it (the assistant turn before it calls no tool)")
			case m.ToolCallID != "" && !open[m.ToolCallID]:
				return rowErr(f+".tool_call_id", "%q matches no call of the assistant turn before it", m.ToolCallID)
			case m.ToolCallID == "" && m.Name != "" && !names[m.Name]:
				return rowErr(f+".name", "%q matches no call of the assistant turn before it", m.Name)
			}
		default:
			open, names = nil, nil
		}
	}
	return nil
}
