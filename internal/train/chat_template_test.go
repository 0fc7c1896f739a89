package train

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/model"
)

// signaturesTemplate is the compact template configs/lockbox.yaml uses.
const signaturesTemplate = "../../configs/templates/tool-signatures.jinja"

func tinyModelDir(t *testing.T) string {
	t.Helper()
	preset, ok := model.PresetByName("tiny")
	require.True(t, ok)
	dir := filepath.Join(t.TempDir(), "tiny")
	require.NoError(t, model.Init(dir, preset, 1))
	return dir
}

// TestLoadChatTemplatePath: chat.template_path replaces the model's
// template; the tool-signatures template renders each tool as one line,
// and a call the model writes in it parses back with the detected format.
func TestLoadChatTemplatePath(t *testing.T) {
	dir := tinyModelDir(t)
	own, err := LoadChat(dir, config.ChatConfig{ToolCallFormat: "auto", RenderTools: true})
	require.NoError(t, err)
	spec, err := LoadChat(dir, config.ChatConfig{ToolCallFormat: "auto", RenderTools: true, TemplatePath: signaturesTemplate})
	require.NoError(t, err)
	src, err := os.ReadFile(signaturesTemplate)
	require.NoError(t, err)
	assert.Equal(t, string(src), spec.Template.Source())
	assert.NotEqual(t, own.Template.Source(), spec.Template.Source())
	require.NotNil(t, spec.Format)
	assert.Equal(t, "hermes", spec.Format.String())

	tools := []chat.Tool{
		{Name: "open_envelope", Description: "Read the code.", Parameters: json.RawMessage(`{"type":"object","properties":{}}`)},
		{Name: "unlock", Description: "Try a code.", Parameters: json.RawMessage(
			`{"properties":{"code":{"type":"string"},"force":{"type":"boolean"},"note":{}},"required":["code"],"type":"object"}`)},
	}
	msgs := []chat.Message{
		{Role: "system", Content: "Use the tools."},
		{Role: "user", Content: "Open it."},
		{Role: "assistant", ToolCalls: []chat.ToolCall{{Name: "open_envelope", Arguments: json.RawMessage(`{}`)}}},
		{Role: "tool", Name: "open_envelope", Content: "code: 4"},
	}
	got, err := spec.Template.Render(msgs, tools, true, nil)
	require.NoError(t, err)
	assert.Equal(t, "<|im_start|>system\nUse the tools.\nTools:\n"+
		"open_envelope() Read the code.\n"+
		"unlock(code: string, force?: boolean, note?: any) Try a code.\n"+
		"Call: <tool_call>\n{\"name\": ..., \"arguments\": {...}}\n</tool_call><|im_end|>\n"+
		"<|im_start|>user\nOpen it.<|im_end|>\n"+
		"<|im_start|>assistant\n<tool_call>\n{\"name\": \"open_envelope\", \"arguments\": {}}\n</tool_call><|im_end|>\n"+
		"<|im_start|>user\n<tool_response>\ncode: 4\n</tool_response><|im_end|>\n"+
		"<|im_start|>assistant\n", got)

	// The turns themselves are Qwen2.5's: the same text as the model's own
	// template after the system turn.
	ownText, err := own.Template.Render(msgs, tools, true, nil)
	require.NoError(t, err)
	turns := got[len("<|im_start|>system\n"):]
	end := strings.Index(turns, "<|im_end|>\n")
	require.GreaterOrEqual(t, end, 0)
	turns = turns[end+len("<|im_end|>\n"):]
	assert.Contains(t, ownText, turns)

	_, calls, err := chat.ParseToolCalls(*spec.Format, "<tool_call>\n{\"name\": \"unlock\", \"arguments\": {\"code\": \"4\"}}\n</tool_call>")
	require.NoError(t, err)
	require.Len(t, calls, 1)
	assert.Equal(t, "unlock", calls[0].Name)
	assert.JSONEq(t, `{"code":"4"}`, string(calls[0].Arguments))
}

// TestLoadChatTemplatePathErrors: a missing or broken template file is a
// *config.FieldError naming chat.template_path.
func TestLoadChatTemplatePathErrors(t *testing.T) {
	dir := tinyModelDir(t)
	broken := filepath.Join(t.TempDir(), "broken.jinja")
	require.NoError(t, os.WriteFile(broken, []byte("{% if tools %}unclosed"), 0o644))
	for name, path := range map[string]string{
		"missing": filepath.Join(t.TempDir(), "nope.jinja"),
		"broken":  broken,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := LoadChat(dir, config.ChatConfig{ToolCallFormat: "auto", TemplatePath: path})
			var fe *config.FieldError
			require.ErrorAs(t, err, &fe)
			assert.Equal(t, "chat.template_path", fe.Field)
			assert.Equal(t, path, fe.Value)
		})
	}
}
