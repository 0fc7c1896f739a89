package chat

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// roundTripCalls are the calls rendered into an assistant turn: strings
// that look like numbers, booleans and null, a decimal string, nested
// objects, unicode and the hermes closing tag inside a string.
var roundTripCalls = []ToolCall{
	{ID: "call00001", Name: "probe", Arguments: json.RawMessage(`{"text": "42", "count": 3, "flag": true, "mode": "fast"}`)},
	{ID: "call00002", Name: "probe", Arguments: json.RawMessage(`{"text": "true", "ratio": 1.5, "opts": {"nested": {"a": [1, "x"], "b": null}}, "maybe": null}`)},
	{ID: "call00003", Name: "lookup", Arguments: json.RawMessage(`{"q": "a </tool_call> b ünï 世界 🦙 \"quoted\"", "n": "1.10", "none": "null", "tags": ["x", "y"]}`)},
}

var lookupTool = Tool{Name: "lookup", Description: "Look something up", Parameters: json.RawMessage(`{"type": "object", "properties": {
	"q": {"type": "string"}, "n": {"type": "string"}, "none": {"type": "string"}, "tags": {"type": "array"}}, "required": ["q"]}`)}

// TestToolCallRoundTrip renders an assistant turn with 1, 2 and 3 calls
// with every fixture template that has tools, parses the rendered turn
// with the detected format and the offered tools, and gets the same calls.
func TestToolCallRoundTrip(t *testing.T) {
	tools := []Tool{probeTool, lookupTool}
	special := map[string]string{"bos_token": "<s>", "eos_token": "</s>"}
	clock := func() time.Time { return time.Date(2024, 7, 26, 0, 0, 0, 0, time.UTC) }
	for path, format := range templateFormats {
		if format == FormatNone {
			continue
		}
		t.Run(path, func(t *testing.T) {
			tmpl, err := NewTemplate(readTemplateFixture(t, path), special, clock)
			require.NoError(t, err)
			detected, err := DetectToolCallFormat(tmpl.Source())
			require.NoError(t, err)
			// DeepSeek templates concatenate the arguments as a string.
			stringArgs := detected == FormatDeepSeekV3
			user := []Message{{Role: "user", Content: "Do it."}}
			prompt, err := tmpl.Render(user, tools, true, nil)
			require.NoError(t, err)
			for n := 1; n <= len(roundTripCalls); n++ {
				t.Run(fmt.Sprintf("%d calls", n), func(t *testing.T) {
					calls := append([]ToolCall(nil), roundTripCalls[:n]...)
					if stringArgs {
						for i := range calls {
							calls[i].Arguments = jsonString(string(calls[i].Arguments))
						}
					}
					// Templates differ on whether a turn of only calls has
					// content None (DeepSeek) or "" (Qwen3's first release
					// tests '</think>' in content); use the one that renders.
					asst := Message{Role: "assistant", ToolCalls: calls, NullContent: true}
					full, err := tmpl.Render(append(user, asst), tools, false, nil)
					if err != nil && strings.Contains(err.Error(), "NoneType") {
						asst.NullContent = false
						full, err = tmpl.Render(append(user, asst), tools, false, nil)
					}
					if detected == FormatLlama3JSON && n > 1 {
						// Llama 3.x templates refuse parallel calls.
						require.ErrorContains(t, err, "only supports single tool-calls")
						return
					}
					require.NoError(t, err)
					// The turn is what follows the text shared with the prompt
					// (generation prompts may open a <think> block the
					// rendered turn does not have).
					shared := 0
					for shared < len(prompt) && shared < len(full) && prompt[shared] == full[shared] {
						shared++
					}
					if open := strings.LastIndex(full[:shared], "<"); open > strings.LastIndex(full[:shared], ">") {
						shared = open // do not split a tag
					}
					require.Greater(t, shared, len(prompt)-len("<think>\n")-1, "the rendering extends the prompt")
					turn := full[shared:]
					parsed := ParseToolCallsFor(detected, turn, tools)
					require.NoError(t, parsed.Err(), "turn %q", turn)
					require.Len(t, parsed.Calls, n, "turn %q", turn)
					for i, got := range parsed.Calls {
						assert.Equal(t, roundTripCalls[i].Name, got.Name)
						assert.JSONEq(t, string(roundTripCalls[i].Arguments), string(got.Arguments), "turn %q", turn)
						if got.ID != "" {
							assert.Equal(t, roundTripCalls[i].ID, got.ID)
						}
					}
					assert.NotContains(t, parsed.Content, "probe", "no call text left in the content")
				})
			}
		})
	}
}
