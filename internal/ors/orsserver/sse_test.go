package orsserver

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/ors"
)

// pythonSpaces is every code point for which Python 3.11's str.isspace is true.
var pythonSpaces = []rune{'\t', '\n', '\v', '\f', '\r', 0x1c, 0x1d, 0x1e, 0x1f, ' ', 0x85, 0xa0, 0x1680,
	0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a,
	0x2028, 0x2029, 0x202f, 0x205f, 0x3000}

func TestIsPySpaceMatchesPython(t *testing.T) {
	want := map[rune]bool{}
	for _, r := range pythonSpaces {
		want[r] = true
	}
	for r := rune(0); r <= 0x3100; r++ {
		assert.Equal(t, want[r], IsPySpace(r), "U+%04X", r)
	}
	assert.False(t, IsPySpace(0x180e))
	assert.False(t, IsPySpace(0x200b))
	assert.False(t, IsPySpace(0xfeff))
}

func TestChunks(t *testing.T) {
	tests := []struct {
		name string
		in   string
		max  int
		want []string
	}{
		{"empty", "", 8, []string{""}},
		{"short", "abc", 8, []string{"abc"}},
		{"exact", "abcdefgh", 8, []string{"abcdefgh"}},
		{"plain split", "abcdefghij", 8, []string{"abcdefgh", "ij"}},
		{"cut lands on a letter", "abcdefg hij", 8, []string{"abcdefg ", "hij"}},
		{"moves before space", "abcdefgh ij", 8, []string{"abcdefg", "h ij"}},
		{"moves before run", "abcd    efgh", 8, []string{"abcd    ", "efgh"}},
		{"no rune split", "abcdefé", 7, []string{"abcdef", "é"}},
		{"nbsp not at start", "abcdef\u00a0gh", 7, []string{"abcde", "f\u00a0gh"}},
		{"unsplittable whitespace run", "a" + strings.Repeat(" ", 10) + "b", 8, []string{"a" + strings.Repeat(" ", 10), "b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, Chunks(tt.in, tt.max))
		})
	}
}

func TestEscapeLongWhitespaceRuns(t *testing.T) {
	text := "x" + strings.Repeat(" \u3000", 400) + "y z"
	payload, err := ors.MarshalJSON(map[string]string{"t": text})
	require.NoError(t, err)
	esc := escapeLongWhitespaceRuns(string(payload), 512)
	assert.NotContains(t, esc, "  ")
	assert.Contains(t, esc, `\u0020\u3000`)
	assert.Contains(t, esc, "y z", "short runs stay raw")
	var back map[string]string
	require.NoError(t, json.Unmarshal([]byte(esc), &back))
	assert.Equal(t, text, back["t"])
	short := `{"t":"a b"}`
	assert.Equal(t, short, escapeLongWhitespaceRuns(short, 512))
}

// checkChunks asserts the chunker's contract for in.
func checkChunks(t *testing.T, in string, max int) {
	chunks := Chunks(in, max)
	require.Equal(t, in, strings.Join(chunks, ""))
	for i, c := range chunks {
		if utf8.ValidString(in) {
			require.True(t, utf8.ValidString(c), "chunk %d splits a rune", i)
		}
		if i > 0 {
			r, _ := utf8.DecodeRuneInString(c)
			require.False(t, IsPySpace(r), "chunk %d starts with whitespace %q", i, r)
			require.NotEmpty(t, c)
		}
		if len(c) > max {
			// Only when no legal cut exists: the first rune is followed by whitespace only.
			_, n := utf8.DecodeRuneInString(c)
			for _, r := range c[n:] {
				require.True(t, IsPySpace(r), "chunk %d is %d bytes", i, len(c))
			}
		}
	}
}

func FuzzChunks(f *testing.F) {
	f.Add("hello world", uint16(4))
	f.Add(strings.Repeat("é ", 3000), uint16(4096))
	f.Add("a\u00a0\u00a0\u00a0b\u3000c", uint16(5))
	f.Add("\x1c\x1d\x1e\x1fabc", uint16(4))
	f.Add(string([]byte{0xff, 0xfe, ' ', 0x80}), uint16(4))
	f.Fuzz(func(t *testing.T, in string, max uint16) {
		m := 4 + int(max)%4096
		checkChunks(t, in, m)
		checkChunks(t, in, MaxChunkBytes)
	})
}

// FuzzResultChunks: a JSON result built from any text, after escaping, is
// always cut within MaxChunkBytes and reassembles to the same value.
func FuzzResultChunks(f *testing.F) {
	f.Add(strings.Repeat(" ", 9000))
	f.Add(strings.Repeat("ab \u3000", 3000))
	f.Fuzz(func(t *testing.T, text string) {
		if !utf8.ValidString(text) {
			return
		}
		out := ors.ToolOutput{Blocks: []ors.Block{ors.TextBlock(text)}}
		payload, err := ors.MarshalJSON(ors.RunToolOutput{OK: true, Output: &out})
		require.NoError(t, err)
		esc := escapeLongWhitespaceRuns(string(payload), whitespaceRunLimit)
		chunks := Chunks(esc, MaxChunkBytes)
		for _, c := range chunks {
			require.LessOrEqual(t, len(c), MaxChunkBytes)
		}
		var back ors.RunToolOutput
		require.NoError(t, json.Unmarshal([]byte(strings.Join(chunks, "")), &back))
		require.Equal(t, text, back.Output.Blocks[0].Text)
	})
}
