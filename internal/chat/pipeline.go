package chat

import (
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
)

// splitPreTokenizer is tokenizers' Split. The splitter reports matches and
// gaps alike; isMatch tells them apart for the non-Isolated behaviours.
type splitPreTokenizer struct {
	split    splitter
	literal  string // String patterns are matched literally
	behavior splitBehavior
}

func (sp splitPreTokenizer) preTokenize(s string, _ bool, emit func(string)) {
	if sp.literal != "" {
		sp.splitLiteral(s, emit)
		return
	}
	if sp.behavior == splitIsolated {
		sp.split.split(s, emit)
		return
	}
	// Non-isolated behaviours need to know which pieces matched: re-run
	// the matcher's pieces through a match test on the same splitter.
	var pieces []string
	sp.split.split(s, func(p string) { pieces = append(pieces, p) })
	sp.combine(pieces, func(p string) bool { return matchesWhole(sp.split, p) }, emit)
}

func (sp splitPreTokenizer) splitLiteral(s string, emit func(string)) {
	var pieces []string
	for {
		i := strings.Index(s, sp.literal)
		if i < 0 {
			break
		}
		if i > 0 {
			pieces = append(pieces, s[:i])
		}
		pieces = append(pieces, sp.literal)
		s = s[i+len(sp.literal):]
	}
	if s != "" {
		pieces = append(pieces, s)
	}
	sp.combine(pieces, func(p string) bool { return p == sp.literal }, emit)
}

func (sp splitPreTokenizer) combine(pieces []string, isMatch func(string) bool, emit func(string)) {
	pending := ""
	for i, p := range pieces {
		switch {
		case sp.behavior == splitIsolated:
			emit(p)
		case sp.behavior == splitRemoved:
			if !isMatch(p) {
				emit(p)
			}
		case sp.behavior == splitMergedWithPrevious:
			if isMatch(p) && i > 0 {
				pending += p
				continue
			}
			if pending != "" {
				emit(pending)
			}
			pending = p
		case sp.behavior == splitMergedWithNext:
			pending += p
			if !isMatch(p) {
				emit(pending)
				pending = ""
			}
		}
	}
	if pending != "" {
		emit(pending)
	}
}

// matchesWhole reports whether the splitter would produce p as one match.
func matchesWhole(sp splitter, p string) bool {
	switch m := sp.(type) {
	case *familySplitter:
		return m.match(p, 0) == len(p)
	case *regexSplitter:
		return m.match(p, 0) == len(p)
	}
	return false
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
	for s != "" {
		i := strings.Index(s[len(m.replacement):], m.replacement)
		if i < 0 {
			emit(s)
			return
		}
		cut := i + len(m.replacement)
		emit(s[:cut])
		s = s[cut:]
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
