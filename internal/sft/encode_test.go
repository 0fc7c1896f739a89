package sft_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/sft"
)

// tinyChat is the byte-level tokenizer and Qwen2.5-style template of the
// tiny preset (what the CPU demo trains).
func tinyChat(t *testing.T) (*chat.Tokenizer, *chat.Template) {
	t.Helper()
	dir := t.TempDir()
	preset, ok := model.PresetByName("tiny")
	require.True(t, ok)
	require.NoError(t, model.InitOverwrite(dir, preset, 1))
	tok, err := chat.LoadTokenizer(dir)
	require.NoError(t, err)
	tmpl, err := tok.Template("")
	require.NoError(t, err)
	return tok, tmpl
}

func readOne(t *testing.T, row string) sft.Example {
	t.Helper()
	ds, err := sft.Read(strings.NewReader(row), "d.jsonl", sft.ReadOptions{})
	require.NoError(t, err)
	return ds.Examples[0]
}

// runs splits a mask into its runs of 1s: [start, end) pairs.
func runs(mask []uint8) [][2]int {
	var out [][2]int
	for i := 0; i < len(mask); i++ {
		if mask[i] == 1 {
			j := i
			for j < len(mask) && mask[j] == 1 {
				j++
			}
			out = append(out, [2]int{i, j})
			i = j
		}
	}
	return out
}

// TestEncodeIsWhatARolloutHolds: the encoded row is token for token the
// conversation a rollout assembles when the model samples the same turns
// (AppendSampled, then the tool results rendered between turns), and the
// sampled turns parse back into the row's tool calls.
func TestEncodeIsWhatARolloutHolds(t *testing.T) {
	tok, tmpl := tinyChat(t)
	ex := readOne(t, goodRow)
	enc := &sft.Encoder{Tokenizer: tok, Template: tmpl, System: "Be brief.", AssistantOnly: true, MaxLength: 4096}
	e, err := enc.Encode(ex)
	require.NoError(t, err)
	require.False(t, e.Truncated)
	row := e.Row

	turns := runs(row.LossMask)
	require.Len(t, turns, 2, "two assistant turns are trained")
	comp := row.Tokens[row.PromptLen:]

	conv, err := chat.NewConversation(tok, tmpl, "Open it.", chat.ConversationOptions{System: "Be brief.", Tools: ex.Tools, Policy: chat.RequireExact})
	require.NoError(t, err)
	require.Equal(t, conv.IDs(), row.Tokens[:len(conv.IDs())], "the prompt is the rollout's prompt")
	msg, err := conv.AppendSampled(comp[turns[0][0]:turns[0][1]])
	require.NoError(t, err)
	require.Len(t, msg.ToolCalls, 1)
	assert.Equal(t, "open_envelope", msg.ToolCalls[0].Name)
	_, err = conv.AppendToolResults([]chat.ToolResult{{ToolCallID: msg.ToolCalls[0].ID, Name: "open_envelope", Content: "code: 482"}})
	require.NoError(t, err)
	msg, err = conv.AppendSampled(comp[turns[1][0]:turns[1][1]])
	require.NoError(t, err)
	require.Len(t, msg.ToolCalls, 1)
	assert.Equal(t, "unlock", msg.ToolCalls[0].Name)
	assert.JSONEq(t, `{"code":"482"}`, string(msg.ToolCalls[0].Arguments))
	assert.Equal(t, conv.IDs(), row.Tokens, "token for token the rollout's conversation")
	mask := conv.LossMask()
	for i := range mask {
		assert.Equal(t, uint8(mask[i]), row.LossMask[len(row.LossMask)-len(mask)+i], "mask at %d", i)
	}

	// What is trained: the calls and the end-of-turn token; never the tool
	// output, the system prompt or the user's words.
	var trained strings.Builder
	for _, r := range turns {
		trained.WriteString(tok.Decode(comp[r[0]:r[1]], false))
	}
	assert.Contains(t, trained.String(), `"name": "unlock"`)
	assert.Equal(t, 2, strings.Count(trained.String(), "<|im_end|>"))
	assert.NotContains(t, trained.String(), "code: 482")
	assert.NotContains(t, trained.String(), "Open it.")
	assert.NotContains(t, trained.String(), "Be brief.")
}

func TestEncodeLossScopes(t *testing.T) {
	tok, tmpl := tinyChat(t)
	count := func(mask []uint8) (n int) {
		for _, m := range mask {
			n += int(m)
		}
		return n
	}
	conv := readOne(t, goodRow)
	pc := readOne(t, `{"prompt":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hey"},{"role":"user","content":"Bye"}],"completion":[{"role":"assistant","content":"Ciao"}]}`)
	txt := readOne(t, `{"prompt":"2+2=","completion":"4"}`)

	all := &sft.Encoder{Tokenizer: tok, Template: tmpl, MaxLength: 4096}
	only := &sft.Encoder{Tokenizer: tok, Template: tmpl, MaxLength: 4096, AssistantOnly: true, CompletionOnly: true}

	e, err := all.Encode(conv)
	require.NoError(t, err)
	assert.Equal(t, len(e.Row.Tokens)-1, count(e.Row.LossMask), "without assistant_only_loss every token after the first")

	e, err = only.Encode(pc)
	require.NoError(t, err)
	turns := runs(e.Row.LossMask)
	require.Len(t, turns, 1, "the prompt's assistant turn is not trained")
	comp := e.Row.Tokens[e.Row.PromptLen:]
	assert.Equal(t, "Ciao<|im_end|>", tok.Decode(comp[turns[0][0]:turns[0][1]], false))

	e, err = only.Encode(txt)
	require.NoError(t, err)
	assert.Equal(t, "4<|im_end|>", tok.Decode(e.Row.Tokens[e.Row.PromptLen:], false), "the completion and EOS")
	assert.Equal(t, "2+2=", tok.Decode(e.Row.Tokens[:e.Row.PromptLen], false))
}

func TestEncodeMaxLength(t *testing.T) {
	tok, tmpl := tinyChat(t)
	ex := readOne(t, goodRow)
	full, err := (&sft.Encoder{Tokenizer: tok, Template: tmpl, AssistantOnly: true, MaxLength: 4096}).Encode(ex)
	require.NoError(t, err)
	firstTurnEnd := full.Row.PromptLen + runs(full.Row.LossMask)[0][1]

	cut, err := (&sft.Encoder{Tokenizer: tok, Template: tmpl, AssistantOnly: true, MaxLength: firstTurnEnd + 5}).Encode(ex)
	require.NoError(t, err)
	assert.True(t, cut.Truncated)
	assert.Equal(t, len(full.Row.Tokens), cut.Tokens)
	assert.Len(t, cut.Row.Tokens, firstTurnEnd+5)
	assert.Equal(t, full.Row.Tokens[:firstTurnEnd+5], cut.Row.Tokens, "keep_start")

	_, err = (&sft.Encoder{Tokenizer: tok, Template: tmpl, AssistantOnly: true, MaxLength: firstTurnEnd + 5, Refuse: true}).Encode(ex)
	var re *sft.RowError
	require.ErrorAs(t, err, &re)

	_, err = (&sft.Encoder{Tokenizer: tok, Template: tmpl, AssistantOnly: true, MaxLength: full.Row.PromptLen}).Encode(ex)
	require.ErrorAs(t, err, &re, "nothing trained within max_length is an error")
}

// TestEncodeRefusesCallsTheTemplateDrops: a template that renders no tool
// calls would train the model to answer with empty turns.
func TestEncodeRefusesCallsTheTemplateDrops(t *testing.T) {
	tok, _ := tinyChat(t)
	plain, err := chat.NewTemplate(`{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}`, tok.SpecialStrings(), time.Now)
	require.NoError(t, err)
	hermes := chat.FormatHermes
	enc := &sft.Encoder{Tokenizer: tok, Template: plain, Format: &hermes, AssistantOnly: true, MaxLength: 4096}
	_, err = enc.Encode(readOne(t, goodRow))
	var re *sft.RowError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, "messages[1]", re.Field)
	var tre *chat.TurnRenderError
	require.ErrorAs(t, err, &tre, "the chat pipeline's typed error is kept")
	assert.Equal(t, 0, tre.Turn)

	// Plain assistant text renders fine with it.
	_, err = enc.Encode(readOne(t, `{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello"}]}`))
	require.NoError(t, err)
}
