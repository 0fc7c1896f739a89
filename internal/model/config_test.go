package model

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// qwen3Small is shaped like Qwen/Qwen3-0.6B's config.json.
const qwen3Small = `{
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}`

// llama3Like is shaped like a Llama 3.2 config: no head_dim, list eos,
// llama3 rope scaling.
const llama3Like = `{
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "vocab_size": 128256,
  "hidden_size": 2048,
  "intermediate_size": 8192,
  "num_hidden_layers": 16,
  "num_attention_heads": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "max_position_embeddings": 131072,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "pretraining_tp": 1
}`

// qwen2Minimal leaves out every key that has a default.
const qwen2Minimal = `{
  "architectures": ["Qwen2ForCausalLM"],
  "model_type": "qwen2",
  "vocab_size": 151936,
  "hidden_size": 896,
  "intermediate_size": 4864,
  "num_hidden_layers": 24,
  "num_attention_heads": 14,
  "num_key_value_heads": 2,
  "max_position_embeddings": 32768
}`

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name  string
		json  string
		check func(t *testing.T, c *Config)
	}{
		{"qwen3", qwen3Small, func(t *testing.T, c *Config) {
			assert.Equal(t, "qwen3", c.ModelType)
			assert.Equal(t, 128, c.HeadDim)
			assert.Equal(t, 8, c.NumKeyValueHeads)
			assert.Equal(t, 1e6, c.RopeTheta)
			assert.Equal(t, TokenIDs{151645}, c.EOSTokenID)
			assert.Nil(t, c.PadTokenID)
			assert.True(t, c.TieWordEmbeddings)
			assert.True(t, c.HasQKNorm())
			assert.False(t, c.HasQKVBias())
			assert.Equal(t, "bfloat16", c.TorchDType)
		}},
		{"llama3", llama3Like, func(t *testing.T, c *Config) {
			assert.Equal(t, 64, c.HeadDim, "head_dim defaults to hidden_size/num_attention_heads")
			assert.Equal(t, TokenIDs{128001, 128008, 128009}, c.EOSTokenID)
			assert.JSONEq(t, `{"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"}`, string(c.RopeScaling))
			assert.False(t, c.HasQKNorm())
			assert.Contains(t, c.Extra, "pretraining_tp")
		}},
		{"qwen2 defaults", qwen2Minimal, func(t *testing.T, c *Config) {
			assert.Equal(t, 64, c.HeadDim)
			assert.Equal(t, "silu", c.HiddenAct)
			assert.Equal(t, 1e-6, c.RMSNormEps)
			assert.Equal(t, 10000.0, c.RopeTheta)
			assert.Equal(t, "float32", c.TorchDType)
			assert.False(t, c.TieWordEmbeddings)
			assert.True(t, c.HasQKVBias(), "Qwen2 always has q/k/v bias")
			assert.False(t, c.HasOProjBias())
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseConfig("config.json", []byte(tt.json))
			require.NoError(t, err)
			tt.check(t, c)
		})
	}
}

func TestConfigRoundTripKeepsUnknownKeys(t *testing.T) {
	for _, src := range []string{qwen3Small, llama3Like} {
		c, err := ParseConfig("config.json", []byte(src))
		require.NoError(t, err)
		enc, err := c.Encode()
		require.NoError(t, err)

		var before, after map[string]any
		require.NoError(t, json.Unmarshal([]byte(src), &before))
		require.NoError(t, json.Unmarshal(enc, &after))
		for k, v := range before {
			assert.Equal(t, v, after[k], "key %q", k)
		}
		again, err := ParseConfig("config.json", enc)
		require.NoError(t, err)
		assert.Equal(t, c, again)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	edit := func(key string, value any) string {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(qwen3Small), &m))
		if value == nil {
			delete(m, key)
		} else {
			m[key] = value
		}
		b, err := json.Marshal(m)
		require.NoError(t, err)
		return string(b)
	}
	tests := []struct {
		name, json, field, msg string
	}{
		{"no architectures", edit("architectures", nil), "architectures", "missing"},
		{"unknown architecture", edit("architectures", []string{"GPT2LMHeadModel"}), "architectures", "not supported"},
		{"model_type mismatch", edit("model_type", "llama"), "model_type", "does not match"},
		{"zero hidden", edit("hidden_size", 0), "hidden_size", "positive"},
		{"negative layers", edit("num_hidden_layers", -1), "num_hidden_layers", "positive"},
		{"no vocab", edit("vocab_size", nil), "vocab_size", "positive"},
		{"kv heads do not divide", edit("num_key_value_heads", 3), "num_key_value_heads", "divide"},
		{"odd head_dim", edit("head_dim", 7), "head_dim", "even"},
		{"gelu", edit("hidden_act", "gelu"), "hidden_act", "silu"},
		{"zero eps", edit("rms_norm_eps", 0), "rms_norm_eps", "> 0"},
		{"zero theta", edit("rope_theta", 0), "rope_theta", "> 0"},
		{"rope_scaling not object", edit("rope_scaling", "linear"), "rope_scaling", "object"},
		{"rope_scaling no type", edit("rope_scaling", map[string]any{"factor": 2}), "rope_scaling", "rope_type"},
		{"bad dtype", edit("torch_dtype", "int8"), "torch_dtype", "int8"},
		{"eos out of vocab", edit("eos_token_id", 151936), "eos_token_id", "outside the vocabulary"},
		{"pad negative", edit("pad_token_id", -1), "pad_token_id", "outside"},
		{"bos is a string", edit("bos_token_id", "<s>"), "bos_token_id", "integer"},
		{"hidden is a string", edit("hidden_size", "1024"), "hidden_size", "cannot decode"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseConfig("m/config.json", []byte(tt.json))
			require.Error(t, err)
			var fe *FieldError
			require.True(t, errors.As(err, &fe), "want *FieldError, got %T: %v", err, err)
			assert.Equal(t, tt.field, fe.Field)
			assert.Equal(t, "m/config.json", fe.File)
			assert.Contains(t, err.Error(), tt.msg)
			assert.Contains(t, err.Error(), `"`+tt.field+`"`)
		})
	}
}

func TestParseConfigRejectsNonObject(t *testing.T) {
	for _, src := range []string{"", "[]", "null x", "{"} {
		_, err := ParseConfig("c.json", []byte(src))
		require.Error(t, err, "input %q", src)
		assert.True(t, strings.HasPrefix(err.Error(), "c.json"), err.Error())
	}
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	_, err := LoadConfig(dir)
	require.ErrorIs(t, err, os.ErrNotExist)
	require.NoError(t, os.WriteFile(filepath.Join(dir, ConfigFile), []byte(qwen3Small), 0o644))
	c, err := LoadConfig(dir)
	require.NoError(t, err)
	assert.Equal(t, 28, c.NumHiddenLayers)
}

func TestNumParams(t *testing.T) {
	c, err := ParseConfig("config.json", []byte(qwen3Small))
	require.NoError(t, err)
	// Qwen3-0.6B is 596,049,920 parameters with tied embeddings.
	assert.Equal(t, int64(596049920), c.NumParams())

	var total int64
	for _, s := range c.TensorSpecs(F32) {
		total += s.ByteLen() / 4
	}
	assert.Equal(t, c.NumParams(), total, "TensorSpecs and NumParams agree")
}

func TestConfigEncodeKeepsAngleBrackets(t *testing.T) {
	c, err := ParseConfig("config.json", []byte(strings.Replace(qwen3Small, `"use_cache": true`, `"use_cache": true, "note": "<|im_end|> & co"`, 1)))
	require.NoError(t, err)
	enc, err := c.Encode()
	require.NoError(t, err)
	assert.Contains(t, string(enc), `"note": "<|im_end|> & co"`)
	assert.True(t, strings.HasSuffix(string(enc), "}\n"))
}

func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{qwen3Small, llama3Like, qwen2Minimal, `{}`, `{"architectures":["LlamaForCausalLM"],"eos_token_id":[1,2]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfig("config.json", b)
		if err != nil {
			return
		}
		// Whatever is accepted must encode and parse back to the same config.
		enc, err := c.Encode()
		if err != nil {
			t.Fatalf("encode accepted config: %v", err)
		}
		again, err := ParseConfig("config.json", enc)
		if err != nil {
			t.Fatalf("re-parse encoded config: %v\n%s", err, enc)
		}
		if c.NumParams() != again.NumParams() || c.HeadDim != again.HeadDim || len(c.Extra) != len(again.Extra) {
			t.Fatalf("round trip changed the config:\n%+v\n%+v", c, again)
		}
	})
}

// transformers 5 writes rope_theta inside rope_parameters and dtype for
// torch_dtype; both must be read, never silently defaulted.
func TestParseConfigTransformers5Keys(t *testing.T) {
	base := `"architectures":["Qwen3ForCausalLM"],"model_type":"qwen3","vocab_size":320,"hidden_size":64,
		"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,"max_position_embeddings":2048`
	c, err := ParseConfig("config.json", []byte(`{`+base+`,"dtype":"bfloat16","rope_parameters":{"rope_theta":1000000.0,"rope_type":"default"}}`))
	require.NoError(t, err)
	assert.Equal(t, 1e6, c.RopeTheta)
	assert.Equal(t, "bfloat16", c.TorchDType)
	assert.Nil(t, c.RopeScaling)
	assert.Contains(t, c.Extra, "rope_parameters", "kept for the round trip")

	c, err = ParseConfig("config.json", []byte(`{`+base+`,"rope_parameters":{"rope_theta":500000.0,"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}}`))
	require.NoError(t, err)
	assert.Equal(t, 5e5, c.RopeTheta)
	assert.JSONEq(t, `{"rope_theta":500000.0,"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}`, string(c.RopeScaling))

	_, err = ParseConfig("config.json", []byte(`{`+base+`,"rope_parameters":{"full_attention":{"rope_theta":1e4}}}`))
	var fe *FieldError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, "rope_parameters", fe.Field)
}

// Issue 24 (found by the Hugging Face parity check): configs whose
// attention ortrain would compute differently from transformers are named,
// not trained on silently.
func TestSlidingWindowAndMLPBias(t *testing.T) {
	for _, tc := range []struct {
		name   string
		typ    string
		extra  map[string]string
		window int
	}{
		{"mistral window", "mistral", map[string]string{"sliding_window": "4096"}, 4096},
		{"mistral no window", "mistral", map[string]string{"sliding_window": "null"}, 0},
		{"qwen2 off", "qwen2", map[string]string{"sliding_window": "16", "use_sliding_window": "false", "max_window_layers": "1"}, 0},
		{"qwen2 on", "qwen2", map[string]string{"sliding_window": "16", "use_sliding_window": "true", "max_window_layers": "1"}, 16},
		{"qwen2 on but no layer from max_window_layers", "qwen2", map[string]string{"sliding_window": "16", "use_sliding_window": "true", "max_window_layers": "2"}, 0},
		{"layer_types", "llama", map[string]string{"sliding_window": "8", "layer_types": `["full_attention","sliding_attention"]`}, 8},
		{"layer_types all full", "mistral", map[string]string{"sliding_window": "8", "layer_types": `["full_attention","full_attention"]`}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Config{ModelType: tc.typ, NumHiddenLayers: 2, Extra: map[string]json.RawMessage{}}
			for k, v := range tc.extra {
				c.Extra[k] = json.RawMessage(v)
			}
			assert.Equal(t, tc.window, c.SlidingWindow())
		})
	}
	preset, ok := PresetByName("tiny")
	require.True(t, ok)
	dir := t.TempDir()
	require.NoError(t, InitOverwrite(dir, preset, 1))
	c, err := LoadConfig(dir)
	require.NoError(t, err)
	c.Extra["mlp_bias"] = json.RawMessage("true")
	var fe *FieldError
	require.ErrorAs(t, c.Validate(), &fe)
	assert.Equal(t, "mlp_bias", fe.Field)
}
