package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// smokeCopiedFiles are the tokenizer and template files of a source
// directory that a smoke model carries over byte for byte, so it renders
// and parses exactly what the source model would.
func smokeCopiedFiles() []string {
	return []string{
		"tokenizer.json", "tokenizer.json.gz", "tokenizer_config.json", "special_tokens_map.json",
		"generation_config.json", "chat_template.jinja", "chat_template.json", "vocab.json",
		"merges.txt", "tokenizer.model", "added_tokens.json",
	}
}

// What MissingFilesError.Missing names for each requirement a source fails.
const (
	missingConfig       = ConfigFile
	missingTokenizer    = "tokenizer.json (or tokenizer.json.gz, or vocab.json + merges.txt)"
	missingChatTemplate = "a chat template (chat_template in tokenizer_config.json, chat_template.jinja or chat_template.json)"
)

// MissingFilesError says src lacks files a smoke model needs: config.json;
// a tokenizer (tokenizer.json, tokenizer.json.gz or vocab.json +
// merges.txt); a chat template (tokenizer_config.json chat_template,
// chat_template.jinja or chat_template.json). Missing lists every one.
type MissingFilesError struct {
	Dir     string
	Missing []string
}

func (e *MissingFilesError) Error() string {
	repo := "<repo>"
	if r := cacheRepoID(e.Dir); r != "" {
		repo = r
	}
	return fmt.Sprintf("model directory %s lacks what a smoke model needs: %s; fetch them (the weights are not needed): "+
		"`hf download %s config.json tokenizer.json tokenizer_config.json` "+
		"(add chat_template.jinja if the repo has one)", e.Dir, strings.Join(e.Missing, "; "), repo)
}

// cacheRepoID recovers Org/Name from a hub cache snapshot path
// (.../models--Org--Name/snapshots/<sha>), so the hint is copy-pasteable.
func cacheRepoID(dir string) string {
	for _, part := range strings.Split(filepath.ToSlash(dir), "/") {
		if rest, ok := strings.CutPrefix(part, "models--"); ok {
			if org, name, ok := strings.Cut(rest, "--"); ok && org != "" && name != "" {
				return org + "/" + name
			}
		}
	}
	return ""
}

// Shape of every smoke model: the tiny preset's, small enough to run a
// step on CPU in milliseconds even with a 150k vocabulary.
const (
	smokeLayers       = 2
	smokeHidden       = 64
	smokeHeads        = 4
	smokeKVHeads      = 2
	smokeHeadDim      = 16
	smokeIntermediate = 128
)

// InitSmoke creates at dir a tiny randomly initialised model of src's family
// (2 layers x 64 hidden, float32) that keeps src's vocabulary, special token
// ids, rope and bias settings, and byte-identical copies of src's tokenizer
// and chat template files, so a smoke run exercises the source model's real
// prompts and tool-call parsing on CPU. src needs no weights. Weights are
// drawn as Init draws them; the same seed gives byte-identical files. A
// source lacking files returns a *MissingFilesError naming all of them; an
// unsupported architecture returns config validation's *FieldError. dir
// appears atomically; an existing non-empty dir is refused with a
// *DirNotEmptyError. It returns the tiny config written to dir.
func InitSmoke(dir, src string, seed int64) (_ *Config, err error) {
	if st, err := os.Stat(src); err != nil {
		return nil, fmt.Errorf("smoke model source: %w", err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("smoke model source %s is not a directory", src)
	}
	if err := checkSmokeSource(src); err != nil {
		return nil, err
	}
	cfg, err := LoadConfig(src)
	if err != nil {
		return nil, err
	}
	shrinkConfig(cfg)
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("smoke config from %s: %w", src, err)
	}

	dir = filepath.Clean(dir)
	empty, exists, err := dirState(dir)
	if err != nil {
		return nil, err
	}
	if exists && !empty {
		return nil, &DirNotEmptyError{Dir: dir}
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, fmt.Errorf("create parent of %s: %w", dir, err)
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("create temp dir for %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, fmt.Errorf("chmod %s: %w", tmp, err)
	}
	if err := writeSmokeFiles(tmp, src, cfg, seed); err != nil {
		return nil, fmt.Errorf("init smoke model %s: %w", dir, err)
	}
	if err := publishDir(tmp, dir, exists); err != nil {
		return nil, err
	}
	return cfg, nil
}

// checkSmokeSource reports every missing requirement at once, so one
// download fixes them all.
func checkSmokeSource(src string) error {
	has := func(name string) bool {
		st, err := os.Stat(filepath.Join(src, name))
		return err == nil && !st.IsDir()
	}
	var missing []string
	if !has(ConfigFile) {
		missing = append(missing, missingConfig)
	}
	if !has("tokenizer.json") && !has("tokenizer.json.gz") && !(has("vocab.json") && has("merges.txt")) {
		missing = append(missing, missingTokenizer)
	}
	template := has("chat_template.jinja") || has("chat_template.json")
	if !template && has("tokenizer_config.json") {
		var err error
		if template, err = hasTemplateField(filepath.Join(src, "tokenizer_config.json")); err != nil {
			return err
		}
	}
	if !template {
		missing = append(missing, missingChatTemplate)
	}
	if len(missing) > 0 {
		return &MissingFilesError{Dir: src, Missing: missing}
	}
	return nil
}

// hasTemplateField reports whether a tokenizer_config.json has a non-empty
// chat_template (a string, or a list of named templates).
func hasTemplateField(path string) (bool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	var tc struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
	}
	if err := json.Unmarshal(data, &tc); err != nil {
		return false, fmt.Errorf("parse %s: %w", path, err)
	}
	switch strings.TrimSpace(string(tc.ChatTemplate)) {
	case "", "null", `""`, "[]":
		return false, nil
	}
	return true, nil
}

// shrinkConfig turns a source config into its smoke config in place. Every
// field that selects behaviour (architecture, vocabulary, special tokens,
// tying, biases, rope, norm eps, activation) is kept; only the sizes change.
func shrinkConfig(c *Config) {
	srcLayers := c.NumHiddenLayers
	c.NumHiddenLayers, c.HiddenSize, c.IntermediateSize = smokeLayers, smokeHidden, smokeIntermediate
	c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim = smokeHeads, smokeKVHeads, smokeHeadDim
	c.TorchDType, c.InitializerRange = "float32", 0.02
	c.MaxPositionEmbeddings = max(512, min(c.MaxPositionEmbeddings, 4096))
	if c.Extra == nil {
		return
	}
	if _, ok := c.Extra["dtype"]; ok { // transformers 5 spelling of torch_dtype
		c.Extra["dtype"] = json.RawMessage(`"float32"`)
	}
	delete(c.Extra, "quantization_config") // the smoke weights are plain float32
	// Per-layer settings: the 2 smoke layers stand for the source's first
	// and last, so a source mixing full and sliding attention still mixes.
	sampled := []int{0, max(srcLayers-1, 0)}
	var from int
	if raw, ok := c.Extra["max_window_layers"]; ok && json.Unmarshal(raw, &from) == nil {
		n := 0
		for _, l := range sampled {
			if l < from {
				n++
			}
		}
		c.Extra["max_window_layers"] = json.RawMessage(fmt.Sprint(n))
	}
	var types []json.RawMessage
	if raw, ok := c.Extra["layer_types"]; ok && json.Unmarshal(raw, &types) == nil && len(types) == srcLayers && srcLayers > 0 {
		b, _ := json.Marshal([]json.RawMessage{types[sampled[0]], types[sampled[1]]})
		c.Extra["layer_types"] = b
	}
}

// writeSmokeFiles writes config.json, the random weights and the copied
// tokenizer files into dir.
func writeSmokeFiles(dir, src string, cfg *Config, seed int64) error {
	cfgJSON, err := cfg.Encode()
	if err != nil {
		return fmt.Errorf("encode config: %w", err)
	}
	if err := writeFileAtomic(filepath.Join(dir, ConfigFile), func(w io.Writer) error { _, err := w.Write(cfgJSON); return err }); err != nil {
		return err
	}
	if err := WriteSafetensorsStream(filepath.Join(dir, SingleWeightsFile), cfg.TensorSpecs(F32), nil,
		func(s TensorSpec, w io.Writer) error { return fillInitTensor(w, s, cfg, seed) }); err != nil {
		return err
	}
	for _, name := range smokeCopiedFiles() {
		if err := copySmokeFile(filepath.Join(src, name), filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return nil
}

// copySmokeFile copies from to to byte for byte; a missing from is skipped
// (sources carry different subsets of the tokenizer files).
func copySmokeFile(from, to string) error {
	f, err := os.Open(from)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	return writeFileAtomic(to, func(w io.Writer) error { _, err := io.Copy(w, f); return err })
}
