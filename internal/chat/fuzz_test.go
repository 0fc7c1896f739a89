package chat

import (
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

var roundTripSeeds = []string{
	"Hello world", "  leading and trailing  ", "tabs\tand\nnewlines\r\n\n",
	"世界 🦙 ﷽ 👩‍👩‍👧 ÅÉÎ", "'s 'LL x'd", "1234567890 3.14", "<|im_end|><tool_call>{}</tool_call>",
	"\u00a0\u2028\u3000 nbsp", "a\u0301 decomposed", "",
}

// FuzzRoundTripByteLevel: decode(encode(s)) == s for valid UTF-8 on the
// byte-level tokenizers (Qwen normalizes to NFC first, so there it is
// NFC(s)).
func FuzzRoundTripByteLevel(f *testing.F) {
	for _, s := range roundTripSeeds {
		f.Add(s)
	}
	gpt2 := loadFixture(f, "gpt2")
	roberta := loadFixture(f, "roberta-base")
	qwen := loadFixture(f, "qwen3")
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		for name, tok := range map[string]*Tokenizer{"gpt2": gpt2, "roberta": roberta} {
			if got := tok.Decode(tok.Encode(s), false); got != s {
				t.Fatalf("%s: decode(encode(%q)) = %q", name, s, got)
			}
		}
		if got, want := qwen.Decode(qwen.Encode(s), false), norm.NFC.String(s); got != want {
			t.Fatalf("qwen3: decode(encode(%q)) = %q, want %q", s, got, want)
		}
	})
}

// FuzzSplitterEquivalence: the hand-written matchers of the GPT-2, Qwen2
// and Llama 3 patterns split every input exactly like the generic
// branch-by-branch evaluator of the same regex.
func FuzzSplitterEquivalence(f *testing.F) {
	for _, s := range roundTripSeeds {
		f.Add(s)
	}
	type pair struct{ fast, generic splitter }
	var pairs []pair
	for _, p := range []string{PatternGPT2, PatternQwen2, PatternLlama3} {
		fast, err := newSplitter(p)
		if err != nil {
			f.Fatal(err)
		}
		generic, err := compileSplitRegex(p)
		if err != nil {
			f.Fatal(err)
		}
		pairs = append(pairs, pair{fast, generic})
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		for i, p := range pairs {
			a, b := splitAll(p.fast, s), splitAll(p.generic, s)
			if len(a) != len(b) {
				t.Fatalf("pattern %d on %q: fast %q, generic %q", i, s, a, b)
			}
			for j := range a {
				if a[j] != b[j] {
					t.Fatalf("pattern %d on %q: fast %q, generic %q", i, s, a, b)
				}
			}
		}
	})
}
