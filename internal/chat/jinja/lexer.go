// Package jinja renders the subset of Jinja2 that Hugging Face chat
// templates use, with the exact output of transformers' apply_chat_template
// environment: trim_blocks, lstrip_blocks, loop controls, Python value
// semantics, and transformers' tojson (key order kept, no HTML escaping,
// Python separators).
package jinja

import (
	"fmt"
	"regexp"
	"strconv"
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
	lx := &lexer{src: normalizeNewlines(src), line: 1, lineStarting: true}
	for lx.pos < len(lx.src) {
		start := indexTagStart(lx.src, lx.pos)
		if start < 0 {
			lx.emitText(lx.src[lx.pos:])
			break
		}
		open := lx.src[start : start+2]
		sign := byte(0)
		if start+2 < len(lx.src) && (lx.src[start+2] == '-' || lx.src[start+2] == '+') {
			sign = lx.src[start+2]
		}
		lx.emitText(lx.stripBefore(lx.src[lx.pos:start], sign, open != "{{"))
		lx.line += strings.Count(lx.src[lx.pos:start], "\n")
		bodyStart := start + 2
		if sign != 0 {
			bodyStart++
		}
		end, bodyEnd, stripAfter, err := findTagEnd(lx.src, bodyStart, open)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", lx.line, err)
		}
		body := lx.src[bodyStart:bodyEnd]
		lx.line += strings.Count(lx.src[start:end], "\n")
		lx.pos = end
		switch {
		case open == "{{":
			lx.segs = append(lx.segs, segment{kind: segVar, text: body, line: lx.line})
		case open == "{%" && strings.TrimSpace(body) == "raw":
			lx.afterTag(stripAfter, true)
			if err := lx.rawBlock(); err != nil {
				return nil, err
			}
			continue
		case open == "{%":
			lx.segs = append(lx.segs, segment{kind: segBlock, text: body, line: lx.line})
		}
		lx.afterTag(stripAfter, open != "{{")
	}
	return lx.segs, nil
}

type lexer struct {
	src          string
	pos, line    int
	lineStarting bool // the last tag ended at a line start (jinja2's line_starting)
	segs         []segment
}

func (lx *lexer) emitText(text string) {
	if text != "" {
		lx.segs = append(lx.segs, segment{kind: segText, text: text, line: lx.line})
	}
}

// stripBefore applies a tag's left-side whitespace control to the text
// before it.
func (lx *lexer) stripBefore(text string, sign byte, isBlock bool) string {
	switch {
	case sign == '-':
		return strings.TrimRightFunc(text, unicode.IsSpace)
	case sign != '+' && isBlock:
		lpos := strings.LastIndexByte(text, '\n') + 1
		if (lpos > 0 || lx.lineStarting) && strings.Trim(text[lpos:], " \t") == "" {
			return text[:lpos]
		}
	}
	return text
}

// afterTag applies a tag's right-side whitespace control.
func (lx *lexer) afterTag(stripAfter, isBlock bool) {
	switch {
	case stripAfter:
		rest := strings.TrimLeftFunc(lx.src[lx.pos:], unicode.IsSpace)
		lx.line += strings.Count(lx.src[lx.pos:len(lx.src)-len(rest)], "\n")
		lx.pos = len(lx.src) - len(rest)
	case isBlock && lx.pos < len(lx.src) && lx.src[lx.pos] == '\n':
		lx.pos++ // trim_blocks
		lx.line++
	}
	lx.lineStarting = lx.pos > 0 && lx.src[lx.pos-1] == '\n'
}

// rawBlock emits everything up to {% endraw %} as text.
func (lx *lexer) rawBlock() error {
	endRaw := regexp.MustCompile(`\{%([-+]?)\s*endraw\s*([-+]?)%\}`)
	loc := endRaw.FindStringSubmatchIndex(lx.src[lx.pos:])
	if loc == nil {
		return fmt.Errorf("line %d: missing {%% endraw %%}", lx.line)
	}
	var sign byte
	if loc[3] > loc[2] {
		sign = lx.src[lx.pos+loc[2]]
	}
	text := lx.src[lx.pos : lx.pos+loc[0]]
	lx.emitText(lx.stripBefore(text, sign, true))
	lx.line += strings.Count(lx.src[lx.pos:lx.pos+loc[1]], "\n")
	stripAfter := loc[5] > loc[4] && lx.src[lx.pos+loc[4]] == '-'
	lx.pos += loc[1]
	lx.afterTag(stripAfter, true)
	return nil
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
				for j < len(s) && (s[j] >= '0' && s[j] <= '9' || s[j] == '_') {
					j++
				}
			}
			if n := exponentLen(s[j:]); n > 0 {
				kind = tokFloat
				j += n
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
		case 'a':
			b.WriteByte('\a')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'v':
			b.WriteByte('\v')
		case '0', '1', '2', '3', '4', '5', '6', '7':
			j := i
			for j < len(s) && j < i+3 && s[j] >= '0' && s[j] <= '7' {
				j++
			}
			v, _ := strconv.ParseUint(s[i:j], 8, 32)
			b.WriteRune(rune(v))
			i = j - 1
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

// exponentLen is the length of a float exponent ("e-05") at the start of s.
func exponentLen(s string) int {
	if len(s) < 2 || s[0] != 'e' && s[0] != 'E' {
		return 0
	}
	i := 1
	if s[i] == '+' || s[i] == '-' {
		i++
	}
	start := i
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i == start {
		return 0
	}
	return i
}
