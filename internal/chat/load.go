package chat

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// LoadOptions adjusts LoadTokenizerWith for directories that lack the
// information (vocab.json + merges.txt carry no pre-tokenizer).
type LoadOptions struct {
	// SplitPattern overrides the pre-tokenizer regex used with vocab.json +
	// merges.txt. Empty: PatternQwen2 when tokenizer_config.json names
	// Qwen2Tokenizer, otherwise PatternGPT2.
	SplitPattern string
}

// LoadTokenizer reads a Hugging Face model directory: tokenizer.json (or
// tokenizer.json.gz, or vocab.json + merges.txt), tokenizer_config.json,
// generation_config.json and chat_template.jinja, each where present.
func LoadTokenizer(modelDir string) (*Tokenizer, error) {
	return LoadTokenizerWith(modelDir, LoadOptions{})
}

// LoadTokenizerWith is LoadTokenizer with options.
func LoadTokenizerWith(modelDir string, opts LoadOptions) (*Tokenizer, error) {
	cfg, err := readTokenizerConfig(filepath.Join(modelDir, "tokenizer_config.json"))
	if err != nil {
		return nil, err
	}
	var tok *Tokenizer
	data, tjPath, err := readMaybeGzip(filepath.Join(modelDir, "tokenizer.json"))
	switch {
	case err == nil:
		tok, err = parseTokenizerJSON(data)
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", tjPath, err)
		}
	case errors.Is(err, os.ErrNotExist):
		tok, err = loadVocabMerges(modelDir, cfg, opts)
		if err != nil {
			return nil, err
		}
	default:
		return nil, err
	}
	for _, a := range cfg.addedTokens {
		tok.added.add(a, tok.normalizer)
	}
	tok.special = resolveSpecial(tok, cfg, readGenerationEOS(filepath.Join(modelDir, "generation_config.json")))
	tok.chatTemplates = cfg.chatTemplates
	if err := readChatTemplateJSON(filepath.Join(modelDir, "chat_template.json"), tok.chatTemplates); err != nil {
		return nil, err
	}
	tok.cleanUpSpaces = cfg.cleanUpSpaces
	tok.specialStrings = map[string]string{}
	for name, v := range map[string]string{"bos_token": cfg.bos, "eos_token": cfg.eos, "pad_token": cfg.pad, "unk_token": cfg.unk} {
		if v != "" {
			tok.specialStrings[name] = v
		}
	}
	if src, err := os.ReadFile(filepath.Join(modelDir, "chat_template.jinja")); err == nil {
		tok.chatTemplates["default"] = string(src)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read chat template: %w", err)
	}
	return tok, nil
}

// readChatTemplateJSON reads a processor-style chat_template.json
// ({"chat_template": …}), which takes precedence over tokenizer_config.json.
func readChatTemplateJSON(path string, into map[string]string) error {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read chat template: %w", err)
	}
	var raw struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("parse %s: %w", path, err)
	}
	if err := parseChatTemplateField(raw.ChatTemplate, into); err != nil {
		return fmt.Errorf("parse %s: chat_template: %w", path, err)
	}
	return nil
}

// readMaybeGzip reads path, or path+".gz" decompressed.
func readMaybeGzip(path string) ([]byte, string, error) {
	data, err := os.ReadFile(path)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return data, path, err
	}
	f, err := os.Open(path + ".gz")
	if err != nil {
		return nil, path, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, path + ".gz", fmt.Errorf("read %s.gz: %w", path, err)
	}
	data, err = io.ReadAll(zr)
	if err != nil {
		return nil, path + ".gz", fmt.Errorf("decompress %s.gz: %w", path, err)
	}
	return data, path + ".gz", nil
}

// tokenizerConfig is what we use from tokenizer_config.json.
type tokenizerConfig struct {
	class              string
	bos, eos, pad, unk string
	cleanUpSpaces      bool
	addedTokens        []AddedToken
	chatTemplates      map[string]string
}

func readTokenizerConfig(path string) (tokenizerConfig, error) {
	cfg := tokenizerConfig{chatTemplates: map[string]string{}}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return cfg, nil
	}
	if err != nil {
		return cfg, fmt.Errorf("read tokenizer config: %w", err)
	}
	var raw struct {
		Class        string                    `json:"tokenizer_class"`
		CleanUp      bool                      `json:"clean_up_tokenization_spaces"`
		BOS          json.RawMessage           `json:"bos_token"`
		EOS          json.RawMessage           `json:"eos_token"`
		PAD          json.RawMessage           `json:"pad_token"`
		UNK          json.RawMessage           `json:"unk_token"`
		Added        map[string]jsonAddedToken `json:"added_tokens_decoder"`
		ChatTemplate json.RawMessage           `json:"chat_template"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return cfg, fmt.Errorf("parse %s: %w", path, err)
	}
	cfg.class, cfg.cleanUpSpaces = raw.Class, raw.CleanUp
	cfg.bos, cfg.eos, cfg.pad, cfg.unk = tokenString(raw.BOS), tokenString(raw.EOS), tokenString(raw.PAD), tokenString(raw.UNK)
	for key, a := range raw.Added {
		var id int32
		if _, err := fmt.Sscanf(key, "%d", &id); err != nil {
			return cfg, fmt.Errorf("parse %s: added_tokens_decoder key %q is not an id", path, key)
		}
		a.ID = id
		cfg.addedTokens = append(cfg.addedTokens, a.token())
	}
	if err := parseChatTemplateField(raw.ChatTemplate, cfg.chatTemplates); err != nil {
		return cfg, fmt.Errorf("parse %s: chat_template: %w", path, err)
	}
	return cfg, nil
}

// tokenString reads a special token given as "text" or {"content": "text"}.
func tokenString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var obj struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil {
		return obj.Content
	}
	return ""
}

// parseChatTemplateField reads a template string or a list of named ones.
func parseChatTemplateField(raw json.RawMessage, into map[string]string) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		into["default"] = s
		return nil
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return fmt.Errorf("want a string or a list of {name, template}: %w", err)
	}
	for _, t := range list {
		into[t.Name] = t.Template
	}
	return nil
}

type jsonAddedToken struct {
	ID         int32  `json:"id"`
	Content    string `json:"content"`
	Special    bool   `json:"special"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
}

func (a jsonAddedToken) token() AddedToken {
	return AddedToken{ID: a.ID, Content: a.Content, Special: a.Special, LStrip: a.LStrip, RStrip: a.RStrip, Normalized: a.Normalized}
}

// readGenerationEOS reads eos_token_id (an id or a list) from
// generation_config.json; a missing or unreadable file gives none.
func readGenerationEOS(path string) []int32 {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var raw struct {
		EOS json.RawMessage `json:"eos_token_id"`
	}
	if json.Unmarshal(data, &raw) != nil {
		return nil
	}
	var one int32
	if json.Unmarshal(raw.EOS, &one) == nil {
		return []int32{one}
	}
	var many []int32
	_ = json.Unmarshal(raw.EOS, &many)
	return many
}

// endOfTurnTokens are end-of-turn markers of common chat formats.
var endOfTurnTokens = [...]string{"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>"}

func resolveSpecial(tok *Tokenizer, cfg tokenizerConfig, genEOS []int32) SpecialTokens {
	id := func(s string) int32 {
		if s == "" {
			return -1
		}
		if v, ok := tok.TokenID(s); ok {
			return v
		}
		return -1
	}
	sp := SpecialTokens{BOS: id(cfg.bos), EOS: id(cfg.eos), PAD: id(cfg.pad), UNK: id(cfg.unk)}
	seen := map[int32]bool{}
	addEOT := func(v int32) {
		if v >= 0 && !seen[v] {
			seen[v] = true
			sp.EndOfTurn = append(sp.EndOfTurn, v)
		}
	}
	addEOT(sp.EOS)
	for _, v := range genEOS {
		addEOT(v)
	}
	for _, s := range endOfTurnTokens {
		addEOT(id(s))
	}
	return sp
}

// loadVocabMerges builds a byte-level BPE tokenizer from vocab.json and
// merges.txt, as transformers' GPT2Tokenizer/Qwen2Tokenizer do.
func loadVocabMerges(dir string, cfg tokenizerConfig, opts LoadOptions) (*Tokenizer, error) {
	vocabPath := filepath.Join(dir, "vocab.json")
	data, err := os.ReadFile(vocabPath)
	if err != nil {
		return nil, &MissingTokenizerError{Dir: dir, Err: err}
	}
	var vocab map[string]int32
	if err := json.Unmarshal(data, &vocab); err != nil {
		return nil, fmt.Errorf("parse %s: %w", vocabPath, err)
	}
	merges, err := readMergesTxt(filepath.Join(dir, "merges.txt"))
	if err != nil {
		return nil, err
	}
	model, err := newBPEModel(vocab, merges, true)
	if err != nil {
		return nil, fmt.Errorf("build BPE from %s: %w", dir, err)
	}
	pattern := opts.SplitPattern
	var normStep normalizer
	if pattern == "" {
		pattern = PatternGPT2
		if cfg.class == "Qwen2Tokenizer" {
			pattern = PatternQwen2
		}
	}
	if pattern == PatternQwen2 {
		normStep = unicodeNormalizer{form: norm.NFC} // as Qwen2Tokenizer does
	}
	split, err := newSplitter(pattern)
	if err != nil {
		return nil, err
	}
	tok := &Tokenizer{
		model:        model,
		idToToken:    invertVocab(vocab),
		normalizer:   normStep,
		preTokenizer: splitPreTokenizer{split: split, behavior: splitIsolated},
		decoder:      newByteLevelDecoder(),
	}
	return tok, nil
}

func readMergesTxt(path string) ([][2]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read merges: %w", err)
	}
	var merges [][2]string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for line := 0; sc.Scan(); line++ {
		text := sc.Text()
		if line == 0 && strings.HasPrefix(text, "#version") || text == "" {
			continue
		}
		a, b, ok := strings.Cut(text, " ")
		if !ok {
			return nil, fmt.Errorf("%s line %d: want two tokens separated by a space, got %q", path, line+1, text)
		}
		merges = append(merges, [2]string{a, b})
	}
	return merges, sc.Err()
}

func invertVocab(vocab map[string]int32) []string {
	maxID := int32(-1)
	for _, id := range vocab {
		maxID = max(maxID, id)
	}
	out := make([]string, maxID+1)
	for s, id := range vocab {
		if id >= 0 {
			out[id] = s
		}
	}
	return out
}

// MissingTokenizerError: a model directory has no tokenizer (neither
// tokenizer.json nor vocab.json). Callers treat it as the user's fix.
type MissingTokenizerError struct {
	Dir string
	Err error
}

func (e *MissingTokenizerError) Error() string {
	return fmt.Sprintf("model directory %s has no tokenizer: neither tokenizer.json nor vocab.json (with merges.txt); copy the model's tokenizer files there "+
		"(`hf download ORG/NAME` fetches them with the weights)", e.Dir)
}

func (e *MissingTokenizerError) Unwrap() error { return e.Err }
