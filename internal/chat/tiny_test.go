package chat

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var tinySpecialTokens = []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
	"<tool_response>", "</tool_response>", "<think>", "</think>"}

// writeTinyModel writes the kind of byte-level tokenizer `ortrain
// init-model` ships: 256 byte tokens in GPT-2 byte-to-unicode form, no
// merges, added special tokens, and a ChatML tool template.
func writeTinyModel(t *testing.T, preTokenizer string) string {
	return writeByteModel(t, preTokenizer, tinySpecialTokens, "qwen2.5/chat_template.jinja", "<|im_end|>", "<|endoftext|>")
}

// writeByteModel writes a 256-byte-vocabulary model directory with the given
// special tokens (ids from 256), chat template and eos/pad tokens.
func writeByteModel(t *testing.T, preTokenizer string, specials []string, templatePath, eos, pad string) string {
	t.Helper()
	dir := t.TempDir()
	vocab := map[string]int{}
	table := byteToRune()
	for b := 0; b < 256; b++ {
		vocab[string(table[b])] = b
	}
	var added []map[string]any
	decoderCfg := map[string]any{}
	for i, s := range specials {
		added = append(added, map[string]any{"id": 256 + i, "content": s, "single_word": false,
			"lstrip": false, "rstrip": false, "normalized": false, "special": true})
		decoderCfg[strconv.Itoa(256+i)] = map[string]any{"content": s, "special": true}
	}
	var pre any
	switch preTokenizer {
	case "bytelevel":
		pre = map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
	case "split":
		pre = map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": PatternQwen2}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
		}}
	}
	tj := map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil, "added_tokens": added,
		"normalizer": nil, "pre_tokenizer": pre, "post_processor": nil,
		"decoder": map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": []any{}},
	}
	tmplSrc, err := os.ReadFile(filepath.Join("../../testdata/chat-templates", templatePath))
	require.NoError(t, err)
	cfg := map[string]any{"eos_token": eos, "pad_token": pad, "bos_token": nil,
		"added_tokens_decoder": decoderCfg, "chat_template": string(tmplSrc), "tokenizer_class": "PreTrainedTokenizerFast"}
	for name, v := range map[string]any{"tokenizer.json": tj, "tokenizer_config.json": cfg} {
		data, err := json.Marshal(v)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o644))
	}
	return dir
}

func TestTinyByteLevelTokenizer(t *testing.T) {
	for _, pre := range []string{"bytelevel", "split"} {
		t.Run(pre, func(t *testing.T) {
			tok, err := LoadTokenizer(writeTinyModel(t, pre))
			require.NoError(t, err)
			assert.Equal(t, 256+len(tinySpecialTokens), tok.VocabSize())
			text := "<|im_start|>user\nhé 世<|im_end|>"
			ids := tok.Encode(text)
			want := []int32{257}
			for _, b := range []byte("user\nhé 世") {
				want = append(want, int32(b))
			}
			assert.Equal(t, append(want, 258), ids)
			assert.Equal(t, text, tok.Decode(ids, false))
			assert.Equal(t, "user\nhé 世", tok.Decode(ids, true))
			sp := tok.Special()
			assert.Equal(t, int32(258), sp.EOS)
			assert.Equal(t, int32(256), sp.PAD)
			assert.Equal(t, []int32{258, 256}, sp.EndOfTurn)

			// The shipped template drives a token-exact tool conversation.
			tmpl, err := tok.Template("")
			require.NoError(t, err)
			c, err := NewConversation(tok, tmpl, "weather?", ConversationOptions{Tools: weatherTools, Policy: RequireExact})
			require.NoError(t, err)
			msg, err := c.AppendSampled(tok.Encode("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call><|im_end|>"))
			require.NoError(t, err)
			require.Len(t, msg.ToolCalls, 1)
			_, err = c.AppendToolResults([]ToolResult{{Name: "get_weather", Content: "cold"}})
			require.NoError(t, err)
			assert.Equal(t, "\n<|im_start|>user\n<tool_response>\ncold\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
				tok.Decode(c.CompletionIDs()[len(c.CompletionIDs())-countZerosAtEnd(c.LossMask()):], false))
		})
	}
}

func countZerosAtEnd(mask []int8) int {
	n := 0
	for i := len(mask) - 1; i >= 0 && mask[i] == 0; i-- {
		n++
	}
	return n
}

func TestLoadErrorsNameTheProblem(t *testing.T) {
	_, err := LoadTokenizer(t.TempDir())
	assert.ErrorContains(t, err, "neither tokenizer.json nor vocab.json")

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer.json"),
		[]byte(`{"model": {"type": "WordPiece", "vocab": {}}}`), 0o644))
	_, err = LoadTokenizer(dir)
	assert.ErrorContains(t, err, `model.type "WordPiece" is not supported`)

	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer.json"),
		[]byte(`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}}`), 0o644))
	_, err = LoadTokenizer(dir)
	assert.ErrorContains(t, err, `merge 0 ("a" "b"): token not in vocabulary`)
}

// A Llama 3.1 style model: JSON tool calls, results in the ipython role
// (rendered through tojson), <|eot_id|> ends turns.
func TestConversationLlama31ByteModel(t *testing.T) {
	specials := []string{"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
		"<|eot_id|>", "<|eom_id|>", "<|python_tag|>"}
	dir := writeByteModel(t, "split", specials, "llama.cpp/meta-llama-Llama-3.1-8B-Instruct.jinja", "<|eot_id|>", "<|end_of_text|>")
	tok, err := LoadTokenizer(dir)
	require.NoError(t, err)
	tmpl, err := tok.Template("")
	require.NoError(t, err)
	c, err := NewConversation(tok, tmpl, "Weather in Oslo?", ConversationOptions{Tools: weatherTools, Policy: RequireExact})
	require.NoError(t, err)
	assert.Equal(t, FormatLlama3JSON, c.Format())
	sampled := tok.Encode(`{"name": "get_weather", "parameters": {"city": "Oslo"}}<|eot_id|>`)
	msg, err := c.AppendSampled(sampled)
	require.NoError(t, err)
	require.Len(t, msg.ToolCalls, 1)
	assert.JSONEq(t, `{"city": "Oslo"}`, string(msg.ToolCalls[0].Arguments))
	before := len(c.IDs())
	next, err := c.AppendToolResults([]ToolResult{{Name: "get_weather", Content: "cold"}})
	require.NoError(t, err)
	assert.Equal(t, "<|start_header_id|>ipython<|end_header_id|>\n\n\"cold\"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
		tok.Decode(next[before:], false))
	final := tok.Encode("It is cold.<|eot_id|>")
	_, err = c.AppendSampled(final)
	require.NoError(t, err)

	full, err := tmpl.Render(c.Messages(), weatherTools, false, nil)
	require.NoError(t, err)
	assert.Equal(t, tok.Encode(full), c.IDs(), "token-exact against the full rendering")
	mask := c.LossMask()
	assert.Equal(t, len(sampled)+len(final), countOnes(mask))
	assert.Equal(t, ones(len(sampled)), mask[:len(sampled)])
	assert.Equal(t, ones(len(final)), mask[len(mask)-len(final):])
}

func countOnes(mask []int8) int {
	n := 0
	for _, m := range mask {
		n += int(m)
	}
	return n
}

func TestDecodeLikeTransformersCleanUp(t *testing.T) {
	dir := writeTinyModel(t, "bytelevel")
	tok, err := LoadTokenizer(dir)
	require.NoError(t, err)
	ids := tok.Encode("I do n't know , really .")
	assert.Equal(t, "I do n't know , really .", tok.DecodeLikeTransformers(ids, false), "flag off: unchanged")

	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	data, err := os.ReadFile(cfgPath)
	require.NoError(t, err)
	var cfg map[string]any
	require.NoError(t, json.Unmarshal(data, &cfg))
	cfg["clean_up_tokenization_spaces"] = true
	data, err = json.Marshal(cfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(cfgPath, data, 0o644))
	tok, err = LoadTokenizer(dir)
	require.NoError(t, err)
	assert.Equal(t, "I don't know, really.", tok.DecodeLikeTransformers(ids, false))
	assert.Equal(t, "I do n't know , really .", tok.Decode(ids, false))
}

// A Mistral Nemo style model: [TOOL_CALLS] JSON with model-written ids,
// [TOOL_RESULTS] answers, no generation prompt.
func TestConversationMistralByteModel(t *testing.T) {
	specials := []string{"<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
		"[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"}
	dir := writeByteModel(t, "bytelevel", specials, "llama.cpp/mistralai-Mistral-Nemo-Instruct-2407.jinja", "</s>", "<unk>")
	tok, err := LoadTokenizer(dir)
	require.NoError(t, err)
	tmpl, err := NewTemplate(mustTemplate(t, tok), map[string]string{"bos_token": "<s>", "eos_token": "</s>"}, nil)
	require.NoError(t, err)
	c, err := NewConversation(tok, tmpl, "Weather in Oslo?", ConversationOptions{Tools: weatherTools, Policy: RequireExact})
	require.NoError(t, err)
	assert.Equal(t, FormatMistral, c.Format())
	sampled := tok.Encode(`[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "a1b2c3d4e"}]</s>`)
	msg, err := c.AppendSampled(sampled)
	require.NoError(t, err)
	require.Len(t, msg.ToolCalls, 1)
	assert.Equal(t, "a1b2c3d4e", msg.ToolCalls[0].ID, "the model's call id is kept")
	before := len(c.IDs())
	next, err := c.AppendToolResults([]ToolResult{{ToolCallID: msg.ToolCalls[0].ID, Name: "get_weather", Content: "cold"}})
	require.NoError(t, err)
	assert.Equal(t, `[TOOL_RESULTS]{"content": cold, "call_id": "a1b2c3d4e"}[/TOOL_RESULTS]`, tok.Decode(next[before:], false))
	assert.Empty(t, c.Divergences())
}

func mustTemplate(t *testing.T, tok *Tokenizer) string {
	t.Helper()
	src, ok := tok.ChatTemplate("")
	require.True(t, ok)
	return src
}

// A Llama 2 / Mistral v0.3 style tokenizer.json: Metaspace pre-tokenizer
// (prepend_scheme first), BPE with byte fallback, Replace+ByteFallback+
// Fuse+Strip decoder.
func TestMetaspaceByteFallbackTokenizer(t *testing.T) {
	vocab := map[string]int{"<unk>": 0, "<s>": 1, "</s>": 2}
	for b := 0; b < 256; b++ {
		vocab[fmt.Sprintf("<0x%02X>", b)] = 3 + b
	}
	for _, tokStr := range []string{"▁", "H", "e", "l", "o", "w", "r", "d", "▁H", "ll", "▁He", "▁Hell", "▁Hello", "▁w", "or", "▁wor", "ld", "▁world"} {
		vocab[tokStr] = len(vocab)
	}
	merges := []string{"▁ H", "l l", "▁H e", "▁He ll", "▁Hell o", "▁ w", "o r", "▁w or", "l d", "▁wor ld"}
	tj := map[string]any{
		"added_tokens": []any{
			map[string]any{"id": 1, "content": "<s>", "special": true},
			map[string]any{"id": 2, "content": "</s>", "special": true},
		},
		"normalizer":    nil,
		"pre_tokenizer": map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false},
		"decoder": map[string]any{"type": "Sequence", "decoders": []any{
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": "▁"}, "content": " "},
			map[string]any{"type": "ByteFallback"}, map[string]any{"type": "Fuse"},
			map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0},
		}},
		"model": map[string]any{"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true, "vocab": vocab, "merges": merges},
	}
	dir := t.TempDir()
	data, err := json.Marshal(tj)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer.json"), data, 0o644))
	tok, err := LoadTokenizer(dir)
	require.NoError(t, err)

	id := func(s string) int32 { return int32(vocab[s]) }
	assert.Equal(t, []int32{id("▁Hello"), id("▁world")}, tok.Encode("Hello world"))
	assert.Equal(t, "Hello world", tok.Decode(tok.Encode("Hello world"), false))
	// After an added token the segment is not first: no ▁ is prepended;
	// "i" is not in the vocabulary and falls back to its byte.
	assert.Equal(t, []int32{1, id("H"), id("<0x69>")}, tok.Encode("<s>Hi"))
	ids := tok.Encode("Hé")
	assert.Equal(t, []int32{id("▁H"), id("<0xC3>"), id("<0xA9>")}, ids)
	assert.Equal(t, "Hé", tok.Decode(ids, false))
	assert.Equal(t, "H\uFFFD", tok.Decode(ids[:2], false), "a cut UTF-8 sequence decodes to U+FFFD per byte")
}

// chat_template.jinja beats chat_template.json, which beats
// tokenizer_config.json (transformers' order).
func TestChatTemplateSources(t *testing.T) {
	dir := writeTinyModel(t, "bytelevel")
	tok, err := LoadTokenizer(dir)
	require.NoError(t, err)
	assert.Contains(t, mustTemplate(t, tok), "<tool_call>", "from tokenizer_config.json")

	require.NoError(t, os.WriteFile(filepath.Join(dir, "chat_template.json"), []byte(`{"chat_template": "json {{ messages | length }}"}`), 0o644))
	tok, err = LoadTokenizer(dir)
	require.NoError(t, err)
	assert.Equal(t, "json {{ messages | length }}", mustTemplate(t, tok))

	require.NoError(t, os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte("jinja {{ messages | length }}\n"), 0o644))
	tok, err = LoadTokenizer(dir)
	require.NoError(t, err)
	tmpl, err := tok.Template("")
	require.NoError(t, err)
	out, err := tmpl.Render([]Message{{Role: "user", Content: "x"}}, nil, false, nil)
	require.NoError(t, err)
	assert.Equal(t, "jinja 1", out, "trailing newline dropped as jinja2 does")
}
