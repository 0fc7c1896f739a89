package chat

import (
	"sort"
	"strings"
	"unicode"
)

// AddedToken is an entry of tokenizer.json "added_tokens" or
// tokenizer_config.json "added_tokens_decoder".
type AddedToken struct {
	ID      int32
	Content string
	Special bool // skipped by Decode(ids, skipSpecial=true)
	LStrip  bool // the match absorbs whitespace on its left
	RStrip  bool // the match absorbs whitespace on its right
	// Normalized tokens are matched against the normalized text (their
	// content normalized too); the others against the raw input, first.
	Normalized bool
}

// addedVocab holds the added tokens and the two matchers tokenizers uses:
// one on the raw text, one on each normalized segment.
type addedVocab struct {
	byContent       map[string]*AddedToken
	byID            map[int32]*AddedToken
	raw, normalized addedMatcher
}

// addedMatcher finds added tokens in text, leftmost then longest (the
// LeftmostLongest Aho-Corasick match of tokenizers).
type addedMatcher struct {
	byFirst [256][]addedPattern // by first byte, longest first
}

type addedPattern struct {
	text string
	tok  *AddedToken
}

// add registers t; norm (may be nil) normalizes the pattern of a
// Normalized token. A token re-added under the same content replaces it.
func (a *addedVocab) add(t AddedToken, norm normalizer) {
	if a.byContent == nil {
		a.byContent = map[string]*AddedToken{}
		a.byID = map[int32]*AddedToken{}
	}
	if t.Content == "" {
		return
	}
	if old, ok := a.byContent[t.Content]; ok {
		a.raw.remove(old)
		a.normalized.remove(old)
		delete(a.byID, old.ID)
	}
	tok := &t
	a.byContent[t.Content] = tok
	a.byID[t.ID] = tok
	if !t.Normalized {
		a.raw.add(addedPattern{text: t.Content, tok: tok})
		return
	}
	pattern := t.Content
	if norm != nil {
		pattern = norm.normalize(pattern)
	}
	if pattern != "" {
		a.normalized.add(addedPattern{text: pattern, tok: tok})
	}
}

func (m *addedMatcher) add(p addedPattern) {
	list := append(m.byFirst[p.text[0]], p)
	sort.SliceStable(list, func(i, j int) bool { return len(list[i].text) > len(list[j].text) })
	m.byFirst[p.text[0]] = list
}

func (m *addedMatcher) remove(tok *AddedToken) {
	for b, list := range m.byFirst {
		m.byFirst[b] = slicesDeleteFunc(list, func(p addedPattern) bool { return p.tok == tok })
	}
}

func slicesDeleteFunc(list []addedPattern, del func(addedPattern) bool) []addedPattern {
	out := list[:0]
	for _, p := range list {
		if !del(p) {
			out = append(out, p)
		}
	}
	return out
}

// split calls emit for each segment of s in order: text between added
// tokens (tok nil) and the added tokens themselves, whose span includes the
// whitespace an lstrip/rstrip token absorbs.
func (m *addedMatcher) split(s string, emit func(seg string, tok *AddedToken)) {
	from := 0
	for from < len(s) {
		start, end, tok := m.find(s, from)
		if tok == nil {
			break
		}
		if start > from {
			emit(s[from:start], nil)
		}
		emit(s[start:end], tok)
		from = end
	}
	if from < len(s) {
		emit(s[from:], nil)
	}
}

// find returns the leftmost, longest added token in s[from:] with its
// span, or nil.
func (m *addedMatcher) find(s string, from int) (start, end int, tok *AddedToken) {
	for p := from; p < len(s); p++ {
		for _, pat := range m.byFirst[s[p]] {
			if !strings.HasPrefix(s[p:], pat.text) {
				continue
			}
			start, end = p, p+len(pat.text)
			if pat.tok.LStrip {
				start = from + len(strings.TrimRightFunc(s[from:start], unicode.IsSpace))
			}
			if pat.tok.RStrip {
				end = len(s) - len(strings.TrimLeftFunc(s[end:], unicode.IsSpace))
			}
			return start, end, pat.tok
		}
	}
	return 0, 0, nil
}
