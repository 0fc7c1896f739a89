package chat

import (
	"strings"
)

// Tokenizer encodes and decodes text exactly as the Hugging Face tokenizer
// it was loaded from (encode with add_special_tokens=False). It is safe for
// concurrent use.
type Tokenizer struct {
	model        *bpeModel
	idToToken    []string // index: id; "" where the id is unused
	added        addedVocab
	normalizer   normalizer   // nil: none
	preTokenizer preTokenizer // nil: the whole segment is one piece
	decoder      decoder      // nil: concatenate token strings

	special        SpecialTokens
	specialStrings map[string]string // bos_token, eos_token, ... as chat templates see them
	chatTemplates  map[string]string // "default", "tool_use", ...
	cleanUpSpaces  bool              // tokenizer_config clean_up_tokenization_spaces
}

// SpecialTokens are the ids a rollout needs to stop generation and pad
// batches. An id is -1 when the tokenizer has no such token.
type SpecialTokens struct {
	BOS, EOS, PAD, UNK int32
	// EndOfTurn lists every id that ends an assistant turn: EOS, the
	// generation config's eos_token_id list, and known end-of-turn tokens
	// such as <|im_end|>, <|eot_id|>, <|eom_id|>, <|end|>, <end_of_turn>.
	EndOfTurn []int32
}

// Encode tokenizes s: added tokens are cut out first (never split by BPE),
// then each remaining segment is normalized, pre-tokenized and BPE-merged.
// No BOS/EOS is added; chat templates write those themselves.
func (t *Tokenizer) Encode(s string) []int32 {
	ids := make([]int32, 0, len(s)/3+1)
	first := true
	t.added.raw.split(s, func(seg string, tok *AddedToken) {
		if tok != nil {
			ids = append(ids, tok.ID)
		} else {
			ids = t.encodeSegment(ids, seg, first)
		}
		first = false
	})
	return ids
}

// encodeSegment normalizes a segment, cuts out the added tokens flagged
// normalized (matched against the normalized text, as tokenizers does),
// and tokenizes the rest.
func (t *Tokenizer) encodeSegment(ids []int32, seg string, first bool) []int32 {
	if t.normalizer != nil {
		seg = t.normalizer.normalize(seg)
	}
	t.added.normalized.split(seg, func(piece string, tok *AddedToken) {
		if tok != nil {
			ids = append(ids, tok.ID)
		} else {
			ids = t.tokenizePiece(ids, piece, first)
		}
		first = false
	})
	return ids
}

func (t *Tokenizer) tokenizePiece(ids []int32, piece string, first bool) []int32 {
	if t.preTokenizer == nil {
		return t.model.tokenize(ids, piece)
	}
	t.preTokenizer.preTokenize(piece, first, func(p string) {
		if p != "" {
			ids = t.model.tokenize(ids, p)
		}
	})
	return ids
}

// Decode turns ids back into text. With skipSpecial, added tokens flagged
// special are left out (Hugging Face's skip_special_tokens). Ids outside the
// vocabulary are ignored.
func (t *Tokenizer) Decode(ids []int32, skipSpecial bool) string {
	tokens := make([]string, 0, len(ids))
	for _, id := range ids {
		if skipSpecial {
			if a, ok := t.added.byID[id]; ok && a.Special {
				continue
			}
		}
		if tok, ok := t.Token(id); ok {
			tokens = append(tokens, tok)
		}
	}
	if t.decoder == nil {
		return strings.Join(tokens, " ") // what tokenizers does without a decoder
	}
	return strings.Join(t.decoder.decodeChain(tokens), "")
}

// DecodeLikeTransformers is Decode followed by transformers'
// clean_up_tokenization when tokenizer_config.json sets
// clean_up_tokenization_spaces (" ." becomes ".", " n't" becomes "n't", …),
// which is what tokenizer.decode() returns in Python. Use Decode for
// parsing model output: the clean-up can change JSON inside tool calls.
func (t *Tokenizer) DecodeLikeTransformers(ids []int32, skipSpecial bool) string {
	text := t.Decode(ids, skipSpecial)
	if !t.cleanUpSpaces {
		return text
	}
	for _, r := range [...][2]string{{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
		{" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}} {
		text = strings.ReplaceAll(text, r[0], r[1])
	}
	return text
}

// Token returns the vocabulary string of id.
func (t *Tokenizer) Token(id int32) (string, bool) {
	if a, ok := t.added.byID[id]; ok {
		return a.Content, true
	}
	if id < 0 || int(id) >= len(t.idToToken) || t.idToToken[id] == "" {
		return "", false
	}
	return t.idToToken[id], true
}

// TokenID returns the id of a vocabulary or added token string.
func (t *Tokenizer) TokenID(token string) (int32, bool) {
	if a, ok := t.added.byContent[token]; ok {
		return a.ID, true
	}
	id, ok := t.model.vocab[token]
	return id, ok
}

// VocabSize is one more than the largest token id (model plus added
// tokens); the model's embedding matrix may be larger.
func (t *Tokenizer) VocabSize() int {
	n := len(t.idToToken)
	for id := range t.added.byID {
		if int(id) >= n {
			n = int(id) + 1
		}
	}
	return n
}

// Special returns the tokenizer's special token ids.
func (t *Tokenizer) Special() SpecialTokens {
	s := t.special
	s.EndOfTurn = append([]int32(nil), s.EndOfTurn...)
	return s
}

// IsSpecial reports whether id is an added token flagged special.
func (t *Tokenizer) IsSpecial(id int32) bool {
	a, ok := t.added.byID[id]
	return ok && a.Special
}

// ChatTemplate returns the named chat template ("" or "default" for the
// main one; "tool_use" where the model ships one) and whether it exists.
func (t *Tokenizer) ChatTemplate(name string) (string, bool) {
	if name == "" {
		name = "default"
	}
	src, ok := t.chatTemplates[name]
	return src, ok
}

// StreamDecoder decodes a growing list of ids into text increments, never
// emitting half of a UTF-8 character: bytes of an incomplete character are
// held back until the ids completing it arrive. It follows tokenizers'
// DecodeStream, keeping a short window of ids so decoders that depend on
// the previous token (leading-space stripping) see the same context.
type StreamDecoder struct {
	tok         *Tokenizer
	skipSpecial bool
	ids         []int32 // the window
	prefix      string  // decoding of ids[:prefixIndex]
	prefixIndex int
}

// NewStreamDecoder starts a stream.
func (t *Tokenizer) NewStreamDecoder(skipSpecial bool) *StreamDecoder {
	return &StreamDecoder{tok: t, skipSpecial: skipSpecial}
}

// Next adds ids and returns the newly completed text ("" while a character
// is still incomplete).
func (d *StreamDecoder) Next(ids ...int32) string {
	var out strings.Builder
	for _, id := range ids {
		out.WriteString(d.step(id))
	}
	return out.String()
}

func (d *StreamDecoder) step(id int32) string {
	if d.prefix == "" && len(d.ids) > 0 {
		if p := d.tok.Decode(d.ids, d.skipSpecial); !strings.HasSuffix(p, "\uFFFD") {
			d.prefix, d.prefixIndex = p, len(d.ids)
		}
	}
	d.ids = append(d.ids, id)
	text := d.tok.Decode(d.ids, d.skipSpecial)
	if len(text) <= len(d.prefix) || strings.HasSuffix(text, "\uFFFD") {
		return ""
	}
	// A decoder may rewrite the window's start; emit what follows the
	// common part so no text is lost or repeated.
	newText := text[commonPrefixLen(text, d.prefix):]
	window := len(d.ids) - d.prefixIndex
	d.ids = append([]int32(nil), d.ids[d.prefixIndex:]...)
	d.prefix = d.tok.Decode(d.ids, d.skipSpecial)
	d.prefixIndex = window
	return newText
}

func commonPrefixLen(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}
