package chat

import (
	"strings"
	"unicode/utf8"
)

// decoder is one tokenizers "decoder" step: it rewrites the list of token
// strings (decode_chain in Hugging Face tokenizers).
type decoder interface {
	decodeChain(tokens []string) []string
}

// byteLevelDecoder maps each token's GPT-2 characters back to bytes; a token
// with a character outside the table (an added token such as "ü") is kept as
// its own UTF-8 bytes. Invalid UTF-8 becomes U+FFFD like Rust's
// String::from_utf8_lossy.
type byteLevelDecoder struct{ runeToByte map[rune]byte }

func newByteLevelDecoder() byteLevelDecoder {
	table := byteToRune()
	m := make(map[rune]byte, 256)
	for b, r := range table {
		m[r] = byte(b)
	}
	return byteLevelDecoder{runeToByte: m}
}

func (d byteLevelDecoder) decodeChain(tokens []string) []string {
	var buf []byte
	for _, t := range tokens {
		buf = d.appendBytes(buf, t)
	}
	return []string{lossyUTF8(buf)}
}

func (d byteLevelDecoder) appendBytes(buf []byte, t string) []byte {
	start := len(buf)
	for _, r := range t {
		b, ok := d.runeToByte[r]
		if !ok {
			return append(buf[:start], t...)
		}
		buf = append(buf, b)
	}
	return buf
}

type replaceDecoder struct{ old, new string }

func (d replaceDecoder) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		out[i] = strings.ReplaceAll(t, d.old, d.new)
	}
	return out
}

// byteFallbackDecoder turns runs of <0xXX> tokens into text; a run that is
// not valid UTF-8 becomes one U+FFFD per byte, as in tokenizers.
type byteFallbackDecoder struct{}

func (byteFallbackDecoder) decodeChain(tokens []string) []string {
	out := make([]string, 0, len(tokens))
	var pending []byte
	flush := func() {
		if len(pending) == 0 {
			return
		}
		if utf8.Valid(pending) {
			out = append(out, string(pending))
		} else {
			for range pending {
				out = append(out, "\uFFFD")
			}
		}
		pending = pending[:0]
	}
	for _, t := range tokens {
		if b, ok := parseByteToken(t); ok {
			pending = append(pending, b)
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

// parseByteToken recognises SentencePiece byte tokens such as "<0x0A>".
func parseByteToken(t string) (byte, bool) {
	if len(t) != 6 || !strings.HasPrefix(t, "<0x") || t[5] != '>' {
		return 0, false
	}
	var v byte
	for _, c := range []byte(t[3:5]) {
		v <<= 4
		switch {
		case c >= '0' && c <= '9':
			v |= c - '0'
		case c >= 'A' && c <= 'F':
			v |= c - 'A' + 10
		case c >= 'a' && c <= 'f':
			v |= c - 'a' + 10
		default:
			return 0, false
		}
	}
	return v, true
}

type fuseDecoder struct{}

func (fuseDecoder) decodeChain(tokens []string) []string {
	return []string{strings.Join(tokens, "")}
}

// stripDecoder removes up to start leading and stop trailing copies of
// content from every token.
type stripDecoder struct {
	content     string
	start, stop int
}

func (d stripDecoder) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		for n := 0; n < d.start && strings.HasPrefix(t, d.content); n++ {
			t = t[len(d.content):]
		}
		for n := 0; n < d.stop && strings.HasSuffix(t, d.content); n++ {
			t = t[:len(t)-len(d.content)]
		}
		out[i] = t
	}
	return out
}

// metaspaceDecoder turns ▁ back into spaces; in the first token it drops
// them instead unless the prepend scheme is "never" (as tokenizers does).
type metaspaceDecoder struct {
	replacement string
	stripFirst  bool
}

func (d metaspaceDecoder) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		if i == 0 && d.stripFirst {
			out[i] = strings.ReplaceAll(t, d.replacement, "")
			continue
		}
		out[i] = strings.ReplaceAll(t, d.replacement, " ")
	}
	return out
}

type decoderSequence []decoder

func (seq decoderSequence) decodeChain(tokens []string) []string {
	for _, d := range seq {
		tokens = d.decodeChain(tokens)
	}
	return tokens
}

// lossyUTF8 converts bytes to a string the way Rust's from_utf8_lossy does:
// each maximal invalid prefix of a sequence becomes one U+FFFD.
func lossyUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r != utf8.RuneError || size > 1 {
			sb.Write(b[:size])
			b = b[size:]
			continue
		}
		b = b[invalidPrefixLen(b):]
		sb.WriteString("\uFFFD")
	}
	return sb.String()
}

// invalidPrefixLen is the length of the longest prefix of b that could still
// begin a valid UTF-8 sequence (at least 1): Rust reports it as one error.
func invalidPrefixLen(b []byte) int {
	lead := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case lead >= 0xC2 && lead <= 0xDF:
		need = 1
	case lead == 0xE0:
		need, lo = 2, 0xA0
	case lead >= 0xE1 && lead <= 0xEC, lead == 0xEE, lead == 0xEF:
		need = 2
	case lead == 0xED:
		need, hi = 2, 0x9F
	case lead == 0xF0:
		need, lo = 3, 0x90
	case lead >= 0xF1 && lead <= 0xF3:
		need = 3
	case lead == 0xF4:
		need, hi = 3, 0x8F
	default:
		return 1
	}
	n := 1
	for i := 1; i <= need && i < len(b); i++ {
		c := b[i]
		if i == 1 && (c < lo || c > hi) || i > 1 && (c < 0x80 || c > 0xBF) {
			break
		}
		n++
	}
	return n
}
