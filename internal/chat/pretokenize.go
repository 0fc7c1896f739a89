package chat

import (
	"fmt"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Split patterns of the byte-level BPE families, as written in their
// tokenizer.json files. Rust's regex (which Hugging Face tokenizers uses) has
// the look-ahead `\s+(?!\S)` that Go's regexp lacks, so these known patterns
// get a hand-written matcher with the same leftmost-first semantics, and any
// other pattern goes through splitRegex, which evaluates the alternation one
// branch at a time and implements that look-ahead branch by hand.
const (
	PatternGPT2   = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	PatternQwen2  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	PatternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// splitter cuts text into the pieces a Split pre-tokenizer with behaviour
// Isolated produces: every match, and every gap between matches, in order.
type splitter interface {
	split(s string, emit func(piece string))
	// splitMarked is split that also tells matches from gaps.
	splitMarked(s string, emit func(piece string, isMatch bool))
}

// newSplitter returns the matcher for a Split regex: a hand-written one for
// the GPT-2, Qwen2 and Llama 3 families, otherwise the generic evaluator.
func newSplitter(pattern string) (splitter, error) {
	switch pattern {
	case PatternGPT2:
		return &familySplitter{gpt2: true}, nil
	case PatternQwen2:
		return &familySplitter{digitsMax: 1}, nil
	case PatternLlama3:
		return &familySplitter{digitsMax: 3}, nil
	}
	return compileSplitRegex(pattern)
}

// isSpace is Unicode White_Space, which is what `\s` means in Rust's regex
// (Go's regexp `\s` is ASCII only).
func isSpace(r rune) bool {
	if r < utf8.RuneSelf {
		return asciiClass[r] == classSpace
	}
	return unicode.IsSpace(r)
}

func isLetter(r rune) bool {
	if r < utf8.RuneSelf {
		return asciiClass[r] == classLetter
	}
	return unicode.IsLetter(r)
}

func isNumber(r rune) bool {
	if r < utf8.RuneSelf {
		return asciiClass[r] == classNumber
	}
	return unicode.IsNumber(r)
}

// ASCII fast path for the character classes (\s, \p{L}, \p{N}).
const (
	classOther byte = iota
	classSpace
	classLetter
	classNumber
)

var asciiClass = func() (t [utf8.RuneSelf]byte) {
	for r := rune(0); r < utf8.RuneSelf; r++ {
		switch {
		case unicode.IsSpace(r):
			t[r] = classSpace
		case unicode.IsLetter(r):
			t[r] = classLetter
		case unicode.IsNumber(r):
			t[r] = classNumber
		}
	}
	return t
}()

// familySplitter matches PatternGPT2 (gpt2=true) or the Qwen2/Llama 3
// patterns, which differ only in how many digits one piece holds.
type familySplitter struct {
	gpt2      bool
	digitsMax int
}

func (f *familySplitter) split(s string, emit func(string)) {
	for p := 0; p < len(s); {
		n := f.match(s, p)
		if n == 0 { // cannot happen: the last branch matches any character
			_, n = utf8.DecodeRuneInString(s[p:])
		}
		emit(s[p : p+n])
		p += n
	}
}

// splitMarked reports every piece as a match: the patterns cover all text.
func (f *familySplitter) splitMarked(s string, emit func(string, bool)) {
	f.split(s, func(p string) { emit(p, true) })
}

// match returns the length of the leftmost-first match at p (0 if none),
// trying the pattern's branches in order as a backtracking engine would.
func (f *familySplitter) match(s string, p int) int {
	if n := matchContraction(s, p, !f.gpt2); n > 0 {
		return n
	}
	r, size := utf8.DecodeRuneInString(s[p:])
	if f.gpt2 {
		// ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`
		q := p
		if r == ' ' {
			q++
		}
		if q < len(s) {
			r2, _ := utf8.DecodeRuneInString(s[q:])
			for _, class := range []func(rune) bool{isLetter, isNumber, isOther} {
				if class(r2) {
					return q - p + runLen(s, q, class, -1)
				}
			}
		}
	} else {
		// `[^\r\n\p{L}\p{N}]?\p{L}+`
		if r != '\r' && r != '\n' && !isLetter(r) && !isNumber(r) {
			if n := runLen(s, p+size, isLetter, -1); n > 0 {
				return size + n
			}
		}
		if isLetter(r) {
			return runLen(s, p, isLetter, -1)
		}
		// `\p{N}` or `\p{N}{1,3}`
		if isNumber(r) {
			return runLen(s, p, isNumber, f.digitsMax)
		}
		// ` ?[^\s\p{L}\p{N}]+[\r\n]*`
		q := p
		if r == ' ' {
			q++
		}
		if n := runLen(s, q, isOther, -1); n > 0 {
			end := q + n
			return end - p + runLen(s, end, isNewline, -1)
		}
		// `\s*[\r\n]+`: the whitespace run up to and including its last newline.
		ws := runLen(s, p, isSpace, -1)
		if last := lastNewline(s[p : p+ws]); last >= 0 {
			return last + 1
		}
	}
	return matchSpaceNotBeforeNonSpace(s, p)
}

// matchSpaceNotBeforeNonSpace implements `\s+(?!\S)|\s+`: a whitespace run
// that reaches the end of the text is taken whole; one followed by a
// non-space character gives up its last character to that character's piece
// when it is at least two long.
func matchSpaceNotBeforeNonSpace(s string, p int) int {
	ws := runLen(s, p, isSpace, -1)
	if ws == 0 {
		return 0
	}
	if p+ws == len(s) {
		return ws
	}
	_, lastSize := utf8.DecodeLastRuneInString(s[p : p+ws])
	if ws > lastSize {
		return ws - lastSize
	}
	return ws
}

func isOther(r rune) bool   { return !isSpace(r) && !isLetter(r) && !isNumber(r) }
func isNewline(r rune) bool { return r == '\r' || r == '\n' }

func lastNewline(s string) int {
	return strings.LastIndexAny(s, "\r\n")
}

// runLen returns the byte length of the run of runes in class starting at p,
// stopping after max runes when max > 0.
func runLen(s string, p int, class func(rune) bool, max int) int {
	q, count := p, 0
	for q < len(s) && (max <= 0 || count < max) {
		r, size := utf8.DecodeRuneInString(s[q:])
		if !class(r) {
			break
		}
		q += size
		count++
	}
	return q - p
}

// matchContraction matches `'s|'t|'re|'ve|'m|'ll|'d`, optionally with
// Unicode simple case folding (`(?i:...)`), under which `s` also matches
// U+017F LATIN SMALL LETTER LONG S.
func matchContraction(s string, p int, fold bool) int {
	if s[p] != '\'' || p+1 >= len(s) {
		return 0
	}
	eq := func(q int, want byte) (int, bool) {
		if q >= len(s) {
			return 0, false
		}
		if s[q] == want {
			return 1, true
		}
		if !fold {
			return 0, false
		}
		if s[q] == want-'a'+'A' {
			return 1, true
		}
		if want == 's' && strings.HasPrefix(s[q:], "\u017f") {
			return 2, true
		}
		return 0, false
	}
	for _, suffix := range []string{"s", "t", "re", "ve", "m", "ll", "d"} {
		q := p + 1
		ok := true
		for i := 0; i < len(suffix) && ok; i++ {
			var n int
			n, ok = eq(q, suffix[i])
			q += n
		}
		if ok {
			return q - p
		}
	}
	return 0
}

// regexSplitter evaluates a top-level alternation branch by branch, anchored
// at each position, which gives Rust's leftmost-first semantics. The branch
// `\s+(?!\S)` is implemented by hand; other look-arounds are refused.
type regexSplitter struct {
	branches []*regexp.Regexp // nil entry: the `\s+(?!\S)` branch
}

const lookaheadSpaceBranch = `\s+(?!\S)`

func compileSplitRegex(pattern string) (*regexSplitter, error) {
	var rs regexSplitter
	for _, branch := range splitAlternation(pattern) {
		if branch == lookaheadSpaceBranch {
			rs.branches = append(rs.branches, nil)
			continue
		}
		if strings.Contains(branch, "(?=") || strings.Contains(branch, "(?!") ||
			strings.Contains(branch, "(?<") {
			return nil, fmt.Errorf("split pattern %q: look-around in branch %q is not supported", pattern, branch)
		}
		re, err := regexp.Compile(`^(?:` + translateRustClasses(branch) + `)`)
		if err != nil {
			return nil, fmt.Errorf("split pattern %q: compile branch %q: %w", pattern, branch, err)
		}
		rs.branches = append(rs.branches, re)
	}
	return &rs, nil
}

func (rs *regexSplitter) split(s string, emit func(string)) {
	rs.splitMarked(s, func(p string, _ bool) { emit(p) })
}

func (rs *regexSplitter) splitMarked(s string, emit func(string, bool)) {
	gapStart := 0
	for p := 0; p < len(s); {
		n := rs.match(s, p)
		if n == 0 {
			_, size := utf8.DecodeRuneInString(s[p:])
			p += size
			continue
		}
		if gapStart < p {
			emit(s[gapStart:p], false)
		}
		emit(s[p:p+n], true)
		p += n
		gapStart = p
	}
	if gapStart < len(s) {
		emit(s[gapStart:], false)
	}
}

func (rs *regexSplitter) match(s string, p int) int {
	for _, re := range rs.branches {
		if re == nil {
			if n := matchLookaheadOnly(s, p); n > 0 {
				return n
			}
			continue
		}
		if loc := re.FindStringIndex(s[p:]); loc != nil && loc[1] > 0 {
			return loc[1]
		}
	}
	return 0
}

// matchLookaheadOnly is `\s+(?!\S)` alone (without the trailing `\s+`).
func matchLookaheadOnly(s string, p int) int {
	ws := runLen(s, p, isSpace, -1)
	if ws == 0 || p+ws == len(s) {
		return ws
	}
	_, lastSize := utf8.DecodeLastRuneInString(s[p : p+ws])
	return ws - lastSize
}

// splitAlternation splits a pattern at its top-level `|`.
func splitAlternation(pattern string) []string {
	var out []string
	depth, inClass, start := 0, false, 0
	for i := 0; i < len(pattern); i++ {
		switch c := pattern[i]; {
		case c == '\\':
			i++
		case inClass:
			if c == ']' {
				inClass = false
			}
		case c == '[':
			inClass = true
			if i+1 < len(pattern) && pattern[i+1] == '^' {
				i++
			}
			if i+1 < len(pattern) && pattern[i+1] == ']' {
				i++
			}
		case c == '(':
			depth++
		case c == ')':
			depth--
		case c == '|' && depth == 0:
			out = append(out, pattern[start:i])
			start = i + 1
		}
	}
	return append(out, pattern[start:])
}

// whiteSpaceClass is Unicode White_Space as Go character-class content.
const whiteSpaceClass = `\t\n\v\f\r\x{85}\p{Z}`

// translateRustClasses rewrites `\s`/`\S` to Unicode White_Space, since Go's
// `\s` is ASCII only.
func translateRustClasses(re string) string {
	var b strings.Builder
	inClass := false
	for i := 0; i < len(re); i++ {
		c := re[i]
		switch {
		case c == '\\' && i+1 < len(re):
			next := re[i+1]
			i++
			switch {
			case next == 's' && inClass:
				b.WriteString(whiteSpaceClass)
			case next == 's':
				b.WriteString("[" + whiteSpaceClass + "]")
			case next == 'S' && !inClass:
				b.WriteString("[^" + whiteSpaceClass + "]")
			default:
				b.WriteByte('\\')
				b.WriteByte(next)
			}
		case c == '[' && !inClass:
			inClass = true
			b.WriteByte(c)
			if i+1 < len(re) && re[i+1] == '^' {
				b.WriteByte('^')
				i++
			}
		case c == ']' && inClass:
			inClass = false
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}
