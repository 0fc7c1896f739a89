package model

import (
	"encoding/json"
	"fmt"
)

// Preset is a named model shape that Init can create from scratch.
type Preset struct {
	Name        string
	Description string
	Config      Config
}

// ByteVocabSize is the vocabulary of every preset: the byte-level
// tokenizer's ids rounded up to a multiple of 64 (the unused rows are
// never produced by the tokenizer; the padding keeps matmuls aligned).
func ByteVocabSize() int { return (ByteTokenizerSize() + 63) / 64 * 64 }

// Presets lists the built-in model shapes, smallest first. All are
// Qwen3-style (q/k RMSNorm, no biases, SwiGLU, tied embeddings) over the
// byte-level tokenizer.
func Presets() []Preset {
	return []Preset{
		{
			Name:        "tiny",
			Description: "2 layers x 64 hidden, ~0.1M parameters: tests and the CPU quickstart",
			Config:      qwen3Config(2, 64, 4, 2, 16, 128),
		},
		{
			Name:        "mini",
			Description: "2 layers x 128 hidden, ~0.3M parameters: the CPU tool-use demo (make demo)",
			Config:      qwen3Config(2, 128, 8, 4, 16, 256),
		},
		{
			Name:        "small100m",
			Description: "12 layers x 768 hidden, ~104M parameters: CPU benchmarks",
			Config:      qwen3Config(12, 768, 12, 4, 64, 3072),
		},
	}
}

// PresetNames lists the preset names in Presets order.
func PresetNames() []string {
	var names []string
	for _, p := range Presets() {
		names = append(names, p.Name)
	}
	return names
}

// PresetByName finds a preset.
func PresetByName(name string) (Preset, bool) {
	for _, p := range Presets() {
		if p.Name == name {
			return p, true
		}
	}
	return Preset{}, false
}

func qwen3Config(layers, hidden, heads, kvHeads, headDim, intermediate int) Config {
	return Config{
		Architectures:         []string{"Qwen3ForCausalLM"},
		ModelType:             "qwen3",
		VocabSize:             ByteVocabSize(),
		HiddenSize:            hidden,
		IntermediateSize:      intermediate,
		NumHiddenLayers:       layers,
		NumAttentionHeads:     heads,
		NumKeyValueHeads:      kvHeads,
		HeadDim:               headDim,
		HiddenAct:             "silu",
		RMSNormEps:            1e-6,
		RopeTheta:             10000,
		MaxPositionEmbeddings: 2048,
		TieWordEmbeddings:     true,
		TorchDType:            "float32",
		InitializerRange:      0.02,
		AttentionBias:         false,
		EOSTokenID:            TokenIDs{byteTokenID(TokenIMEnd)},
		PadTokenID:            TokenIDs{byteTokenID(TokenEndOfText)},
		Extra: map[string]json.RawMessage{
			"attention_dropout":    json.RawMessage("0.0"),
			"max_window_layers":    json.RawMessage(fmt.Sprint(layers)),
			"sliding_window":       json.RawMessage("null"),
			"use_cache":            json.RawMessage("true"),
			"use_sliding_window":   json.RawMessage("false"),
			"transformers_version": json.RawMessage(`"4.51.0"`),
		},
	}
}
