package jinja

import (
	"strings"
	"unicode"
)

// Python's full Unicode case mappings: 'straße'.upper() is 'STRASSE',
// 'ΌΣΟΣ'.lower() ends in a final sigma. Go's unicode package maps one rune
// to one rune; the multi-character mappings come from unicase_tables.go.

func pyUpperRune(b *strings.Builder, r rune) {
	if m, ok := specialUpper(r); ok {
		b.WriteString(m)
		return
	}
	b.WriteRune(unicode.ToUpper(r))
}

func pyTitleRune(b *strings.Builder, r rune) {
	if m, ok := specialTitle(r); ok {
		b.WriteString(m)
		return
	}
	b.WriteRune(unicode.ToTitle(r))
}

// pyLowerAt lowers rs[i], with the final-sigma rule.
func pyLowerAt(b *strings.Builder, rs []rune, i int) {
	r := rs[i]
	if r == 'Σ' {
		if finalSigma(rs, i) {
			b.WriteRune('ς')
		} else {
			b.WriteRune('σ')
		}
		return
	}
	if m, ok := specialLower(r); ok {
		b.WriteString(m)
		return
	}
	b.WriteRune(unicode.ToLower(r))
}

// isCased is Unicode's Cased property (approximately: letters with case).
func isCased(r rune) bool { return unicode.IsUpper(r) || unicode.IsLower(r) || unicode.IsTitle(r) }

// isCaseIgnorable is Unicode's Case_Ignorable property (approximately).
func isCaseIgnorable(r rune) bool {
	return unicode.In(r, unicode.Mn, unicode.Me, unicode.Cf, unicode.Lm, unicode.Sk) || strings.ContainsRune("'.:·’\u00ad", r)
}

// finalSigma: a capital sigma preceded by a cased letter and not followed
// by one (case-ignorable characters skipped) lowers to ς.
func finalSigma(rs []rune, i int) bool {
	j := i - 1
	for j >= 0 && isCaseIgnorable(rs[j]) {
		j--
	}
	if j < 0 || !isCased(rs[j]) {
		return false
	}
	j = i + 1
	for j < len(rs) && isCaseIgnorable(rs[j]) {
		j++
	}
	return j == len(rs) || !isCased(rs[j])
}

func pyUpper(s string) string {
	var b strings.Builder
	for _, r := range s {
		pyUpperRune(&b, r)
	}
	return b.String()
}

func pyLower(s string) string {
	rs := []rune(s)
	var b strings.Builder
	for i := range rs {
		pyLowerAt(&b, rs, i)
	}
	return b.String()
}

// pyTitle is str.title: a character after a cased one is lowered, any
// other is title-cased.
func pyTitle(s string) string {
	rs := []rune(s)
	var b strings.Builder
	prevCased := false
	for i, r := range rs {
		if prevCased {
			pyLowerAt(&b, rs, i)
		} else {
			pyTitleRune(&b, r)
		}
		prevCased = isCased(r)
	}
	return b.String()
}

// pyCapitalize is str.capitalize (Python 3.8+): the first character in
// title case, the rest lowered.
func pyCapitalize(s string) string {
	rs := []rune(s)
	if len(rs) == 0 {
		return s
	}
	var b strings.Builder
	pyTitleRune(&b, rs[0])
	for i := 1; i < len(rs); i++ {
		pyLowerAt(&b, rs, i)
	}
	return b.String()
}

// pyCasefold is str.casefold: full case folding.
func pyCasefold(s string) string {
	var b strings.Builder
	for _, r := range s {
		if m, ok := specialFold(r); ok {
			b.WriteString(m)
			continue
		}
		if m, ok := specialLower(r); ok {
			b.WriteString(m)
			continue
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

// pySwapcase is str.swapcase.
func pySwapcase(s string) string {
	rs := []rune(s)
	var b strings.Builder
	for i, r := range rs {
		switch {
		case unicode.IsUpper(r):
			pyLowerAt(&b, rs, i)
		case unicode.IsLower(r):
			pyUpperRune(&b, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
