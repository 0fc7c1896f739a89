package chat

import (
	"slices"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// normalizer is one tokenizer.json "normalizer" step.
type normalizer interface{ normalize(s string) string }

type unicodeNormalizer struct{ form norm.Form }

func (n unicodeNormalizer) normalize(s string) string { return n.form.String(s) }

type lowercaseNormalizer struct{}

func (lowercaseNormalizer) normalize(s string) string { return strings.ToLower(s) }

// prependNormalizer adds its text in front of any non-empty input.
type prependNormalizer struct{ prepend string }

func (n prependNormalizer) normalize(s string) string {
	if s == "" {
		return s
	}
	return n.prepend + s
}

type replaceNormalizer struct{ old, new string }

func (n replaceNormalizer) normalize(s string) string { return strings.ReplaceAll(s, n.old, n.new) }

type normalizerSequence []normalizer

func (seq normalizerSequence) normalize(s string) string {
	for _, n := range seq {
		s = n.normalize(s)
	}
	return s
}

// preTokenizer splits one normalized segment into the pieces BPE sees.
type preTokenizer interface {
	preTokenize(s string, first bool, emit func(piece string))
}

// byteLevelPreTokenizer is tokenizers' ByteLevel pre-tokenizer: optional
// prefix space, optional GPT-2 split. The byte-to-character mapping itself
// happens inside the BPE model.
type byteLevelPreTokenizer struct {
	addPrefixSpace bool
	split          splitter // nil when use_regex is false
}

func (b byteLevelPreTokenizer) preTokenize(s string, _ bool, emit func(string)) {
	if b.addPrefixSpace && !strings.HasPrefix(s, " ") {
		s = " " + s
	}
	if b.split == nil {
		emit(s)
		return
	}
	b.split.split(s, emit)
}

// splitBehavior is what a Split pre-tokenizer does with its matches.
type splitBehavior int

const (
	splitIsolated splitBehavior = iota
	splitRemoved
	splitMergedWithPrevious
	splitMergedWithNext
	splitContiguous
)

// splitPreTokenizer is tokenizers' Split.
type splitPreTokenizer struct {
	split    splitter
	literal  string // String patterns are matched literally
	behavior splitBehavior
}

// markedPiece is a piece of a split and whether it is a pattern match.
type markedPiece struct {
	text    string
	isMatch bool
}

func (sp splitPreTokenizer) preTokenize(s string, _ bool, emit func(string)) {
	if sp.literal == "" && sp.behavior == splitIsolated {
		sp.split.split(s, emit)
		return
	}
	var pieces []markedPiece
	collect := func(p string, isMatch bool) { pieces = append(pieces, markedPiece{p, isMatch}) }
	if sp.literal != "" {
		splitLiteral(s, sp.literal, collect)
	} else {
		sp.split.splitMarked(s, collect)
	}
	for _, p := range applySplitBehavior(pieces, sp.behavior) {
		emit(p)
	}
}

func splitLiteral(s, literal string, emit func(string, bool)) {
	for {
		i := strings.Index(s, literal)
		if i < 0 {
			break
		}
		if i > 0 {
			emit(s[:i], false)
		}
		emit(literal, true)
		s = s[i+len(literal):]
	}
	if s != "" {
		emit(s, false)
	}
}

// applySplitBehavior merges or drops matches as tokenizers'
// NormalizedString::split does: splitting "the-final--countdown" on "-"
// gives MergedWithPrevious [the- final- - countdown], MergedWithNext
// [the -final - -countdown], Contiguous [the - final -- countdown].
func applySplitBehavior(pieces []markedPiece, behavior splitBehavior) []string {
	var out []string
	switch behavior {
	case splitIsolated, splitRemoved:
		for _, p := range pieces {
			if !(behavior == splitRemoved && p.isMatch) {
				out = append(out, p.text)
			}
		}
	case splitContiguous, splitMergedWithPrevious:
		prev := false
		for i, p := range pieces {
			merge := p.isMatch == prev
			if behavior == splitMergedWithPrevious {
				merge = p.isMatch && !prev
			}
			if merge && i > 0 {
				out[len(out)-1] += p.text
			} else {
				out = append(out, p.text)
			}
			prev = p.isMatch
		}
	case splitMergedWithNext:
		prev := false
		for i := len(pieces) - 1; i >= 0; i-- {
			p := pieces[i]
			if p.isMatch && !prev && len(out) > 0 {
				out[len(out)-1] = p.text + out[len(out)-1]
			} else {
				out = append(out, p.text)
			}
			prev = p.isMatch
		}
		slices.Reverse(out)
	}
	return out
}

// digitsPreTokenizer is tokenizers' Digits pre-tokenizer.
type digitsPreTokenizer struct{ individual bool }

func (d digitsPreTokenizer) preTokenize(s string, _ bool, emit func(string)) {
	start := 0
	inDigits := false
	for i, r := range s {
		digit := unicode.IsDigit(r)
		if d.individual && digit {
			if start < i {
				emit(s[start:i])
			}
			emit(string(r))
			start = i + len(string(r))
			inDigits = false
			continue
		}
		if i > start && digit != inDigits {
			emit(s[start:i])
			start = i
		}
		inDigits = digit
	}
	if start < len(s) {
		emit(s[start:])
	}
}

// metaspacePreTokenizer replaces spaces with ▁, prepends one per its
// scheme, and optionally splits before each ▁.
type metaspacePreTokenizer struct {
	replacement string
	prepend     string // "always", "first" or "never"
	split       bool
}

func (m metaspacePreTokenizer) preTokenize(s string, first bool, emit func(string)) {
	s = strings.ReplaceAll(s, " ", m.replacement)
	if (m.prepend == "always" || (m.prepend == "first" && first)) && !strings.HasPrefix(s, m.replacement) {
		s = m.replacement + s
	}
	if !m.split {
		emit(s)
		return
	}
	var pieces []markedPiece
	splitLiteral(s, m.replacement, func(p string, isMatch bool) { pieces = append(pieces, markedPiece{p, isMatch}) })
	for _, p := range applySplitBehavior(pieces, splitMergedWithNext) {
		emit(p)
	}
}

type preTokenizerSequence []preTokenizer

func (seq preTokenizerSequence) preTokenize(s string, first bool, emit func(string)) {
	if len(seq) == 0 {
		emit(s)
		return
	}
	seq[0].preTokenize(s, first, func(p string) {
		seq[1:].preTokenize(p, first, emit)
	})
}
