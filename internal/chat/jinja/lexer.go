// Package jinja renders the subset of Jinja2 that Hugging Face chat
// templates use, with the exact output of transformers' apply_chat_template
// environment: trim_blocks, lstrip_blocks, loop controls, Python value
// semantics, and transformers' tojson (key order kept, no HTML escaping,
// Python separators).
package jinja

import (
	"fmt"
	"strings"
	"unicode"
)

// segmentKind says what a piece of template source is.
type segmentKind int

const (
	segText segmentKind = iota
	segVar
	segBlock
)

// segment is template text, or the inside of a {{ }} / {% %} tag.
type segment struct {
	kind segmentKind
	text string
	line int
}

// normalizeNewlines does what Jinja's lexer does to the source: every line
// break Python's str.splitlines knows becomes "\n", and one trailing
// newline is dropped (keep_trailing_newline=False).
func normalizeNewlines(src string) string {
	var b strings.Builder
	b.Grow(len(src))
	rs := []rune(src)
	for i := 0; i < len(rs); i++ {
		switch r := rs[i]; r {
		case '\r':
			if i+1 < len(rs) && rs[i+1] == '\n' {
				i++
			}
			b.WriteByte('\n')
		case '\n', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x85, 0x2028, 0x2029:
			b.WriteByte('\n')
		default:
			b.WriteRune(r)
		}
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// lex splits source into segments, applying Jinja's whitespace control:
// "-" on either side of a tag strips all adjacent whitespace, trim_blocks
// removes the newline after a block or comment tag, and lstrip_blocks
// removes spaces and tabs between a line start and a block or comment tag.
func lex(src string) ([]segment, error) {
	src = normalizeNewlines(src)
	var segs []segment
	lineStarting := true
	pos, line := 0, 1
	for pos < len(src) {
		start := indexTagStart(src, pos)
		if start < 0 {
			segs = append(segs, segment{kind: segText, text: src[pos:], line: line})
			break
		}
		text := src[pos:start]
		open := src[start : start+2]
		sign := byte(0)
		if start+2 < len(src) && (src[start+2] == '-' || src[start+2] == '+') {
			sign = src[start+2]
		}
		switch {
		case sign == '-':
			text = strings.TrimRightFunc(text, unicode.IsSpace)
		case sign != '+' && open != "{{":
			lpos := strings.LastIndexByte(text, '\n') + 1
			if (lpos > 0 || lineStarting) && strings.Trim(text[lpos:], " \t") == "" {
				text = text[:lpos]
			}
		}
		if text != "" {
			segs = append(segs, segment{kind: segText, text: text, line: line})
		}
		line += strings.Count(src[pos:start], "\n")
		bodyStart := start + 2
		if sign != 0 {
			bodyStart++
		}
		end, bodyEnd, stripAfter, err := findTagEnd(src, bodyStart, open)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		body := src[bodyStart:bodyEnd]
		line += strings.Count(src[start:end], "\n")
		switch open {
		case "{{":
			segs = append(segs, segment{kind: segVar, text: body, line: line})
		case "{%":
			segs = append(segs, segment{kind: segBlock, text: body, line: line})
		}
		pos = end
		switch {
		case stripAfter:
			rest := strings.TrimLeftFunc(src[pos:], unicode.IsSpace)
			line += strings.Count(src[pos:len(src)-len(rest)], "\n")
			pos = len(src) - len(rest)
		case open != "{{" && pos < len(src) && src[pos] == '\n':
			pos++ // trim_blocks
			line++
		}
		lineStarting = pos > 0 && src[pos-1] == '\n'
	}
	return segs, nil
}

func indexTagStart(src string, from int) int {
	for i := from; i+1 < len(src); i++ {
		if src[i] == '{' && (src[i+1] == '{' || src[i+1] == '%' || src[i+1] == '#') {
			return i
		}
	}
	return -1
}

// findTagEnd finds the close of a tag opened with open, skipping string
// literals and nested brackets. It returns the index after the closing
// delimiter, the end of the body, and whether the close was "-"-marked.
func findTagEnd(src string, from int, open string) (end, bodyEnd int, strip bool, err error) {
	if open == "{#" {
		i := strings.Index(src[from:], "#}")
		if i < 0 {
			return 0, 0, false, fmt.Errorf("unclosed comment")
		}
		bodyEnd = from + i
		return bodyEnd + 2, bodyEnd, bodyEnd > from && src[bodyEnd-1] == '-', nil
	}
	closeCh := byte('}')
	if open == "{%" {
		closeCh = '%'
	}
	depth := 0
	for i := from; i < len(src); i++ {
		c := src[i]
		switch {
		case c == '\'' || c == '"':
			j := i + 1
			for j < len(src) && src[j] != c {
				if src[j] == '\\' {
					j++
				}
				j++
			}
			i = j
		case c == '(' || c == '[' || c == '{':
			depth++
		case depth > 0 && (c == ')' || c == ']' || c == '}'):
			depth--
		case depth == 0 && c == closeCh && i+1 < len(src) && src[i+1] == '}':
			bodyEnd = i
			if i > from && (src[i-1] == '-' || src[i-1] == '+') {
				bodyEnd = i - 1
				strip = src[i-1] == '-'
			}
			return i + 2, bodyEnd, strip, nil
		}
	}
	return 0, 0, false, fmt.Errorf("unclosed %s tag", open)
}

// tokenKind classifies expression tokens.
type tokenKind int

const (
	tokName tokenKind = iota
	tokString
	tokInt
	tokFloat
	tokOp
	tokEOF
)

type token struct {
	kind tokenKind
	text string // name, operator, or decoded string literal
}

// tokenize splits a tag body into expression tokens.
func tokenize(s string) ([]token, error) {
	var toks []token
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '_' || c < 0x80 && unicode.IsLetter(rune(c)):
			j := i + 1
			for j < len(s) && (s[j] == '_' || s[j] < 0x80 && (unicode.IsLetter(rune(s[j])) || unicode.IsDigit(rune(s[j])))) {
				j++
			}
			toks = append(toks, token{kind: tokName, text: s[i:j]})
			i = j
		case c >= '0' && c <= '9':
			j, kind := i, tokInt
			for j < len(s) && (s[j] >= '0' && s[j] <= '9' || s[j] == '_') {
				j++
			}
			if j+1 < len(s) && s[j] == '.' && s[j+1] >= '0' && s[j+1] <= '9' {
				kind = tokFloat
				j++
				for j < len(s) && s[j] >= '0' && s[j] <= '9' {
					j++
				}
			}
			toks = append(toks, token{kind: kind, text: strings.ReplaceAll(s[i:j], "_", "")})
			i = j
		case c == '\'' || c == '"':
			str, n, err := readString(s[i:])
			if err != nil {
				return nil, err
			}
			toks = append(toks, token{kind: tokString, text: str})
			i += n
		default:
			op := readOperator(s[i:])
			if op == "" {
				return nil, fmt.Errorf("unexpected character %q", c)
			}
			toks = append(toks, token{kind: tokOp, text: op})
			i += len(op)
		}
	}
	return append(toks, token{kind: tokEOF}), nil
}

var operators = []string{"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
	"(", ")", "[", "]", "{", "}", ",", ".", ":", "|", "="}

func readOperator(s string) string {
	for _, op := range operators {
		if strings.HasPrefix(s, op) {
			return op
		}
	}
	return ""
}

// readString decodes a quoted literal with Python escapes; it returns the
// value and the number of source bytes consumed.
func readString(s string) (string, int, error) {
	quote := s[0]
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		if c == quote {
			return b.String(), i + 1, nil
		}
		if c != '\\' || i+1 >= len(s) {
			b.WriteByte(c)
			continue
		}
		i++
		switch e := s[i]; e {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case '\\', '\'', '"':
			b.WriteByte(e)
		case '0':
			b.WriteByte(0)
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if i+n >= len(s) {
				return "", 0, fmt.Errorf("bad \\%c escape", e)
			}
			var r rune
			if _, err := fmt.Sscanf(s[i+1:i+1+n], "%x", &r); err != nil {
				return "", 0, fmt.Errorf("bad \\%c escape: %w", e, err)
			}
			b.WriteRune(r)
			i += n
		case '\n':
		default:
			b.WriteByte('\\')
			b.WriteByte(e)
		}
	}
	return "", 0, fmt.Errorf("unterminated string literal")
}
