package chat

import (
	"encoding/json"
	"fmt"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// tokenizerJSON is the part of Hugging Face tokenizer.json we read.
type tokenizerJSON struct {
	AddedTokens  []jsonAddedToken `json:"added_tokens"`
	Normalizer   json.RawMessage  `json:"normalizer"`
	PreTokenizer json.RawMessage  `json:"pre_tokenizer"`
	Decoder      json.RawMessage  `json:"decoder"`
	Model        struct {
		Type                    string            `json:"type"`
		Vocab                   map[string]int32  `json:"vocab"`
		Merges                  []json.RawMessage `json:"merges"`
		UnkToken                *string           `json:"unk_token"`
		ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
		FuseUnk                 bool              `json:"fuse_unk"`
		ByteFallback            bool              `json:"byte_fallback"`
		IgnoreMerges            bool              `json:"ignore_merges"`
	} `json:"model"`
}

// component is any typed tokenizer.json component.
type component struct {
	Type string `json:"type"`
	// Sequence members under their various keys.
	Normalizers   []json.RawMessage `json:"normalizers"`
	Pretokenizers []json.RawMessage `json:"pretokenizers"`
	Decoders      []json.RawMessage `json:"decoders"`
	// Split / Replace.
	Pattern  struct{ String, Regex *string } `json:"pattern"`
	Content  string                          `json:"content"`
	Behavior string                          `json:"behavior"`
	Invert   bool                            `json:"invert"`
	// ByteLevel.
	AddPrefixSpace *bool `json:"add_prefix_space"`
	UseRegex       *bool `json:"use_regex"`
	// Prepend, Strip, Digits, Metaspace.
	Prepend          string `json:"prepend"`
	Start            int    `json:"start"`
	Stop             int    `json:"stop"`
	IndividualDigits bool   `json:"individual_digits"`
	Replacement      string `json:"replacement"`
	PrependScheme    string `json:"prepend_scheme"`
	SplitMeta        *bool  `json:"split"`
}

// prependScheme is Metaspace's prepend_scheme, derived from the legacy
// add_prefix_space when absent (true or missing: "always").
func (c component) prependScheme() string {
	switch {
	case c.PrependScheme != "":
		return strings.ToLower(c.PrependScheme)
	case c.AddPrefixSpace == nil || *c.AddPrefixSpace:
		return "always"
	}
	return "never"
}

func parseTokenizerJSON(data []byte) (*Tokenizer, error) {
	var tj tokenizerJSON
	if err := json.Unmarshal(data, &tj); err != nil {
		return nil, fmt.Errorf("parse tokenizer.json: %w", err)
	}
	m := tj.Model
	if m.Type != "" && m.Type != "BPE" {
		return nil, fmt.Errorf("model.type %q is not supported (only BPE)", m.Type)
	}
	if m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "" ||
		m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "" {
		return nil, fmt.Errorf("model: continuing_subword_prefix/end_of_word_suffix are not supported")
	}
	merges, err := parseMerges(m.Merges)
	if err != nil {
		return nil, err
	}
	norm, err := buildNormalizer(tj.Normalizer)
	if err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	pre, preByteLevel, err := buildPreTokenizer(tj.PreTokenizer)
	if err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}
	dec, decByteLevel, err := buildDecoder(tj.Decoder)
	if err != nil {
		return nil, fmt.Errorf("decoder: %w", err)
	}
	model, err := newBPEModel(m.Vocab, merges, preByteLevel || decByteLevel)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	model.byteFallback, model.fuseUnk, model.ignoreMerges = m.ByteFallback, m.FuseUnk, m.IgnoreMerges
	if m.UnkToken != nil {
		if id, ok := m.Vocab[*m.UnkToken]; ok {
			model.unkID = id
		}
	}
	tok := &Tokenizer{model: model, idToToken: invertVocab(m.Vocab), normalizer: norm, preTokenizer: pre, decoder: dec}
	for _, a := range tj.AddedTokens {
		tok.added.add(a.token(), norm)
	}
	return tok, nil
}

// parseMerges accepts both merge encodings: "a b" and ["a", "b"].
func parseMerges(raw []json.RawMessage) ([][2]string, error) {
	out := make([][2]string, len(raw))
	for i, r := range raw {
		var s string
		if json.Unmarshal(r, &s) == nil {
			a, b, ok := strings.Cut(s, " ")
			if !ok {
				return nil, fmt.Errorf("model.merges[%d] = %q: want two tokens separated by a space", i, s)
			}
			out[i] = [2]string{a, b}
			continue
		}
		var pair []string
		if err := json.Unmarshal(r, &pair); err != nil || len(pair) != 2 {
			return nil, fmt.Errorf("model.merges[%d]: want \"a b\" or [\"a\", \"b\"]", i)
		}
		out[i] = [2]string{pair[0], pair[1]}
	}
	return out, nil
}

func isNull(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

func buildNormalizer(raw json.RawMessage) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	switch c.Type {
	case "NFC":
		return unicodeNormalizer{form: norm.NFC}, nil
	case "NFD":
		return unicodeNormalizer{form: norm.NFD}, nil
	case "NFKC":
		return unicodeNormalizer{form: norm.NFKC}, nil
	case "NFKD":
		return unicodeNormalizer{form: norm.NFKD}, nil
	case "Lowercase":
		return lowercaseNormalizer{}, nil
	case "Prepend":
		return prependNormalizer{prepend: c.Prepend}, nil
	case "Replace":
		if c.Pattern.String == nil {
			return nil, fmt.Errorf("Replace with a Regex pattern is not supported")
		}
		return replaceNormalizer{old: *c.Pattern.String, new: c.Content}, nil
	case "Sequence":
		var seq normalizerSequence
		for i, r := range c.Normalizers {
			n, err := buildNormalizer(r)
			if err != nil {
				return nil, fmt.Errorf("normalizers[%d]: %w", i, err)
			}
			if n != nil {
				seq = append(seq, n)
			}
		}
		return seq, nil
	}
	return nil, fmt.Errorf("type %q is not supported", c.Type)
}

// buildPreTokenizer also reports whether a ByteLevel step is present, which
// makes the BPE model work on bytes.
func buildPreTokenizer(raw json.RawMessage) (preTokenizer, bool, error) {
	if isNull(raw) {
		return nil, false, nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, false, err
	}
	switch c.Type {
	case "ByteLevel":
		b := byteLevelPreTokenizer{addPrefixSpace: c.AddPrefixSpace == nil || *c.AddPrefixSpace}
		if c.UseRegex == nil || *c.UseRegex {
			b.split = &familySplitter{gpt2: true}
		}
		if b.split == nil && !b.addPrefixSpace {
			return nil, true, nil // only maps bytes, which the BPE model does
		}
		return b, true, nil
	case "Split":
		return buildSplit(c)
	case "Digits":
		return digitsPreTokenizer{individual: c.IndividualDigits}, false, nil
	case "Metaspace":
		m := metaspacePreTokenizer{replacement: c.Replacement, prepend: c.prependScheme(), split: c.SplitMeta == nil || *c.SplitMeta}
		return m, false, nil
	case "Sequence":
		var seq preTokenizerSequence
		byteLevel := false
		for i, r := range c.Pretokenizers {
			p, bl, err := buildPreTokenizer(r)
			if err != nil {
				return nil, false, fmt.Errorf("pretokenizers[%d]: %w", i, err)
			}
			byteLevel = byteLevel || bl
			if p != nil {
				seq = append(seq, p)
			}
		}
		if len(seq) == 1 {
			return seq[0], byteLevel, nil
		}
		return seq, byteLevel, nil
	}
	return nil, false, fmt.Errorf("type %q is not supported", c.Type)
}

func buildSplit(c component) (preTokenizer, bool, error) {
	if c.Invert {
		return nil, false, fmt.Errorf("Split with invert=true is not supported")
	}
	behaviors := map[string]splitBehavior{
		"Isolated": splitIsolated, "Removed": splitRemoved,
		"MergedWithPrevious": splitMergedWithPrevious, "MergedWithNext": splitMergedWithNext,
		"Contiguous": splitContiguous,
	}
	b, ok := behaviors[c.Behavior]
	if !ok {
		return nil, false, fmt.Errorf("Split behavior %q is not supported", c.Behavior)
	}
	sp := splitPreTokenizer{behavior: b}
	switch {
	case c.Pattern.String != nil:
		sp.literal = *c.Pattern.String
	case c.Pattern.Regex != nil:
		s, err := newSplitter(*c.Pattern.Regex)
		if err != nil {
			return nil, false, err
		}
		sp.split = s
	default:
		return nil, false, fmt.Errorf("Split needs a String or Regex pattern")
	}
	return sp, false, nil
}

// buildDecoder also reports whether a ByteLevel step is present.
func buildDecoder(raw json.RawMessage) (decoder, bool, error) {
	if isNull(raw) {
		return nil, false, nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, false, err
	}
	switch c.Type {
	case "ByteLevel":
		return newByteLevelDecoder(), true, nil
	case "Replace":
		if c.Pattern.String == nil {
			return nil, false, fmt.Errorf("Replace with a Regex pattern is not supported")
		}
		return replaceDecoder{old: *c.Pattern.String, new: c.Content}, false, nil
	case "ByteFallback":
		return byteFallbackDecoder{}, false, nil
	case "Fuse":
		return fuseDecoder{}, false, nil
	case "Strip":
		return stripDecoder{content: c.Content, start: c.Start, stop: c.Stop}, false, nil
	case "Metaspace":
		return metaspaceDecoder{replacement: c.Replacement, stripFirst: c.prependScheme() != "never"}, false, nil
	case "Sequence":
		var seq decoderSequence
		byteLevel := false
		for i, r := range c.Decoders {
			d, bl, err := buildDecoder(r)
			if err != nil {
				return nil, false, fmt.Errorf("decoders[%d]: %w", i, err)
			}
			byteLevel = byteLevel || bl
			seq = append(seq, d)
		}
		return seq, byteLevel, nil
	}
	return nil, false, fmt.Errorf("type %q is not supported", c.Type)
}
