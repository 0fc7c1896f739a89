package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// ConfigFile is the name of the model configuration inside a model directory.
const ConfigFile = "config.json"

// supportedArchitectures maps each HF architecture this project can run to
// its model_type.
var supportedArchitectures = map[string]string{
	"LlamaForCausalLM":   "llama",
	"MistralForCausalLM": "mistral",
	"Qwen2ForCausalLM":   "qwen2",
	"Qwen3ForCausalLM":   "qwen3",
}

// SupportedDTypes are the torch_dtype values the worker can load.
var supportedTorchDTypes = []string{"float32", "bfloat16", "float16"}

// Config is a Hugging Face config.json for the Llama / Mistral / Qwen2 /
// Qwen2.5 / Qwen3 decoder family. Parse fills family defaults for keys the
// file leaves out, so every field holds the value transformers would use.
// Keys this type does not know are kept in Extra and written back unchanged.
type Config struct {
	Architectures         []string
	ModelType             string
	VocabSize             int
	HiddenSize            int
	IntermediateSize      int
	NumHiddenLayers       int
	NumAttentionHeads     int
	NumKeyValueHeads      int // defaults to NumAttentionHeads
	HeadDim               int // defaults to HiddenSize / NumAttentionHeads
	HiddenAct             string
	RMSNormEps            float64
	RopeTheta             float64
	RopeScaling           json.RawMessage // nil when absent or null
	MaxPositionEmbeddings int
	TieWordEmbeddings     bool
	TorchDType            string
	InitializerRange      float64
	AttentionBias         bool
	BOSTokenID            TokenIDs
	EOSTokenID            TokenIDs
	PadTokenID            TokenIDs

	// Extra holds every key of the file that has no field above.
	Extra map[string]json.RawMessage
}

// TokenIDs is a config token-id field, which HF writes as null, an int, or a
// list of ints. A single id is written back as an int.
type TokenIDs []int

// UnmarshalJSON accepts null, an integer or a list of integers.
func (t *TokenIDs) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*t = nil
		return nil
	}
	if len(b) > 0 && b[0] == '[' {
		var ids []int
		if err := json.Unmarshal(b, &ids); err != nil {
			return fmt.Errorf("want an integer or a list of integers: %w", err)
		}
		*t = ids
		return nil
	}
	var id int
	if err := json.Unmarshal(b, &id); err != nil {
		return fmt.Errorf("want an integer or a list of integers: %w", err)
	}
	*t = TokenIDs{id}
	return nil
}

// MarshalJSON writes null, an int, or a list.
func (t TokenIDs) MarshalJSON() ([]byte, error) {
	switch len(t) {
	case 0:
		return []byte("null"), nil
	case 1:
		return json.Marshal(t[0])
	}
	return json.Marshal([]int(t))
}

// FieldError is a config.json value that cannot be used. Field is the JSON
// key; Problem says what is wrong and what would be valid.
type FieldError struct {
	File    string
	Field   string
	Problem string
}

func (e *FieldError) Error() string {
	if e.File == "" {
		return fmt.Sprintf("model config: field %q: %s", e.Field, e.Problem)
	}
	return fmt.Sprintf("%s: field %q: %s", e.File, e.Field, e.Problem)
}

// configKeys lists each known key with the Config field it fills; the order
// is also the order MarshalJSON writes them (sorted, like transformers).
func (c *Config) configKeys() map[string]any {
	return map[string]any{
		"architectures":           &c.Architectures,
		"model_type":              &c.ModelType,
		"vocab_size":              &c.VocabSize,
		"hidden_size":             &c.HiddenSize,
		"intermediate_size":       &c.IntermediateSize,
		"num_hidden_layers":       &c.NumHiddenLayers,
		"num_attention_heads":     &c.NumAttentionHeads,
		"num_key_value_heads":     &c.NumKeyValueHeads,
		"head_dim":                &c.HeadDim,
		"hidden_act":              &c.HiddenAct,
		"rms_norm_eps":            &c.RMSNormEps,
		"rope_theta":              &c.RopeTheta,
		"rope_scaling":            &c.RopeScaling,
		"max_position_embeddings": &c.MaxPositionEmbeddings,
		"tie_word_embeddings":     &c.TieWordEmbeddings,
		"torch_dtype":             &c.TorchDType,
		"initializer_range":       &c.InitializerRange,
		"attention_bias":          &c.AttentionBias,
		"bos_token_id":            &c.BOSTokenID,
		"eos_token_id":            &c.EOSTokenID,
		"pad_token_id":            &c.PadTokenID,
	}
}

// ParseConfig decodes config.json bytes, fills family defaults and
// validates. file names the source in errors.
func ParseConfig(file string, data []byte) (*Config, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("%s: not a JSON object: %w", file, err)
	}
	c := &Config{Extra: map[string]json.RawMessage{}}
	keys := c.configKeys()
	present := map[string]bool{}
	for k, v := range raw {
		var compact bytes.Buffer
		if err := json.Compact(&compact, v); err != nil {
			return nil, &FieldError{File: file, Field: k, Problem: err.Error()}
		}
		dst, ok := keys[k]
		if !ok {
			c.Extra[k] = compact.Bytes()
			continue
		}
		present[k] = true
		if k == "rope_scaling" {
			if compact.String() != "null" {
				c.RopeScaling = compact.Bytes()
			}
			continue
		}
		if err := json.Unmarshal(v, dst); err != nil {
			return nil, &FieldError{File: file, Field: k, Problem: fmt.Sprintf("cannot decode %s: %v", truncate(string(v), 40), err)}
		}
	}
	if err := c.readTransformers5Keys(file, present); err != nil {
		return nil, err
	}
	c.fillDefaults(present)
	if err := c.validate(file); err != nil {
		return nil, err
	}
	return c, nil
}

// readTransformers5Keys reads the newer spellings transformers 5 writes:
// rope_theta (and any scaling) inside rope_parameters, and dtype for
// torch_dtype. Missing them would silently leave the defaults (a wrong
// rope_theta changes every attention score). The keys stay in Extra.
func (c *Config) readTransformers5Keys(file string, present map[string]bool) error {
	if rp, ok := c.Extra["rope_parameters"]; ok && !present["rope_theta"] && string(rp) != "null" {
		var p map[string]json.RawMessage
		if err := json.Unmarshal(rp, &p); err != nil {
			return &FieldError{File: file, Field: "rope_parameters", Problem: "want an object with rope_theta and rope_type"}
		}
		theta, ok := p["rope_theta"]
		if !ok {
			return &FieldError{File: file, Field: "rope_parameters", Problem: "has no rope_theta (per-layer-type rope parameters are not supported)"}
		}
		if err := json.Unmarshal(theta, &c.RopeTheta); err != nil {
			return &FieldError{File: file, Field: "rope_parameters.rope_theta", Problem: "want a number"}
		}
		present["rope_theta"] = true
		var kind struct {
			RopeType string `json:"rope_type"`
		}
		_ = json.Unmarshal(rp, &kind)
		if kind.RopeType != "" && kind.RopeType != "default" && c.RopeScaling == nil {
			c.RopeScaling = rp
		}
	}
	if dt, ok := c.Extra["dtype"]; ok && !present["torch_dtype"] {
		if err := json.Unmarshal(dt, &c.TorchDType); err != nil {
			return &FieldError{File: file, Field: "dtype", Problem: "want a dtype name such as bfloat16"}
		}
		present["torch_dtype"] = true
	}
	return nil
}

// LoadConfig reads and validates dir/config.json.
func LoadConfig(dir string) (*Config, error) {
	path := filepath.Join(dir, ConfigFile)
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read model config: %w", err)
	}
	return ParseConfig(path, data)
}

// fillDefaults applies the defaults transformers' config classes use for
// keys a file omits (LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config).
func (c *Config) fillDefaults(present map[string]bool) {
	if !present["num_key_value_heads"] || c.NumKeyValueHeads == 0 {
		c.NumKeyValueHeads = c.NumAttentionHeads
	}
	if (!present["head_dim"] || c.HeadDim == 0) && c.NumAttentionHeads > 0 {
		c.HeadDim = c.HiddenSize / c.NumAttentionHeads
	}
	if !present["hidden_act"] {
		c.HiddenAct = "silu"
	}
	if !present["rms_norm_eps"] {
		c.RMSNormEps = 1e-6
	}
	if !present["rope_theta"] {
		c.RopeTheta = 10000
	}
	if !present["initializer_range"] {
		c.InitializerRange = 0.02
	}
	if !present["torch_dtype"] {
		c.TorchDType = "float32"
	}
}

// Validate checks that the config describes a model the worker can build.
// Errors are *FieldError values naming the key.
func (c *Config) Validate() error { return c.validate("") }

func (c *Config) validate(file string) error {
	bad := func(field, format string, args ...any) error {
		return &FieldError{File: file, Field: field, Problem: fmt.Sprintf(format, args...)}
	}
	if len(c.Architectures) == 0 {
		return bad("architectures", "missing; want one of %s", strings.Join(SupportedArchitectures(), ", "))
	}
	wantType, ok := supportedArchitectures[c.Architectures[0]]
	if !ok {
		return bad("architectures", "%q is not supported; want one of %s", c.Architectures[0], strings.Join(SupportedArchitectures(), ", "))
	}
	if c.ModelType != wantType {
		return bad("model_type", "%q does not match architecture %s; want %q", c.ModelType, c.Architectures[0], wantType)
	}
	positive := []struct {
		field string
		v     int
	}{
		{"vocab_size", c.VocabSize}, {"hidden_size", c.HiddenSize}, {"intermediate_size", c.IntermediateSize},
		{"num_hidden_layers", c.NumHiddenLayers}, {"num_attention_heads", c.NumAttentionHeads},
		{"num_key_value_heads", c.NumKeyValueHeads}, {"head_dim", c.HeadDim},
		{"max_position_embeddings", c.MaxPositionEmbeddings},
	}
	for _, p := range positive {
		if p.v <= 0 {
			return bad(p.field, "must be a positive integer, got %d", p.v)
		}
	}
	if c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
		return bad("num_key_value_heads", "%d must divide num_attention_heads (%d)", c.NumKeyValueHeads, c.NumAttentionHeads)
	}
	if c.HeadDim%2 != 0 {
		return bad("head_dim", "%d must be even for rotary embeddings", c.HeadDim)
	}
	if c.HiddenAct != "silu" {
		return bad("hidden_act", "%q is not supported; want \"silu\"", c.HiddenAct)
	}
	if c.RMSNormEps <= 0 {
		return bad("rms_norm_eps", "must be > 0, got %g", c.RMSNormEps)
	}
	if c.RopeTheta <= 0 {
		return bad("rope_theta", "must be > 0, got %g", c.RopeTheta)
	}
	if err := validateRopeScaling(c.RopeScaling); err != nil {
		return bad("rope_scaling", "%v", err)
	}
	if b, ok := c.Extra["mlp_bias"]; ok && string(b) == "true" {
		return bad("mlp_bias", "true is not supported: the worker's MLP (gate, up and down projections) has no biases; use a checkpoint without mlp_bias")
	}
	if !slices.Contains(supportedTorchDTypes, c.TorchDType) {
		return bad("torch_dtype", "%q is not supported; want one of %s", c.TorchDType, strings.Join(supportedTorchDTypes, ", "))
	}
	for _, f := range []struct {
		field string
		ids   TokenIDs
	}{{"bos_token_id", c.BOSTokenID}, {"eos_token_id", c.EOSTokenID}, {"pad_token_id", c.PadTokenID}} {
		for _, id := range f.ids {
			if id < 0 || id >= c.VocabSize {
				return bad(f.field, "token id %d is outside the vocabulary [0, %d)", id, c.VocabSize)
			}
		}
	}
	return nil
}

func validateRopeScaling(raw json.RawMessage) error {
	if len(bytes.TrimSpace(raw)) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return nil
	}
	var rs map[string]any
	if err := json.Unmarshal(raw, &rs); err != nil {
		return errors.New("must be null or an object with a \"rope_type\" (or \"type\") string")
	}
	kind, _ := rs["rope_type"].(string)
	if kind == "" {
		kind, _ = rs["type"].(string)
	}
	if kind == "" {
		return errors.New("object has no \"rope_type\" (or \"type\") string")
	}
	return nil
}

// SupportedArchitectures lists the HF architectures names Validate accepts.
func SupportedArchitectures() []string {
	names := make([]string, 0, len(supportedArchitectures))
	for n := range supportedArchitectures {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// MarshalJSON writes every known field plus Extra, keys sorted, the way
// transformers' save_pretrained does.
func (c Config) MarshalJSON() ([]byte, error) {
	out := make(map[string]json.RawMessage, len(c.Extra)+24)
	for k, v := range c.Extra {
		out[k] = v
	}
	for k, v := range c.configKeys() {
		if k == "rope_scaling" {
			rs := c.RopeScaling
			if len(bytes.TrimSpace(rs)) == 0 {
				rs = json.RawMessage("null")
			}
			out[k] = rs
			continue
		}
		b, err := marshalNoEscape(v, "")
		if err != nil {
			return nil, fmt.Errorf("encode config field %q: %w", k, err)
		}
		out[k] = b
	}
	return marshalNoEscape(out, "")
}

// Encode returns the config as indented JSON with a final newline.
func (c *Config) Encode() ([]byte, error) { return marshalNoEscape(c, "  ") }

// marshalNoEscape is json.Marshal without HTML escaping (transformers
// writes "<" literally), indented when indent is set, newline-terminated
// only when indented.
func marshalNoEscape(v any, indent string) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", indent)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	if indent == "" {
		return bytes.TrimRight(buf.Bytes(), "\n"), nil
	}
	return buf.Bytes(), nil
}

// HasQKVBias reports whether q/k/v projections carry a bias: always in
// Qwen2/Qwen2.5, and when attention_bias is set for Llama-style models.
func (c *Config) HasQKVBias() bool { return c.ModelType == "qwen2" || c.AttentionBias }

// HasOProjBias reports whether o_proj carries a bias (Llama attention_bias;
// Qwen2 never has one).
func (c *Config) HasOProjBias() bool { return c.ModelType != "qwen2" && c.AttentionBias }

// SlidingWindow is the attention window some layers of the model use, in
// tokens (0: every layer attends to the whole sequence), as transformers
// reads it: layer_types naming "sliding_attention"; Mistral's
// sliding_window; Qwen2/Qwen3's use_sliding_window for the layers from
// max_window_layers on. The worker attends to the whole sequence, which
// equals windowed attention only while sequences fit the window.
func (c *Config) SlidingWindow() int {
	var window int
	if raw, ok := c.Extra["sliding_window"]; !ok || json.Unmarshal(raw, &window) != nil || window <= 0 {
		return 0
	}
	var layerTypes []string
	if raw, ok := c.Extra["layer_types"]; ok && json.Unmarshal(raw, &layerTypes) == nil && layerTypes != nil {
		if slices.Contains(layerTypes, "sliding_attention") {
			return window
		}
		return 0
	}
	switch c.ModelType {
	case "mistral":
		return window
	case "qwen2", "qwen3":
		var use bool
		var from int
		if raw, ok := c.Extra["use_sliding_window"]; !ok || json.Unmarshal(raw, &use) != nil || !use {
			return 0
		}
		if raw, ok := c.Extra["max_window_layers"]; ok && json.Unmarshal(raw, &from) == nil && from >= c.NumHiddenLayers {
			return 0
		}
		return window
	}
	return 0
}

// HasQKNorm reports whether attention has per-head RMSNorm on q and k (Qwen3).
func (c *Config) HasQKNorm() bool { return c.ModelType == "qwen3" }

// NumParams counts the model's parameters, lm_head included when untied.
func (c *Config) NumParams() int64 {
	h, kv, q := int64(c.HiddenSize), int64(c.NumKeyValueHeads*c.HeadDim), int64(c.NumAttentionHeads*c.HeadDim)
	perLayer := h*q + 2*h*kv + q*h + 3*h*int64(c.IntermediateSize) + 2*h
	if c.HasQKVBias() {
		perLayer += q + 2*kv
	}
	if c.HasOProjBias() {
		perLayer += h
	}
	if c.HasQKNorm() {
		perLayer += 2 * int64(c.HeadDim)
	}
	n := int64(c.VocabSize)*h + int64(c.NumHiddenLayers)*perLayer + h
	if !c.TieWordEmbeddings {
		n += int64(c.VocabSize) * h
	}
	return n
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
