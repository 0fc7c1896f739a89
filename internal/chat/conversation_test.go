package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var weatherTools = []Tool{
	{Name: "get_weather", Description: "Current weather in a city.",
		Parameters: json.RawMessage(`{"type": "object", "properties": {"city": {"type": "string", "description": "City name"}}, "required": ["city"]}`)},
	{Name: "get_time", Description: "Local time in a city.",
		Parameters: json.RawMessage(`{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}`)},
}

// scriptedTurns is a 3-turn tool-using conversation: two parallel calls,
// then one call with text before it, then a final answer.
func scriptedTurns(withReasoning bool) []Message {
	turns := []Message{
		{Role: "assistant", ToolCalls: []ToolCall{
			{Name: "get_weather", Arguments: json.RawMessage(`{"city": "Paris"}`)},
			{Name: "get_time", Arguments: json.RawMessage(`{"city": "Paris"}`)},
		}},
		{Role: "assistant", Content: "Paris is sunny. Checking Tokyo too.", ToolCalls: []ToolCall{
			{Name: "get_weather", Arguments: json.RawMessage(`{"city": "東京"}`)},
		}},
		{Role: "assistant", Content: "Paris: 22°C, sunny, 14:05.\nTokyo: rain."},
	}
	if withReasoning {
		turns[0].ReasoningContent = "I need weather and time."
		turns[1].ReasoningContent = "Now Tokyo."
		turns[2].ReasoningContent = "Summarise."
	}
	return turns
}

var scriptedResults = [][]ToolResult{
	{{Name: "get_weather", Content: `{"temp_c": 22, "sky": "sunny"}`}, {Name: "get_time", Content: "14:05"}},
	{{Name: "get_weather", Content: `{"temp_c": 17, "sky": "rain"}`}},
}

// canonicalSample returns the ids a model would sample if it wrote exactly
// what the template renders for msg: the text after the last assistant
// header up to and including <|im_end|>, minus glue the prompt already has.
func canonicalSample(t *testing.T, c *Conversation, msg Message) []int32 {
	t.Helper()
	full, err := c.tmpl.Render(append(c.Messages(), msg), c.tools, false, c.kwargs)
	require.NoError(t, err)
	const header = "<|im_start|>assistant\n"
	text := full[strings.LastIndex(full, header)+len(header):]
	text = text[:strings.Index(text, "<|im_end|>")+len("<|im_end|>")]
	held := c.tok.Decode(c.IDs(), false)
	const emptyThink = "<think>\n\n</think>\n\n"
	if strings.HasSuffix(held, emptyThink) {
		text = strings.TrimPrefix(text, emptyThink)
	}
	return c.tok.Encode(text)
}

// runScript plays the scripted conversation and returns it with the mask
// the test expects (1 exactly on sampled ids).
func runScript(t *testing.T, tok *Tokenizer, tmpl *Template, kwargs map[string]any, withReasoning bool, policy HistoryPolicy) (*Conversation, []int8) {
	t.Helper()
	c, err := NewConversation(tok, tmpl, "Weather and time in Paris, then Tokyo?", ConversationOptions{
		System: "You are a helpful assistant.", Tools: weatherTools, Kwargs: kwargs, Policy: policy,
	})
	require.NoError(t, err)
	require.Equal(t, FormatHermes, c.Format())
	var wantMask []int8
	for i, turn := range scriptedTurns(withReasoning) {
		sampled := canonicalSample(t, c, turn)
		msg, err := c.AppendSampled(sampled)
		require.NoError(t, err)
		wantMask = append(wantMask, ones(len(sampled))...)
		require.Len(t, msg.ToolCalls, len(turn.ToolCalls), "turn %d", i)
		for j, call := range turn.ToolCalls {
			assert.Equal(t, call.Name, msg.ToolCalls[j].Name)
			assert.JSONEq(t, string(call.Arguments), string(msg.ToolCalls[j].Arguments))
		}
		assert.Equal(t, turn.Content, msg.Content)
		assert.Equal(t, turn.ReasoningContent, msg.ReasoningContent)
		if i == len(scriptedResults) {
			break
		}
		results := scriptedResults[i]
		for j := range results {
			results[j].ToolCallID = msg.ToolCalls[j].ID
		}
		before := len(c.IDs())
		next, err := c.AppendToolResults(results)
		require.NoError(t, err)
		assert.Equal(t, c.IDs(), next)
		wantMask = append(wantMask, make([]int8, len(next)-before)...)
		suffix := tok.Decode(next[before:], false)
		assert.True(t, strings.HasPrefix(suffix, "\n<|im_start|>user\n<tool_response>\n"), "suffix %q", suffix)
		assert.Contains(t, suffix, results[0].Content)
	}
	return c, wantMask
}

func ones(n int) []int8 {
	out := make([]int8, n)
	for i := range out {
		out[i] = 1
	}
	return out
}

// fullRenderingIDs tokenizes the whole conversation as the template renders
// it, ending at the final <|im_end|> the model sampled.
func fullRenderingIDs(t *testing.T, c *Conversation) (string, []int32) {
	t.Helper()
	text, err := c.tmpl.Render(c.Messages(), c.tools, false, c.kwargs)
	require.NoError(t, err)
	text = strings.TrimSuffix(text, "\n")
	return text, c.tok.Encode(text)
}

func TestConversationQwen25MatchesFullRendering(t *testing.T) {
	tok := loadFixture(t, "qwen2.5")
	tmpl, err := tok.Template("")
	require.NoError(t, err)
	c, wantMask := runScript(t, tok, tmpl, nil, false, RequireExact)

	_, full := fullRenderingIDs(t, c)
	assert.Equal(t, full, c.IDs(), "assembled ids equal the tokenization of the full rendering")
	assert.Empty(t, c.Divergences())
	assert.Equal(t, wantMask, c.LossMask())
	assert.Len(t, c.CompletionIDs(), len(c.LossMask()))
	assert.Equal(t, c.IDs(), append(c.PromptIDs(), c.CompletionIDs()...))
	imEnd, _ := tok.TokenID("<|im_end|>")
	assert.Equal(t, imEnd, c.CompletionIDs()[len(c.CompletionIDs())-1])
	assert.Equal(t, int8(1), c.LossMask()[len(c.LossMask())-1], "the sampled end-of-turn token is trained")
}

func TestConversationQwen3ThinkingMatchesFullRendering(t *testing.T) {
	tok := loadFixture(t, "qwen3")
	for _, name := range []string{"chat_template.jinja", "chat_template.2025-04-original.jinja"} {
		t.Run(name, func(t *testing.T) {
			tmpl := qwen3Template(t, tok, name)
			c, wantMask := runScript(t, tok, tmpl, map[string]any{"enable_thinking": true}, true, RequireExact)
			_, full := fullRenderingIDs(t, c)
			assert.Equal(t, full, c.IDs())
			assert.Empty(t, c.Divergences())
			assert.Equal(t, wantMask, c.LossMask())
		})
	}
}

func qwen3Template(t *testing.T, tok *Tokenizer, name string) *Template {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("../../testdata/chat-templates/qwen3", name))
	require.NoError(t, err)
	tmpl, err := NewTemplate(string(src), tok.SpecialStrings(), nil)
	require.NoError(t, err)
	return tmpl
}

// With enable_thinking=false the generation prompt carries an empty
// <think></think> block that Qwen3 drops from earlier turns on re-render:
// the template is not prefix-preserving by design. KeepSampled keeps the
// held tokens, records the divergence, and the result differs from the
// full rendering exactly by those dropped blocks.
func TestConversationQwen3NoThinkingDiffersOnlyByDroppedThinkBlocks(t *testing.T) {
	tok := loadFixture(t, "qwen3")
	tmpl := qwen3Template(t, tok, "chat_template.jinja")
	kwargs := map[string]any{"enable_thinking": false}
	c, wantMask := runScript(t, tok, tmpl, kwargs, false, KeepSampled)
	assert.Equal(t, wantMask, c.LossMask())

	// Each tool turn finds the template rewrote the previous assistant
	// turn; from the second on, the held history (with the first turn's
	// block) also differs from the re-rendered one.
	var got []string
	for _, d := range c.Divergences() {
		got = append(got, fmt.Sprintf("%d %s", d.Turn, d.Kind))
		assert.Contains(t, d.Held, "<think>\n\n</think>")
		assert.NotContains(t, d.Rendered, "<think>")
	}
	assert.Equal(t, []string{"0 template not prefix-preserving", "1 template not prefix-preserving", "1 history re-rendered differently"}, got)

	fullText, _ := fullRenderingIDs(t, c)
	held := tok.Decode(c.IDs(), false)
	const glue = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
	assert.Equal(t, 3, strings.Count(held, glue))
	lastGlue := strings.LastIndex(held, glue)
	undone := strings.ReplaceAll(held[:lastGlue], glue, "<|im_start|>assistant\n") + held[lastGlue:]
	assert.Equal(t, fullText, undone, "the only difference is the empty think blocks of earlier turns")

	// The same conversation under RequireExact is refused at the first tool turn.
	strict, err := NewConversation(tok, tmpl, "Weather?", ConversationOptions{Tools: weatherTools, Kwargs: kwargs, Policy: RequireExact})
	require.NoError(t, err)
	_, err = strict.AppendSampled(canonicalSample(t, strict, scriptedTurns(false)[0]))
	require.NoError(t, err)
	_, err = strict.AppendToolResults(scriptedResults[0])
	var divErr *DivergenceError
	require.True(t, errors.As(err, &divErr), "got %v", err)
	assert.Equal(t, NotPrefixPreserving, divErr.Kind)
}

// A model that writes compact JSON samples other tokens than the template
// would render; the sampled ids are kept and the divergence is recorded.
func TestConversationKeepsNonCanonicalSample(t *testing.T) {
	tok := loadFixture(t, "qwen2.5")
	tmpl, err := tok.Template("")
	require.NoError(t, err)
	c, err := NewConversation(tok, tmpl, "Weather in Paris?", ConversationOptions{Tools: weatherTools})
	require.NoError(t, err)
	sampled := tok.Encode("<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call><|im_end|>")
	msg, err := c.AppendSampled(sampled)
	require.NoError(t, err)
	require.Len(t, msg.ToolCalls, 1)
	prompt := c.PromptIDs()
	next, err := c.AppendToolResults([]ToolResult{{Name: "get_weather", Content: "sunny"}})
	require.NoError(t, err)
	assert.Equal(t, append(append(prompt, sampled...), next[len(prompt)+len(sampled):]...), next)
	assert.Equal(t, sampled, next[len(prompt):len(prompt)+len(sampled)], "sampled ids kept verbatim")
	assert.Equal(t, "\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
		tok.Decode(next[len(prompt)+len(sampled):], false))
	divs := c.Divergences()
	require.Len(t, divs, 1)
	assert.Equal(t, HistoryRerendered, divs[0].Kind)
}

func TestConversationRefusesTruncatedTurn(t *testing.T) {
	tok := loadFixture(t, "qwen2.5")
	tmpl, err := tok.Template("")
	require.NoError(t, err)
	c, err := NewConversation(tok, tmpl, "Hi", ConversationOptions{Tools: weatherTools})
	require.NoError(t, err)
	msg, err := c.AppendSampled(tok.Encode("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa"))
	var tcErr *ToolCallError
	require.True(t, errors.As(err, &tcErr), "the cut-off call is reported, got %v", err)
	assert.Empty(t, msg.ToolCalls)
	assert.Len(t, c.Messages(), 2, "the turn is kept")
	_, err = c.AppendToolResults([]ToolResult{{Name: "get_weather", Content: "x"}})
	assert.ErrorIs(t, err, ErrTurnNotEnded)
}

// TestConversationTypesAndReportsCalls: sampled calls are typed by the
// schemas of ParseTools (or Tools), and each malformed or violating call
// comes back as a *ToolCallError with an ID a tool turn can answer.
func TestConversationTypesAndReportsCalls(t *testing.T) {
	tok := loadFixture(t, "qwen2.5")
	tmpl, err := tok.Template("")
	require.NoError(t, err)
	xml := FormatQwenXML
	sampled := "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n</function>\n" +
		"<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n{oops}\n</tool_call><|im_end|>"
	for _, tc := range []struct {
		name string
		opts ConversationOptions
	}{
		{"schemas of the rendered tools", ConversationOptions{Tools: weatherTools, Format: &xml}},
		{"schemas of hidden tools", ConversationOptions{ParseTools: weatherTools, Format: &xml}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewConversation(tok, tmpl, "Weather?", tc.opts)
			require.NoError(t, err)
			msg, err := c.AppendSampled(tok.Encode(sampled))
			require.Len(t, msg.ToolCalls, 1)
			assert.JSONEq(t, `{"city": "42"}`, string(msg.ToolCalls[0].Arguments), "a string parameter stays a string")
			assert.Equal(t, "call00000", msg.ToolCalls[0].ID)
			var errs ToolCallErrors
			require.ErrorAs(t, err, &errs)
			require.Len(t, errs, 2)
			assert.Equal(t, SchemaViolation, errs[0].Kind)
			assert.Equal(t, "get_time", errs[0].Name)
			assert.Contains(t, errs[0].Reason, `missing required parameter "city"`)
			assert.Equal(t, Malformed, errs[1].Kind)
			assert.Equal(t, []string{"call00001", "call00002"}, []string{errs[0].ID, errs[1].ID})
		})
	}
}
