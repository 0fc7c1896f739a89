package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// qwen3_4BConfig is Qwen/Qwen3-4B's config.json (testdata/models).
func qwen3_4BConfig(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("../../testdata/models/qwen3-4b/config.json")
	require.NoError(t, err)
	return b
}

// smokeSource makes a source model directory: config.json (skipped when
// empty) plus files copied from testdata/tokenizers/<tokDir>.
func smokeSource(t *testing.T, config []byte, tokDir string, files ...string) string {
	t.Helper()
	dir := t.TempDir()
	if config != nil {
		require.NoError(t, os.WriteFile(filepath.Join(dir, ConfigFile), config, 0o644))
	}
	for _, f := range files {
		b := readFile(t, filepath.Join("..", "..", "testdata", "tokenizers", tokDir, f))
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
	return dir
}

func TestInitSmoke(t *testing.T) {
	llama := readFile(t, filepath.Join("..", "..", "testdata", "worker", "micro-llama", "config.json"))
	cases := []struct {
		name    string
		config  []byte
		tokDir  string
		files   []string
		maxPos  int
		tensors []string // present beyond the common set
		absent  []string
		extra   map[string]string // Extra keys of the smoke config.json
	}{
		{
			name: "Qwen3-4B", config: qwen3_4BConfig(t), tokDir: "qwen3",
			files: []string{"tokenizer.json.gz", "tokenizer_config.json"}, maxPos: 4096,
			tensors: []string{"model.layers.1.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight"},
			absent:  []string{"lm_head.weight", "model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.o_proj.bias"},
			extra:   map[string]string{"max_window_layers": "2", "use_sliding_window": "false", "sliding_window": "null"},
		},
		{
			name: "Llama (rope llama3, attention_bias, untied)", config: llama, tokDir: "qwen2.5",
			files: []string{"vocab.json", "merges.txt", "tokenizer_config.json"}, maxPos: 512,
			tensors: []string{"lm_head.weight", "model.layers.0.self_attn.q_proj.bias", "model.layers.1.self_attn.o_proj.bias"},
			absent:  []string{"model.layers.0.self_attn.q_norm.weight"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := smokeSource(t, tc.config, tc.tokDir, tc.files...)
			want, err := LoadConfig(src)
			require.NoError(t, err)
			parent := t.TempDir()
			dir := filepath.Join(parent, "smoke")
			got, err := InitSmoke(dir, src, 1)
			require.NoError(t, err)
			require.NoError(t, got.Validate())

			onDisk, err := LoadConfig(dir)
			require.NoError(t, err)
			assert.Equal(t, got, onDisk, "the returned config is the one written")
			kept := func(c *Config) []any {
				return []any{c.Architectures, c.ModelType, c.VocabSize, c.BOSTokenID, c.EOSTokenID, c.PadTokenID,
					c.TieWordEmbeddings, c.AttentionBias, c.RopeTheta, string(c.RopeScaling), c.RMSNormEps, c.HiddenAct}
			}
			assert.Equal(t, kept(want), kept(got), "family and behaviour fields kept from the source")
			assert.Equal(t, []int{2, 64, 4, 2, 16, 128, tc.maxPos},
				[]int{got.NumHiddenLayers, got.HiddenSize, got.NumAttentionHeads, got.NumKeyValueHeads, got.HeadDim, got.IntermediateSize, got.MaxPositionEmbeddings})
			assert.Equal(t, "float32", got.TorchDType)
			assert.Equal(t, 0.02, got.InitializerRange)
			assert.Zero(t, got.SlidingWindow())
			for k, v := range tc.extra {
				assert.Equal(t, v, string(got.Extra[k]), k)
			}

			entries, err := os.ReadDir(parent)
			require.NoError(t, err)
			require.Len(t, entries, 1, "no temp dirs left beside the model")
			entries, err = os.ReadDir(dir)
			require.NoError(t, err)
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			wantNames := append([]string{ConfigFile, SingleWeightsFile}, tc.files...)
			slices.Sort(wantNames)
			assert.Equal(t, wantNames, names, "no invented generation_config.json")
			for _, f := range tc.files {
				assert.True(t, bytes.Equal(readFile(t, filepath.Join(src, f)), readFile(t, filepath.Join(dir, f))), "%s copied byte for byte", f)
			}

			h, err := ReadSafetensorsHeader(filepath.Join(dir, SingleWeightsFile))
			require.NoError(t, err)
			specs := got.TensorSpecs(F32)
			require.Len(t, h.Tensors, len(specs))
			for _, s := range specs {
				ti, ok := h.Tensor(s.Name)
				if assert.True(t, ok, s.Name) {
					assert.Equal(t, F32, ti.DType, s.Name)
					assert.Equal(t, s.Shape, ti.Shape, s.Name)
				}
			}
			for _, n := range tc.tensors {
				_, ok := h.Tensor(n)
				assert.True(t, ok, "want %s", n)
			}
			for _, n := range tc.absent {
				_, ok := h.Tensor(n)
				assert.False(t, ok, "want no %s", n)
			}
			emb, _ := h.Tensor("model.embed_tokens.weight")
			assert.Equal(t, []int64{int64(want.VocabSize), 64}, emb.Shape)

			weights := readFile(t, filepath.Join(dir, SingleWeightsFile))
			for _, seed := range []int64{1, 2} {
				again := filepath.Join(t.TempDir(), "again")
				_, err := InitSmoke(again, src, seed)
				require.NoError(t, err)
				same := bytes.Equal(weights, readFile(t, filepath.Join(again, SingleWeightsFile)))
				assert.Equal(t, seed == 1, same, "seed %d", seed)
				assert.Equal(t, readFile(t, filepath.Join(dir, ConfigFile)), readFile(t, filepath.Join(again, ConfigFile)))
			}
		})
	}
}

func TestInitSmokeLayerSettings(t *testing.T) {
	cases := []struct {
		name, extra       string
		wantMaxWindow     string
		wantLayerTypes    string
		wantSlidingWindow int
	}{
		{"no sliding", `"use_sliding_window": false, "sliding_window": 4096, "max_window_layers": 28`, "2", "", 0},
		{"sliding from max_window_layers on", `"use_sliding_window": true, "sliding_window": 4096, "max_window_layers": 21`, "1", "", 4096},
		{"all sliding", `"use_sliding_window": true, "sliding_window": 4096, "max_window_layers": 0`, "0", "", 4096},
		{"layer_types", `"sliding_window": 4096, "layer_types": ["full_attention", "full_attention", "sliding_attention"]`,
			"", `["full_attention","sliding_attention"]`, 4096},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			layers := 28
			if tc.wantLayerTypes != "" {
				layers = 3
			}
			data := []byte(`{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 1000, "hidden_size": 256,
				"intermediate_size": 512, "num_attention_heads": 8, "num_hidden_layers": ` + jsonInt(layers) + `, "max_position_embeddings": 32768,
				"torch_dtype": "bfloat16", "dtype": "bfloat16", "quantization_config": {"bits": 4}, ` + tc.extra + `}`)
			c, err := ParseConfig("config.json", data)
			require.NoError(t, err)
			shrinkConfig(c)
			require.NoError(t, c.Validate())
			assert.Equal(t, tc.wantMaxWindow, string(c.Extra["max_window_layers"]))
			assert.Equal(t, tc.wantLayerTypes, string(c.Extra["layer_types"]))
			assert.Equal(t, tc.wantSlidingWindow, c.SlidingWindow())
			assert.Equal(t, `"float32"`, string(c.Extra["dtype"]))
			assert.NotContains(t, c.Extra, "quantization_config")
		})
	}
}

func jsonInt(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestInitSmokeMissingFiles(t *testing.T) {
	cfg := qwen3_4BConfig(t)
	cases := []struct {
		name  string
		setup func(dir string)
		want  []string
	}{
		{"empty", func(string) {}, []string{missingConfig, missingTokenizer, missingChatTemplate}},
		{"config only", func(dir string) { write(t, dir, ConfigFile, cfg) }, []string{missingTokenizer, missingChatTemplate}},
		{"vocab without merges, tokenizer_config without template", func(dir string) {
			write(t, dir, ConfigFile, cfg)
			write(t, dir, "vocab.json", []byte(`{}`))
			write(t, dir, "tokenizer_config.json", []byte(`{"chat_template": null}`))
		}, []string{missingTokenizer, missingChatTemplate}},
		{"no config", func(dir string) {
			write(t, dir, "tokenizer.json", []byte(`{}`))
			write(t, dir, "chat_template.jinja", []byte(`{{ messages }}`))
		}, []string{missingConfig}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := t.TempDir()
			tc.setup(src)
			dir := filepath.Join(t.TempDir(), "smoke")
			_, err := InitSmoke(dir, src, 1)
			var mf *MissingFilesError
			require.True(t, errors.As(err, &mf), "got %v", err)
			assert.Equal(t, src, mf.Dir)
			assert.Equal(t, tc.want, mf.Missing)
			assert.Contains(t, err.Error(), "hf download")
			for _, m := range tc.want {
				assert.Contains(t, err.Error(), m)
			}
			assert.NoDirExists(t, dir)
		})
	}
	// A hub cache snapshot path names the repo in the hint.
	err := &MissingFilesError{Dir: "/c/hub/models--Qwen--Qwen3-4B/snapshots/abc", Missing: []string{missingTokenizer}}
	assert.Contains(t, err.Error(), "hf download Qwen/Qwen3-4B config.json tokenizer.json tokenizer_config.json")
}

func write(t *testing.T, dir, name string, b []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o644))
}

// stubSource is a source whose tokenizer files only need to exist.
func stubSource(t *testing.T, config []byte) string {
	t.Helper()
	src := t.TempDir()
	write(t, src, ConfigFile, config)
	write(t, src, "tokenizer.json", []byte(`{}`))
	write(t, src, "chat_template.jinja", []byte(`{{ messages }}`))
	return src
}

func TestInitSmokeRefuses(t *testing.T) {
	micro := readFile(t, filepath.Join("..", "..", "testdata", "worker", "micro-qwen3", "config.json"))
	t.Run("non-empty target", func(t *testing.T) {
		dir := t.TempDir()
		write(t, dir, "keep.txt", []byte("mine"))
		_, err := InitSmoke(dir, stubSource(t, micro), 1)
		var ne *DirNotEmptyError
		require.True(t, errors.As(err, &ne), "got %v", err)
		assert.Equal(t, dir, ne.Dir)
		assert.Equal(t, []byte("mine"), readFile(t, filepath.Join(dir, "keep.txt")))
	})
	t.Run("empty target is filled", func(t *testing.T) {
		dir := t.TempDir()
		_, err := InitSmoke(dir, stubSource(t, micro), 1)
		require.NoError(t, err)
		assert.FileExists(t, filepath.Join(dir, SingleWeightsFile))
	})
	t.Run("unsupported architecture", func(t *testing.T) {
		cfg := bytes.Replace(bytes.Replace(micro, []byte("Qwen3ForCausalLM"), []byte("Gemma2ForCausalLM"), 1),
			[]byte(`"qwen3"`), []byte(`"gemma2"`), 1)
		dir := filepath.Join(t.TempDir(), "smoke")
		_, err := InitSmoke(dir, stubSource(t, cfg), 1)
		var fe *FieldError
		require.True(t, errors.As(err, &fe), "got %v", err)
		assert.Equal(t, "architectures", fe.Field)
		assert.Contains(t, err.Error(), "Gemma2ForCausalLM")
		assert.NoDirExists(t, dir)
	})
}
