package chat

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const tokenizerTestdata = "../../testdata/tokenizers"

// loadCache shares loaded fixtures between tests of this package (loading
// Qwen's vocabulary takes a moment); it lives in test code only.
type loadCache struct {
	mu   sync.Mutex
	toks map[string]*Tokenizer
}

var fixtures = &loadCache{toks: map[string]*Tokenizer{}}

func loadFixture(t testing.TB, dir string) *Tokenizer {
	t.Helper()
	fixtures.mu.Lock()
	defer fixtures.mu.Unlock()
	if tok, ok := fixtures.toks[dir]; ok {
		return tok
	}
	tok, err := LoadTokenizer(filepath.Join(tokenizerTestdata, dir))
	require.NoError(t, err)
	fixtures.toks[dir] = tok
	return tok
}

// goldenVectors reads a llama.cpp .inp/.out pair: 46 strings and the ids
// transformers produced for them (add_special_tokens=False).
func goldenVectors(t *testing.T, name string) ([]string, [][]int32) {
	t.Helper()
	base := filepath.Join(tokenizerTestdata, "vectors", "ggml-vocab-"+name+".gguf")
	inp, err := os.ReadFile(base + ".inp")
	require.NoError(t, err)
	out, err := os.ReadFile(base + ".out")
	require.NoError(t, err)
	inputs := strings.Split(string(inp), "\n__ggml_vocab_test__\n")
	inputs = inputs[:len(inputs)-1]
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	require.Len(t, lines, len(inputs))
	want := make([][]int32, len(lines))
	for i, line := range lines {
		want[i] = []int32{}
		for _, f := range strings.Fields(line) {
			v, err := strconv.Atoi(f)
			require.NoError(t, err)
			want[i] = append(want[i], int32(v))
		}
	}
	return inputs, want
}

func TestGoldenVectors(t *testing.T) {
	cases := []struct {
		vectors string
		dir     string
		// roundTrip: decode(encode(s)) == s holds (not for SPM, whose
		// normalizer adds a leading ▁ that decode strips).
		roundTrip bool
	}{
		{"qwen2", "qwen2.5", true},          // vocab.json + merges.txt
		{"qwen2", "qwen3", true},            // tokenizer.json (gzipped)
		{"deepseek-r1-qwen", "qwen3", true}, // same BPE as Qwen
		{"deepseek-r1-qwen", "qwen2.5", true},
		{"gpt-2", "gpt2", true},
		{"roberta-bpe", "roberta-base", true},
		{"phi-3", "phi-3.5-mini", false},
		{"llama-spm", "phi-3.5-mini", false},
	}
	for _, tc := range cases {
		t.Run(tc.vectors+"/"+tc.dir, func(t *testing.T) {
			tok := loadFixture(t, tc.dir)
			inputs, want := goldenVectors(t, tc.vectors)
			require.Len(t, inputs, 46)
			for i, in := range inputs {
				got := tok.Encode(in)
				if !assert.Equal(t, want[i], append([]int32{}, got...), "input %d %q", i, in) {
					continue
				}
				if tc.roundTrip {
					assert.Equal(t, in, tok.Decode(got, false), "round trip of input %d", i)
				}
			}
		})
	}
}

func TestQwenAddedTokensAndSpecialIDs(t *testing.T) {
	for _, dir := range []string{"qwen2.5", "qwen3"} {
		t.Run(dir, func(t *testing.T) {
			tok := loadFixture(t, dir)
			text := "<|im_start|>user\nHi<tool_call>{}</tool_call><|im_end|>\n"
			ids := tok.Encode(text)
			imStart, _ := tok.TokenID("<|im_start|>")
			imEnd, _ := tok.TokenID("<|im_end|>")
			toolCall, _ := tok.TokenID("<tool_call>")
			assert.Equal(t, int32(151644), imStart)
			assert.Equal(t, int32(151645), imEnd)
			assert.Equal(t, int32(151657), toolCall)
			assert.Equal(t, imStart, ids[0])
			assert.Contains(t, ids, toolCall)
			assert.Equal(t, text, tok.Decode(ids, false))
			// Special tokens are skipped, non-special added ones kept.
			assert.Equal(t, "user\nHi<tool_call>{}</tool_call>\n", tok.Decode(ids, true))
			sp := tok.Special()
			assert.Equal(t, imEnd, sp.EOS)
			assert.Equal(t, int32(151643), sp.PAD)
			assert.Equal(t, int32(-1), sp.BOS)
			assert.Contains(t, sp.EndOfTurn, imEnd)
			assert.Contains(t, sp.EndOfTurn, int32(151643))
			assert.GreaterOrEqual(t, tok.VocabSize(), 151665)
			_, ok := tok.ChatTemplate("")
			assert.True(t, ok, "chat template from tokenizer_config.json")
		})
	}
}

func TestStreamDecoderSplitsNoCharacter(t *testing.T) {
	text := "héllo 世界 🎉 done\n\tcafé 👩‍👩‍👧"
	for _, dir := range []string{"qwen3", "gpt2", "phi-3.5-mini"} {
		t.Run(dir, func(t *testing.T) {
			tok := loadFixture(t, dir)
			ids := tok.Encode(text)
			d := tok.NewStreamDecoder(false)
			var got strings.Builder
			for _, id := range ids {
				piece := d.Next(id)
				assert.NotContains(t, piece, "\uFFFD", "emitted half a character")
				got.WriteString(piece)
			}
			assert.Equal(t, tok.Decode(ids, false), got.String())
		})
	}
}

func TestSplitterMatchesGenericEvaluator(t *testing.T) {
	inputs := []string{
		"Hello world's  \n\n  foo123 4567 ___ 'LL 'S \u017f x",
		" \t\r\n  a  b\n\n\n c   ",
		"世界 مرحبا  Привет!!\n\r\n?? 🦙🦙 3.14159",
		"   ", "", "'", "a'", "\n", " \n ",
	}
	for _, pattern := range []string{PatternGPT2, PatternQwen2, PatternLlama3} {
		fast, err := newSplitter(pattern)
		require.NoError(t, err)
		generic, err := compileSplitRegex(pattern)
		require.NoError(t, err)
		for _, in := range inputs {
			assert.Equal(t, splitAll(generic, in), splitAll(fast, in), "pattern %q input %q", pattern, in)
		}
	}
}

func splitAll(s splitter, in string) []string {
	out := []string{}
	s.split(in, func(p string) { out = append(out, p) })
	return out
}

// TestPreTokenizerSplitsMatchPythonRegex compares the pieces our
// pre-tokenizers cut against splits.json, made with Python's regex module
// (real look-ahead) for the GPT-2, Qwen2, Llama 3 and DeepSeek-V3 patterns;
// the last is a Sequence of three Splits and runs on the generic evaluator.
func TestPreTokenizerSplitsMatchPythonRegex(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(tokenizerTestdata, "splits", "splits.json"))
	require.NoError(t, err)
	var golden struct {
		Patterns map[string][]string   `json:"patterns"`
		Inputs   []string              `json:"inputs"`
		Splits   map[string][][]string `json:"splits"`
	}
	require.NoError(t, json.Unmarshal(data, &golden))
	require.Len(t, golden.Patterns, 4)
	for name, patterns := range golden.Patterns {
		t.Run(name, func(t *testing.T) {
			var steps []any
			for _, p := range patterns {
				steps = append(steps, map[string]any{"type": "Split", "pattern": map[string]any{"Regex": p}, "behavior": "Isolated", "invert": false})
			}
			steps = append(steps, map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false})
			raw, err := json.Marshal(map[string]any{"type": "Sequence", "pretokenizers": steps})
			require.NoError(t, err)
			pre, byteLevel, err := buildPreTokenizer(raw)
			require.NoError(t, err)
			assert.True(t, byteLevel)
			for i, in := range golden.Inputs {
				got := []string{}
				if in != "" {
					pre.preTokenize(in, true, func(p string) { got = append(got, p) })
				}
				assert.Equal(t, golden.Splits[name][i], got, "input %d %q", i, in)
			}
		})
	}
}

// TestConcurrentUse runs encode, decode and rendering from many goroutines
// (rollouts share one Tokenizer and Template); the race detector checks it.
func TestConcurrentUse(t *testing.T) {
	tok := loadFixture(t, "qwen3")
	tmpl, err := tok.Template("")
	require.NoError(t, err)
	texts := []string{"Hello world, 世界!", "func main() {\n\treturn\n}", "<|im_start|>user\nhi<|im_end|>", "  spaces  "}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				s := texts[(g+i)%len(texts)] + strconv.Itoa(i)
				if got := tok.Decode(tok.Encode(s), false); got != s {
					t.Errorf("round trip of %q gave %q", s, got)
				}
				if _, err := tmpl.Render([]Message{{Role: "user", Content: s}}, nil, true, nil); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
}
