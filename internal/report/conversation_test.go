package report

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"html/template"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// block is one tracked element of a rendered trajectory (a message, a tool
// call, the end line) with its text, whitespace collapsed.
type block struct {
	Class, Text string
}

// trajBlocks parses the first rendered trajectory of html and returns its
// messages, tool calls and end line in document order. Text inside a tool
// call belongs to the call, not to the message around it.
func trajBlocks(t *testing.T, html string) []block {
	t.Helper()
	start := strings.Index(html, `<div class="traj `)
	require.NotEqual(t, -1, start, "no trajectory on the page")
	end := strings.Index(html[start:], "</details>")
	require.NotEqual(t, -1, end)
	dec := xml.NewDecoder(strings.NewReader(html[start : start+end]))
	dec.Strict, dec.AutoClose, dec.Entity = false, xml.HTMLAutoClose, xml.HTMLEntity
	var out []block
	var stack []int // per open element: the block its text goes to, -1 for none
	for {
		tok, err := dec.Token()
		if err != nil {
			break // the end of the fragment, or the group's closing tags
		}
		switch e := tok.(type) {
		case xml.StartElement:
			cur := -1
			if len(stack) > 0 {
				cur = stack[len(stack)-1]
			}
			for _, a := range e.Attr {
				if c := a.Value; a.Name.Local == "class" && (strings.HasPrefix(c, "msg") || c == "call" || c == "end") {
					out = append(out, block{Class: c})
					cur = len(out) - 1
				}
			}
			stack = append(stack, cur)
		case xml.EndElement:
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
		case xml.CharData:
			if len(stack) > 0 && stack[len(stack)-1] >= 0 {
				b := &out[stack[len(stack)-1]]
				b.Text = strings.Join(strings.Fields(b.Text+" "+string(e)), " ")
			}
		}
	}
	return out
}

// TestGenerateShowsMultiTurnConversation: a lockbox rollout of two turns
// renders as its turns in order (each call with its arguments, each result
// with its tool and reward), then the outcome; the env's text is escaped.
func TestGenerateShowsMultiTurnConversation(t *testing.T) {
	tests := []struct {
		name, result string
	}{
		{"plain result", "unlocked"},
		{"hostile result", `unlocked</pre><script>alert("x")</script>`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, manifestFile),
				[]byte(`{"model":"m","envs":[{"target":"builtin:lockbox","name":"lockbox","split":"train"}]}`), 0o644))
			writeJSONL(t, filepath.Join(dir, metricsFile), []map[string]any{{"step": 1, "reward": 1}})
			one := 1.0
			writeJSONL(t, filepath.Join(dir, trajectoriesFile), []map[string]any{{
				"step": 1, "env": 0, "split": "train", "task_index": 7, "prompt": "Open the lockbox.",
				"turns": []map[string]any{
					{"role": "assistant", "text": "Let me read the envelope.", "tool_calls": []map[string]any{{"name": "open_envelope", "arguments": json.RawMessage(`{}`)}}},
					{"role": "tool", "tool": "open_envelope", "text": "code: 482"},
					{"role": "assistant", "text": "The code is 482.", "tool_calls": []map[string]any{{"name": "unlock", "arguments": json.RawMessage(`{"code":"482"}`)}}},
					{"role": "tool", "tool": "unlock", "text": tt.result, "reward": one, "finished": true},
				},
				"rewards": []any{nil, one}, "reward": one, "advantage": 0, "outcome": "done",
				"tool_calls": 2, "prompt_tokens": 30, "completion_tokens": 40, "seconds": 1.5,
			}})

			var page bytes.Buffer
			require.NoError(t, Generate(context.Background(), dir, &page, Options{}))
			html := page.String()
			assert.Equal(t, []block{
				{"msg user", "prompt Open the lockbox."},
				{"msg assistant", "assistant · turn 1 Let me read the envelope."},
				{"call", "→ tool call open_envelope {}"},
				{"msg tool", "tool result · open_envelope code: 482"},
				{"msg assistant", "assistant · turn 2 The code is 482."},
				{"call", `→ tool call unlock {"code": "482"}`},
				{"msg tool", "tool result · unlock · reward 1 · finished " + tt.result},
				{"end", "end of rollout · outcome done · reward 1"},
			}, trajBlocks(t, html))
			assert.NotContains(t, html, "<script", "the env's text is escaped")
			assert.Contains(t, html, "<pre>"+template.HTMLEscapeString(tt.result)+"</pre>", "the result in its own <pre>")
		})
	}
}

func TestFormatArgs(t *testing.T) {
	long := `{"path":"/a/very/long/path/that/goes/on/and/on","content":"some text that makes the line long"}`
	tests := []struct {
		name, in, want string
	}{
		{"short object on one line", `{"code":"482"}`, `{"code": "482"}`},
		{"key order kept, numbers as written", `{"z":1.50,"a":[1, 2,{"b":null}],"t":true}`, `{"z": 1.50, "a": [1, 2, {"b": null}], "t": true}`},
		{"html escapes shown as written", `{"q":"\u003cb\u003e \u0026 \"x\""}`, `{"q": "<b> & \"x\""}`},
		{"long object indented", long, "{\n  \"path\": \"/a/very/long/path/that/goes/on/and/on\",\n  \"content\": \"some text that makes the line long\"\n}"},
		{"empty object", `{}`, `{}`},
		{"absent", ``, ``},
		{"null", `null`, ``},
		{"not JSON shown as is", `{"code": 48`, `{"code": 48`},
		{"trailing data shown as is", `{} {}`, `{} {}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, formatArgs(json.RawMessage(tt.in)))
		})
	}
}

// TestConversationLabels: text actions' observations, failed tool calls
// and unparsable calls are labelled as what they are.
func TestConversationLabels(t *testing.T) {
	tr := &trajectory{Turns: []turn{
		{Role: "assistant", Text: "<tool_call>{oops", FormatError: true},
		{Role: "tool", Error: "could not parse your tool call"},
		{Role: "assistant", Text: "north"},
		{Role: "user", Text: "You are in a maze."},
	}}
	var got []string
	for _, m := range conversation(tr) {
		got = append(got, m.Class+": "+m.Label)
	}
	assert.Equal(t, []string{"assistant: assistant · turn 1", "tool: tool result", "assistant: assistant · turn 2", "tool: env observation"}, got)
	assert.True(t, conversation(tr)[0].FormatError)
}
