package chat

import (
	"container/heap"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"
)

// byteToRune is GPT-2's bytes_to_unicode table: printable Latin-1 bytes map
// to themselves, the rest to U+0100 onwards, so every byte is a visible
// character in vocab.json.
func byteToRune() [256]rune {
	var table [256]rune
	next := rune(256)
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			table[b] = rune(b)
		} else {
			table[b] = next
			next++
		}
	}
	return table
}

// mergeRule is what a pair of adjacent symbols becomes, and how early.
type mergeRule struct {
	rank int32
	id   int32
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// bpeModel is a BPE vocabulary with its merge ranks. With byteLevel the
// input of Tokenize is raw bytes, each mapped to its GPT-2 character's id;
// otherwise it is characters, with optional SentencePiece byte fallback.
type bpeModel struct {
	vocab        map[string]int32
	merges       map[uint64]mergeRule
	byteLevel    bool
	byteIDs      [256]int32 // byteLevel: id of each byte's character; -1 if absent
	byteFallback bool
	fallbackIDs  [256]int32 // byteFallback: id of <0xXX>; -1 if absent
	unkID        int32      // -1: unknown characters are dropped, as in HF
	fuseUnk      bool
	ignoreMerges bool

	cache wordCache
}

// newBPEModel builds the merge table; a merge naming a token absent from the
// vocabulary is an error, as in Hugging Face tokenizers.
func newBPEModel(vocab map[string]int32, merges [][2]string, byteLevel bool) (*bpeModel, error) {
	m := &bpeModel{vocab: vocab, merges: make(map[uint64]mergeRule, len(merges)), byteLevel: byteLevel, unkID: -1}
	m.cache.init()
	for i, mg := range merges {
		a, okA := vocab[mg[0]]
		b, okB := vocab[mg[1]]
		ab, okAB := vocab[mg[0]+mg[1]]
		if !okA || !okB || !okAB {
			return nil, fmt.Errorf("merge %d (%q %q): token not in vocabulary", i, mg[0], mg[1])
		}
		key := pairKey(a, b)
		if _, dup := m.merges[key]; !dup {
			m.merges[key] = mergeRule{rank: int32(i), id: ab}
		}
	}
	table := byteToRune()
	for b := 0; b < 256; b++ {
		m.byteIDs[b] = -1
		if id, ok := vocab[string(table[b])]; ok {
			m.byteIDs[b] = id
		}
		m.fallbackIDs[b] = -1
		if id, ok := vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.fallbackIDs[b] = id
		}
	}
	return m, nil
}

// tokenize appends the ids of one pre-tokenized piece to dst.
func (m *bpeModel) tokenize(dst []int32, piece string) []int32 {
	if len(piece) == 1 && m.byteLevel && m.byteIDs[piece[0]] >= 0 {
		return append(dst, m.byteIDs[piece[0]])
	}
	if ids, ok := m.cache.get(piece); ok {
		return append(dst, ids...)
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[m.symbolString(piece)]; ok {
			return append(dst, id)
		}
	}
	ids := m.mergeAll(m.initialSymbols(piece))
	m.cache.put(piece, ids)
	return append(dst, ids...)
}

func (m *bpeModel) symbolString(piece string) string {
	if !m.byteLevel {
		return piece
	}
	table := byteToRune()
	buf := make([]rune, len(piece))
	for i := 0; i < len(piece); i++ {
		buf[i] = table[piece[i]]
	}
	return string(buf)
}

func (m *bpeModel) initialSymbols(piece string) []int32 {
	syms := make([]int32, 0, len(piece))
	if m.byteLevel {
		for i := 0; i < len(piece); i++ {
			if id := m.byteIDs[piece[i]]; id >= 0 {
				syms = append(syms, id)
			} else if m.unkID >= 0 {
				syms = append(syms, m.unkID)
			}
		}
		return syms
	}
	lastUnk := false
	for i, r := range piece {
		size := utf8.RuneLen(r)
		if r == utf8.RuneError {
			_, size = utf8.DecodeRuneInString(piece[i:])
		}
		ch := piece[i : i+size]
		if id, ok := m.vocab[ch]; ok {
			syms = append(syms, id)
			lastUnk = false
			continue
		}
		if m.byteFallback && m.allFallback(ch) {
			for j := 0; j < len(ch); j++ {
				syms = append(syms, m.fallbackIDs[ch[j]])
			}
			lastUnk = false
			continue
		}
		if m.unkID >= 0 && !(m.fuseUnk && lastUnk) {
			syms = append(syms, m.unkID)
		}
		lastUnk = m.unkID >= 0
	}
	return syms
}

func (m *bpeModel) allFallback(ch string) bool {
	for j := 0; j < len(ch); j++ {
		if m.fallbackIDs[ch[j]] < 0 {
			return false
		}
	}
	return true
}

// symbol is one node of the doubly linked list of a word being merged.
type symbol struct {
	id         int32
	prev, next int
	gone       bool
}

// candidate is a possible merge of the symbol at pos with its successor.
type candidate struct {
	rank int32
	pos  int
	id   int32
}

type candidateQueue []candidate

func (q candidateQueue) Len() int { return len(q) }
func (q candidateQueue) Less(i, j int) bool {
	if q[i].rank != q[j].rank {
		return q[i].rank < q[j].rank
	}
	return q[i].pos < q[j].pos
}
func (q candidateQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *candidateQueue) Push(x any)   { *q = append(*q, x.(candidate)) }
func (q *candidateQueue) Pop() any {
	old := *q
	c := old[len(old)-1]
	*q = old[:len(old)-1]
	return c
}

// mergeAll applies merges lowest rank first (leftmost on ties), the order of
// Hugging Face's Word::merge_all, in O(n log n).
func (m *bpeModel) mergeAll(ids []int32) []int32 {
	if len(ids) < 2 {
		return ids
	}
	syms := make([]symbol, len(ids))
	for i, id := range ids {
		syms[i] = symbol{id: id, prev: i - 1, next: i + 1}
	}
	syms[len(syms)-1].next = -1
	q := make(candidateQueue, 0, len(ids))
	for i := 0; i+1 < len(ids); i++ {
		if r, ok := m.merges[pairKey(ids[i], ids[i+1])]; ok {
			q = append(q, candidate{rank: r.rank, pos: i, id: r.id})
		}
	}
	heap.Init(&q)
	for q.Len() > 0 {
		c := heap.Pop(&q).(candidate)
		s := &syms[c.pos]
		if s.gone || s.next < 0 {
			continue
		}
		r, ok := m.merges[pairKey(s.id, syms[s.next].id)]
		if !ok || r.id != c.id || r.rank != c.rank {
			continue // stale: one side changed since this candidate was queued
		}
		nx := s.next
		s.id = c.id
		syms[nx].gone = true
		s.next = syms[nx].next
		if s.next >= 0 {
			syms[s.next].prev = c.pos
		}
		if s.prev >= 0 {
			if r, ok := m.merges[pairKey(syms[s.prev].id, s.id)]; ok {
				heap.Push(&q, candidate{rank: r.rank, pos: s.prev, id: r.id})
			}
		}
		if s.next >= 0 {
			if r, ok := m.merges[pairKey(s.id, syms[s.next].id)]; ok {
				heap.Push(&q, candidate{rank: r.rank, pos: c.pos, id: r.id})
			}
		}
	}
	out := ids[:0]
	for i := 0; i >= 0; i = syms[i].next {
		out = append(out, syms[i].id)
	}
	return out
}

// wordCache memoises tokenize per piece so a repeated word costs one map
// lookup. It is bounded: when full it starts over.
type wordCache struct {
	mu      sync.RWMutex
	entries map[string][]int32
}

const (
	wordCacheCapacity = 1 << 17
	wordCacheMaxPiece = 256
)

func (c *wordCache) init() {
	c.mu.Lock()
	c.entries = make(map[string][]int32)
	c.mu.Unlock()
}

func (c *wordCache) get(piece string) ([]int32, bool) {
	c.mu.RLock()
	ids, ok := c.entries[piece]
	c.mu.RUnlock()
	return ids, ok
}

func (c *wordCache) put(piece string, ids []int32) {
	if len(piece) > wordCacheMaxPiece {
		return
	}
	c.mu.Lock()
	if len(c.entries) >= wordCacheCapacity {
		c.entries = make(map[string][]int32)
	}
	c.entries[strings.Clone(piece)] = append([]int32(nil), ids...)
	c.mu.Unlock()
}
