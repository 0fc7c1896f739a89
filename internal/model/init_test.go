package model

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var modelFiles = []string{"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}

func initTiny(t *testing.T, seed int64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tiny")
	tiny, ok := PresetByName("tiny")
	require.True(t, ok)
	require.NoError(t, Init(dir, tiny, seed))
	return dir
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

func TestInitDeterministic(t *testing.T) {
	a, b, c := initTiny(t, 42), initTiny(t, 42), initTiny(t, 43)
	entries, err := os.ReadDir(a)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.Equal(t, modelFiles, names, "exactly the model files, no temp leftovers")
	for _, f := range modelFiles {
		assert.True(t, bytes.Equal(readFile(t, filepath.Join(a, f)), readFile(t, filepath.Join(b, f))), "%s differs for the same seed", f)
		same := bytes.Equal(readFile(t, filepath.Join(a, f)), readFile(t, filepath.Join(c, f)))
		assert.Equal(t, f != "model.safetensors", same, "%s: only the weights depend on the seed", f)
	}
}

func TestInitTensors(t *testing.T) {
	dir := initTiny(t, 7)
	cfg, err := LoadConfig(dir)
	require.NoError(t, err)
	tiny, _ := PresetByName("tiny")
	assert.Equal(t, &tiny.Config, cfg, "config.json round-trips to the preset")
	assert.Equal(t, 320, cfg.VocabSize)
	assert.Zero(t, cfg.VocabSize%64)
	assert.GreaterOrEqual(t, cfg.VocabSize, ByteTokenizerSize())

	h, tensors, err := ReadSafetensors(filepath.Join(dir, SingleWeightsFile))
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"format": "pt"}, h.Metadata)
	got := map[string]Tensor{}
	for _, ts := range tensors {
		got[ts.Name] = ts
	}
	want := []string{"model.embed_tokens.weight", "model.norm.weight"}
	for _, l := range []string{"0", "1"} {
		for _, n := range []string{"input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
			"self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"} {
			want = append(want, "model.layers."+l+"."+n+".weight")
		}
	}
	var gotNames []string
	for n := range got {
		gotNames = append(gotNames, n)
	}
	sort.Strings(want)
	sort.Strings(gotNames)
	assert.Equal(t, want, gotNames, "HF tensor names; no lm_head with tied embeddings")

	shapes := map[string][]int64{
		"model.embed_tokens.weight":              {320, 64},
		"model.layers.0.self_attn.q_proj.weight": {64, 64},
		"model.layers.0.self_attn.k_proj.weight": {32, 64},
		"model.layers.0.self_attn.o_proj.weight": {64, 64},
		"model.layers.1.self_attn.q_norm.weight": {16},
		"model.layers.1.mlp.down_proj.weight":    {64, 128},
		"model.layers.1.mlp.gate_proj.weight":    {128, 64},
	}
	for n, s := range shapes {
		assert.Equal(t, s, got[n].Shape, n)
		assert.Equal(t, F32, got[n].DType, n)
	}

	for _, n := range []string{"model.norm.weight", "model.layers.0.self_attn.k_norm.weight", "model.layers.1.input_layernorm.weight"} {
		for _, v := range DecodeF32(got[n].Data) {
			require.Equal(t, float32(1), v, n)
		}
	}
	emb := DecodeF32(got["model.embed_tokens.weight"].Data)
	pad := cfg.PadTokenID[0]
	for _, v := range emb[pad*64 : (pad+1)*64] {
		require.Zero(t, v, "padding row of the embedding is zero")
	}
	// Matrices are N(0, 0.02): check the sample std over all of them.
	var sum, sq, n float64
	for name, ts := range got {
		if len(ts.Shape) != 2 || name == "model.embed_tokens.weight" {
			continue
		}
		for _, v := range DecodeF32(ts.Data) {
			sum += float64(v)
			sq += float64(v) * float64(v)
			n++
		}
	}
	mean := sum / n
	std := math.Sqrt(sq/n - mean*mean)
	assert.InDelta(t, 0, mean, 0.001)
	assert.InDelta(t, 0.02, std, 0.0005, "n=%v", n)
}

func TestInitTokenizerJSON(t *testing.T) {
	dir := initTiny(t, 1)
	var tok struct {
		AddedTokens  []AddedToken    `json:"added_tokens"`
		Normalizer   json.RawMessage `json:"normalizer"`
		PreTokenizer struct {
			Type          string `json:"type"`
			PreTokenizers []struct {
				Type     string            `json:"type"`
				Pattern  map[string]string `json:"pattern"`
				Behavior string            `json:"behavior"`
				UseRegex *bool             `json:"use_regex"`
			} `json:"pretokenizers"`
		} `json:"pre_tokenizer"`
		Decoder struct{ Type string } `json:"decoder"`
		Model   struct {
			Type   string         `json:"type"`
			Vocab  map[string]int `json:"vocab"`
			Merges []any          `json:"merges"`
		} `json:"model"`
	}
	raw := readFile(t, filepath.Join(dir, "tokenizer.json"))
	require.True(t, json.Valid(raw))
	require.NoError(t, json.Unmarshal(raw, &tok))
	assert.Contains(t, string(raw), `"<|im_end|>"`, "no HTML escaping of special tokens")

	assert.Equal(t, "BPE", tok.Model.Type)
	assert.Empty(t, tok.Model.Merges)
	assert.JSONEq(t, `{"type":"NFC"}`, string(tok.Normalizer), "Qwen2Tokenizer's NFC, declared where ortrain reads it")
	assert.Equal(t, "ByteLevel", tok.Decoder.Type)
	require.Len(t, tok.PreTokenizer.PreTokenizers, 2)
	assert.Equal(t, "Split", tok.PreTokenizer.PreTokenizers[0].Type)
	assert.Equal(t, qwen2PreTokenizerRegex, tok.PreTokenizer.PreTokenizers[0].Pattern["Regex"])
	assert.Equal(t, "Isolated", tok.PreTokenizer.PreTokenizers[0].Behavior)
	assert.Equal(t, "ByteLevel", tok.PreTokenizer.PreTokenizers[1].Type)
	assert.False(t, *tok.PreTokenizer.PreTokenizers[1].UseRegex)

	// The vocabulary is the 256 byte symbols with ids 0..255, one symbol each.
	require.Len(t, tok.Model.Vocab, 256)
	ids := map[int]bool{}
	for sym, id := range tok.Model.Vocab {
		assert.Equal(t, 1, utf8.RuneCountInString(sym))
		assert.True(t, id >= 0 && id < 256)
		ids[id] = true
	}
	assert.Len(t, ids, 256)
	assert.Equal(t, 0, tok.Model.Vocab["!"], "GPT-2 / Qwen id order")
	assert.Equal(t, 220, tok.Model.Vocab["Ġ"], "space maps to Ġ, id 220 as in GPT-2")
	assert.Equal(t, 198, tok.Model.Vocab["Ċ"], "newline maps to Ċ, id 198 as in GPT-2")

	want := []struct {
		content string
		id      int
		special bool
	}{
		{"<|endoftext|>", 256, true}, {"<|im_start|>", 257, true}, {"<|im_end|>", 258, true},
		{"<tool_call>", 259, false}, {"</tool_call>", 260, false},
		{"<tool_response>", 261, false}, {"</tool_response>", 262, false},
		{"<think>", 263, false}, {"</think>", 264, false},
	}
	require.Len(t, tok.AddedTokens, len(want))
	for i, w := range want {
		assert.Equal(t, w.content, tok.AddedTokens[i].Content)
		assert.Equal(t, w.id, tok.AddedTokens[i].ID)
		assert.Equal(t, w.special, tok.AddedTokens[i].Special, w.content)
		assert.False(t, tok.AddedTokens[i].Normalized)
	}
	assert.Equal(t, 265, ByteTokenizerSize())

	cfg, err := LoadConfig(dir)
	require.NoError(t, err)
	assert.Equal(t, TokenIDs{258}, cfg.EOSTokenID, "eos is <|im_end|>")
	assert.Equal(t, TokenIDs{256}, cfg.PadTokenID, "pad is <|endoftext|>")
	assert.Nil(t, cfg.BOSTokenID)
}

func TestInitTokenizerConfig(t *testing.T) {
	dir := initTiny(t, 1)
	var tc map[string]any
	require.NoError(t, json.Unmarshal(readFile(t, filepath.Join(dir, "tokenizer_config.json")), &tc))
	assert.Equal(t, "<|im_end|>", tc["eos_token"])
	assert.Equal(t, "<|endoftext|>", tc["pad_token"])
	assert.Nil(t, tc["bos_token"])
	assert.Equal(t, float64(2048), tc["model_max_length"])
	assert.Equal(t, ChatTemplate(), tc["chat_template"])
	dec := tc["added_tokens_decoder"].(map[string]any)
	assert.Len(t, dec, 9)
	assert.Equal(t, "<|im_start|>", dec["257"].(map[string]any)["content"])
	assert.Equal(t, false, dec["259"].(map[string]any)["special"])

	var gen map[string]any
	require.NoError(t, json.Unmarshal(readFile(t, filepath.Join(dir, "generation_config.json")), &gen))
	assert.Equal(t, []any{float64(258), float64(256)}, gen["eos_token_id"])
}

func TestChatTemplateIsQwen25Verbatim(t *testing.T) {
	sum := sha256.Sum256([]byte(ChatTemplate()))
	assert.Equal(t, "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f", hex.EncodeToString(sum[:]))
	for _, s := range []string{"<tools>", "</tools>", "<tool_call>\\n{\\\"name\\\": <function-name>", "<tool_response>", "<|im_start|>assistant\\n"} {
		assert.Contains(t, ChatTemplate(), s)
	}
}

func TestInitRefusesAndOverwrites(t *testing.T) {
	tiny, _ := PresetByName("tiny")
	root := t.TempDir()

	empty := filepath.Join(root, "empty")
	require.NoError(t, os.Mkdir(empty, 0o755))
	require.NoError(t, Init(empty, tiny, 1), "an existing empty dir is fine")

	err := Init(empty, tiny, 2)
	var ne *DirNotEmptyError
	require.True(t, errors.As(err, &ne), "got %v", err)
	assert.Equal(t, empty, ne.Dir)

	before := readFile(t, filepath.Join(empty, SingleWeightsFile))
	require.NoError(t, InitOverwrite(empty, tiny, 2))
	assert.False(t, bytes.Equal(before, readFile(t, filepath.Join(empty, SingleWeightsFile))), "weights replaced")

	notModel := filepath.Join(root, "home")
	require.NoError(t, os.Mkdir(notModel, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(notModel, "notes.txt"), []byte("keep"), 0o644))
	require.True(t, errors.As(InitOverwrite(notModel, tiny, 1), &ne), "overwrite refuses a directory that is not a model")
	assert.Equal(t, []byte("keep"), readFile(t, filepath.Join(notModel, "notes.txt")))

	nested := filepath.Join(root, "a", "b", "c")
	require.NoError(t, Init(nested, tiny, 1), "parents are created")

	entries, err := os.ReadDir(root)
	require.NoError(t, err)
	for _, e := range entries {
		assert.NotContains(t, e.Name(), ".tmp-", "no temp dirs left behind")
	}
}

func TestInitRejectsInvalidPreset(t *testing.T) {
	p, _ := PresetByName("tiny")
	p.Config.NumKeyValueHeads = 3
	err := Init(filepath.Join(t.TempDir(), "m"), p, 1)
	var fe *FieldError
	require.True(t, errors.As(err, &fe))
	assert.Equal(t, "num_key_value_heads", fe.Field)
}

func TestPresets(t *testing.T) {
	assert.Equal(t, []string{"tiny", "mini", "small100m"}, PresetNames())
	for _, p := range Presets() {
		require.NoError(t, p.Config.Validate(), p.Name)
		assert.Equal(t, []string{"Qwen3ForCausalLM"}, p.Config.Architectures)
		assert.True(t, p.Config.TieWordEmbeddings)
		assert.Equal(t, ByteVocabSize(), p.Config.VocabSize)
	}
	small, ok := PresetByName("small100m")
	require.True(t, ok)
	assert.InDelta(t, 100e6, float64(small.Config.NumParams()), 10e6)
	_, ok = PresetByName("huge")
	assert.False(t, ok)
}

func BenchmarkInitSmall100m(b *testing.B) {
	p, _ := PresetByName("small100m")
	for i := 0; i < b.N; i++ {
		dir := filepath.Join(b.TempDir(), "m")
		if err := Init(dir, p, int64(i)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(p.Config.NumParams()), "params")
}

// TestInitOtherFamilies checks that Init builds any supported config, as the
// worker's tests do to cover each architecture variant.
func TestInitOtherFamilies(t *testing.T) {
	tiny, _ := PresetByName("tiny")
	tests := []struct {
		name   string
		edit   func(c *Config)
		dtype  DType
		has    []string
		hasNot []string
	}{
		{"qwen2 biases bf16", func(c *Config) {
			c.Architectures, c.ModelType, c.TorchDType = []string{"Qwen2ForCausalLM"}, "qwen2", "bfloat16"
		}, BF16, []string{"model.layers.0.self_attn.q_proj.bias", "model.layers.1.self_attn.v_proj.bias"},
			[]string{"model.layers.0.self_attn.o_proj.bias", "model.layers.0.self_attn.q_norm.weight", "lm_head.weight"}},
		{"llama untied f16", func(c *Config) {
			c.Architectures, c.ModelType, c.TorchDType, c.TieWordEmbeddings = []string{"LlamaForCausalLM"}, "llama", "float16", false
		}, F16, []string{"lm_head.weight"}, []string{"model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.k_norm.weight"}},
		{"llama attention_bias", func(c *Config) {
			c.Architectures, c.ModelType, c.AttentionBias = []string{"LlamaForCausalLM"}, "llama", true
		}, F32, []string{"model.layers.0.self_attn.o_proj.bias", "model.layers.0.self_attn.k_proj.bias"}, nil},
		{"mistral", func(c *Config) {
			c.Architectures, c.ModelType = []string{"MistralForCausalLM"}, "mistral"
		}, F32, []string{"model.layers.1.mlp.up_proj.weight"}, []string{"model.layers.0.self_attn.q_norm.weight"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tiny
			p.Config.Architectures = nil
			tt.edit(&p.Config)
			dir := filepath.Join(t.TempDir(), "m")
			require.NoError(t, Init(dir, p, 5))
			cfg, err := LoadConfig(dir)
			require.NoError(t, err)
			tensors, err := ReadModelTensors(dir)
			require.NoError(t, err)
			assert.Len(t, tensors, len(cfg.TensorSpecs(tt.dtype)))
			var params int64
			for _, ts := range tensors {
				assert.Equal(t, tt.dtype, ts.DType, ts.Name)
				params += ts.NumElements()
			}
			assert.Equal(t, cfg.NumParams(), params)
			for _, n := range tt.has {
				assert.Contains(t, tensors, n)
			}
			for _, n := range tt.hasNot {
				assert.NotContains(t, tensors, n)
			}
			_, all, err := ReadSafetensors(filepath.Join(dir, SingleWeightsFile))
			require.NoError(t, err)
			for _, ts := range all {
				if strings.HasSuffix(ts.Name, ".bias") {
					assert.Equal(t, make([]byte, len(ts.Data)), ts.Data, "%s is zero", ts.Name)
				}
				if ts.Name == "model.norm.weight" {
					one := map[DType][]byte{F32: EncodeF32([]float32{1}), BF16: EncodeBF16([]float32{1}), F16: EncodeF16([]float32{1})}[tt.dtype]
					assert.Equal(t, one, ts.Data[:len(one)])
				}
			}
		})
	}
}

// TestInitGolden pins the tiny preset's seed-0 checkpoint, so a change to
// the initialisation (or to the Go RNG streams it uses) is noticed: runs
// recorded with a seed must stay reproducible. If the change is intended,
// regenerate with `ortrain init-model --preset tiny --out DIR` and update
// the hash printed by this test.
func TestInitGolden(t *testing.T) {
	h, err := Hash(initTiny(t, 0))
	require.NoError(t, err)
	assert.Equal(t, "13e25c77ff2e7efb52d9f281ce429dd904889fd7e23a8c6c456f6c539b899ff8", h)
}
