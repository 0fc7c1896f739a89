package model

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"strconv"
)

//go:embed chat_template.jinja
var chatTemplate string

// ChatTemplate returns the ChatML tool-calling template written into every
// initialised model's tokenizer_config.json. It is the Qwen2.5-Instruct
// chat template, byte for byte (Apache-2.0, Qwen team; sha256
// cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f, the
// "chat_template" of Qwen/Qwen2.5-7B-Instruct tokenizer_config.json). Using
// it verbatim keeps the chat renderer checked against known-good output.
func ChatTemplate() string { return chatTemplate }

// Special token strings of the byte-level tokenizer.
const (
	TokenEndOfText = "<|endoftext|>"
	TokenIMStart   = "<|im_start|>"
	TokenIMEnd     = "<|im_end|>"
)

// AddedToken is one entry of tokenizer.json's added_tokens.
type AddedToken struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// ByteTokenizerAddedTokens are the added tokens after the 256 byte symbols,
// in id order, marked special the way Qwen marks them: the control tokens
// are special (skipped when decoding with skip_special_tokens), the
// tool-call and thinking tags are not (they stay visible to parsers).
func ByteTokenizerAddedTokens() []AddedToken {
	names := []struct {
		content string
		special bool
	}{
		{TokenEndOfText, true}, {TokenIMStart, true}, {TokenIMEnd, true},
		{"<tool_call>", false}, {"</tool_call>", false},
		{"<tool_response>", false}, {"</tool_response>", false},
		{"<think>", false}, {"</think>", false},
	}
	out := make([]AddedToken, len(names))
	for i, n := range names {
		out[i] = AddedToken{ID: 256 + i, Content: n.content, Special: n.special}
	}
	return out
}

// ByteTokenizerSize is the number of ids the byte-level tokenizer uses: 256
// byte symbols plus the added tokens.
func ByteTokenizerSize() int { return 256 + len(ByteTokenizerAddedTokens()) }

// byteTokenID returns the id of an added token of the byte tokenizer.
func byteTokenID(content string) int {
	for _, t := range ByteTokenizerAddedTokens() {
		if t.Content == content {
			return t.ID
		}
	}
	panic("model: unknown byte tokenizer token " + content)
}

// ByteToUnicode returns GPT-2's byte-to-symbol table: printable Latin-1
// bytes map to themselves, the other 68 bytes to U+0100 upwards. The
// returned order (printable bytes first) is also GPT-2's and Qwen's id order
// for the first 256 vocabulary entries.
func ByteToUnicode() (bytes []byte, symbols []rune) {
	printable := func(b int) bool {
		return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
	}
	for b := 0; b < 256; b++ {
		if printable(b) {
			bytes = append(bytes, byte(b))
			symbols = append(symbols, rune(b))
		}
	}
	n := 0
	for b := 0; b < 256; b++ {
		if !printable(b) {
			bytes = append(bytes, byte(b))
			symbols = append(symbols, rune(256+n))
			n++
		}
	}
	return bytes, symbols
}

// qwen2PreTokenizerRegex is the Split pattern of Qwen2/2.5/3 tokenizer.json.
const qwen2PreTokenizerRegex = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// ByteTokenizerJSON builds the tokenizer.json document of the byte-level
// tokenizer in the HF tokenizers format, laid out like Qwen's: a BPE model
// whose vocabulary is the 256 byte symbols with no merges (so every byte is
// one token), Qwen's Split regex followed by ByteLevel as pre-tokenizer,
// ByteLevel post-processor and decoder, and Qwen2's NFC normalizer: the
// tokenizer_config.json names Qwen2Tokenizer, which transformers (5.x)
// normalizes to NFC whatever tokenizer.json says, so the file declares it
// and ortrain (which follows the file) splits text as transformers and vLLM
// do. Keys and vocabulary entries are in the order the tokenizers library
// writes them.
func ByteTokenizerJSON() json.Marshaler {
	_, symbols := ByteToUnicode()
	vocab := make(orderedObject, len(symbols))
	for id, r := range symbols {
		vocab[id] = member{string(r), id}
	}
	byteLevel := orderedObject{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}
	return orderedObject{
		{"version", "1.0"},
		{"truncation", nil},
		{"padding", nil},
		{"added_tokens", ByteTokenizerAddedTokens()},
		{"normalizer", orderedObject{{"type", "NFC"}}},
		{"pre_tokenizer", orderedObject{
			{"type", "Sequence"},
			{"pretokenizers", []any{
				orderedObject{{"type", "Split"}, {"pattern", orderedObject{{"Regex", qwen2PreTokenizerRegex}}}, {"behavior", "Isolated"}, {"invert", false}},
				byteLevel,
			}},
		}},
		{"post_processor", byteLevel},
		{"decoder", byteLevel},
		{"model", orderedObject{
			{"type", "BPE"},
			{"dropout", nil},
			{"unk_token", nil},
			{"continuing_subword_prefix", ""},
			{"end_of_word_suffix", ""},
			{"fuse_unk", false},
			{"byte_fallback", false},
			{"ignore_merges", false},
			{"vocab", vocab},
			{"merges", []any{}},
		}},
	}
}

// member is one key/value of an orderedObject.
type member struct {
	key   string
	value any
}

// orderedObject is a JSON object that keeps its keys in the given order.
type orderedObject []member

// MarshalJSON writes the members in order, without HTML escaping.
func (o orderedObject) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	buf.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			buf.WriteByte(',')
		}
		if err := enc.Encode(m.key); err != nil {
			return nil, err
		}
		buf.WriteByte(':')
		if err := enc.Encode(m.value); err != nil {
			return nil, fmt.Errorf("key %q: %w", m.key, err)
		}
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// ByteTokenizerConfigJSON builds tokenizer_config.json for the byte-level
// tokenizer, with the same keys Qwen2.5-Instruct's file has.
func ByteTokenizerConfigJSON(modelMaxLength int) map[string]any {
	decoder := map[string]any{}
	for _, t := range ByteTokenizerAddedTokens() {
		decoder[strconv.Itoa(t.ID)] = map[string]any{
			"content": t.Content, "lstrip": t.LStrip, "normalized": t.Normalized,
			"rstrip": t.RStrip, "single_word": t.SingleWord, "special": t.Special,
		}
	}
	return map[string]any{
		"add_bos_token":                false,
		"add_prefix_space":             false,
		"added_tokens_decoder":         decoder,
		"additional_special_tokens":    []string{TokenIMStart, TokenIMEnd},
		"bos_token":                    nil,
		"chat_template":                chatTemplate,
		"clean_up_tokenization_spaces": false,
		"eos_token":                    TokenIMEnd,
		"errors":                       "replace",
		"model_max_length":             modelMaxLength,
		"pad_token":                    TokenEndOfText,
		"split_special_tokens":         false,
		"tokenizer_class":              "Qwen2Tokenizer",
		"unk_token":                    nil,
	}
}
