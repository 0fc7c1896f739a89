package model

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
)

// DirNotEmptyError is returned by Init when the target directory already
// holds files.
type DirNotEmptyError struct{ Dir string }

func (e *DirNotEmptyError) Error() string {
	return fmt.Sprintf("directory %s exists and is not empty", e.Dir)
}

// TensorSpecs lists the tensors of a model with this config under their
// Hugging Face names, in dtype dt. lm_head.weight appears only when the
// embeddings are untied.
func (c *Config) TensorSpecs(dt DType) []TensorSpec {
	h, v := int64(c.HiddenSize), int64(c.VocabSize)
	q, kv := int64(c.NumAttentionHeads*c.HeadDim), int64(c.NumKeyValueHeads*c.HeadDim)
	ff, hd := int64(c.IntermediateSize), int64(c.HeadDim)
	specs := []TensorSpec{{"model.embed_tokens.weight", dt, []int64{v, h}}}
	for i := 0; i < c.NumHiddenLayers; i++ {
		p := fmt.Sprintf("model.layers.%d.", i)
		add := func(name string, shape ...int64) { specs = append(specs, TensorSpec{p + name, dt, shape}) }
		add("input_layernorm.weight", h)
		add("self_attn.q_proj.weight", q, h)
		add("self_attn.k_proj.weight", kv, h)
		add("self_attn.v_proj.weight", kv, h)
		add("self_attn.o_proj.weight", h, q)
		if c.HasQKVBias() {
			add("self_attn.q_proj.bias", q)
			add("self_attn.k_proj.bias", kv)
			add("self_attn.v_proj.bias", kv)
		}
		if c.HasOProjBias() {
			add("self_attn.o_proj.bias", h)
		}
		if c.HasQKNorm() {
			add("self_attn.q_norm.weight", hd)
			add("self_attn.k_norm.weight", hd)
		}
		add("post_attention_layernorm.weight", h)
		add("mlp.gate_proj.weight", ff, h)
		add("mlp.up_proj.weight", ff, h)
		add("mlp.down_proj.weight", h, ff)
	}
	specs = append(specs, TensorSpec{"model.norm.weight", dt, []int64{h}})
	if !c.TieWordEmbeddings {
		specs = append(specs, TensorSpec{"lm_head.weight", dt, []int64{v, h}})
	}
	return specs
}

// Init creates a randomly initialised model directory at dir from preset:
// config.json, generation_config.json, model.safetensors (in torch_dtype),
// tokenizer.json and tokenizer_config.json (byte-level BPE with the ChatML
// tool-calling ChatTemplate). Weights follow transformers' _init_weights:
// matrices and embeddings ~ N(0, initializer_range), the padding row of the
// embedding zero, norms one, biases zero. The same seed gives
// byte-identical files. The directory appears atomically (written under a
// temporary name, then renamed); an existing non-empty dir is refused with
// a *DirNotEmptyError.
func Init(dir string, preset Preset, seed int64) error {
	return initModel(dir, preset, seed, false)
}

// InitOverwrite is Init, but replaces an existing dir provided it is empty
// or holds a model (config.json); any other non-empty directory is refused,
// so a mistyped path never deletes unrelated files.
func InitOverwrite(dir string, preset Preset, seed int64) error {
	return initModel(dir, preset, seed, true)
}

func initModel(dir string, preset Preset, seed int64, overwrite bool) (err error) {
	cfg := preset.Config
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("preset %q: %w", preset.Name, err)
	}
	dir = filepath.Clean(dir)
	empty, exists, err := dirState(dir)
	if err != nil {
		return err
	}
	if exists && !empty && (!overwrite || !hasConfig(dir)) {
		return &DirNotEmptyError{Dir: dir}
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("create parent of %s: %w", dir, err)
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create temp dir for %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("chmod %s: %w", tmp, err)
	}
	if err := writeModelFiles(tmp, &cfg, seed); err != nil {
		return fmt.Errorf("init model %s: %w", dir, err)
	}
	return publishDir(tmp, dir, exists)
}

// dirState reports whether dir exists and is empty.
func dirState(dir string) (empty, exists bool, err error) {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return true, false, nil
	case err != nil:
		return false, false, fmt.Errorf("inspect %s: %w", dir, err)
	}
	return len(entries) == 0, true, nil
}

// publishDir renames tmp to dir. An existing dir is moved aside first and
// removed after, so dir always holds either the old or the new model.
func publishDir(tmp, dir string, exists bool) error {
	if !exists {
		if err := os.Rename(tmp, dir); err != nil {
			return fmt.Errorf("rename %s to %s: %w", tmp, dir, err)
		}
		return nil
	}
	old := tmp + ".old"
	if err := os.Rename(dir, old); err != nil {
		return fmt.Errorf("move old %s aside: %w", dir, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		_ = os.Rename(old, dir)
		return fmt.Errorf("rename %s to %s: %w", tmp, dir, err)
	}
	if err := os.RemoveAll(old); err != nil {
		return fmt.Errorf("remove old model %s: %w", old, err)
	}
	return nil
}

func writeModelFiles(dir string, cfg *Config, seed int64) error {
	cfgJSON, err := cfg.Encode()
	if err != nil {
		return fmt.Errorf("encode config: %w", err)
	}
	if err := writeFileAtomic(filepath.Join(dir, ConfigFile), func(w io.Writer) error { _, err := w.Write(cfgJSON); return err }); err != nil {
		return err
	}
	genCfg := map[string]any{
		"bos_token_id":         nil,
		"eos_token_id":         []int{byteTokenID(TokenIMEnd), byteTokenID(TokenEndOfText)},
		"pad_token_id":         byteTokenID(TokenEndOfText),
		"do_sample":            true,
		"transformers_version": "4.51.0",
	}
	if err := writeJSONFileAtomic(filepath.Join(dir, "generation_config.json"), genCfg); err != nil {
		return err
	}
	if err := writeJSONFileAtomic(filepath.Join(dir, "tokenizer.json"), ByteTokenizerJSON()); err != nil {
		return err
	}
	if err := writeJSONFileAtomic(filepath.Join(dir, "tokenizer_config.json"), ByteTokenizerConfigJSON(cfg.MaxPositionEmbeddings)); err != nil {
		return err
	}
	dt := map[string]DType{"float32": F32, "bfloat16": BF16, "float16": F16}[cfg.TorchDType]
	return WriteSafetensorsStream(filepath.Join(dir, SingleWeightsFile), cfg.TensorSpecs(dt), nil,
		func(s TensorSpec, w io.Writer) error { return fillInitTensor(w, s, cfg, seed) })
}

// elementWriter buffers values of one dtype and writes them in blocks.
type elementWriter struct {
	w   io.Writer
	dt  DType
	buf []byte
}

func newElementWriter(w io.Writer, dt DType) *elementWriter {
	return &elementWriter{w: w, dt: dt, buf: make([]byte, 0, 1<<16)}
}

func (e *elementWriter) put(v float32) error {
	switch e.dt {
	case BF16:
		e.buf = binary.LittleEndian.AppendUint16(e.buf, F32ToBF16(v))
	case F16:
		e.buf = binary.LittleEndian.AppendUint16(e.buf, F32ToF16(v))
	default:
		e.buf = binary.LittleEndian.AppendUint32(e.buf, math.Float32bits(v))
	}
	if len(e.buf) >= cap(e.buf)-4 {
		return e.flush()
	}
	return nil
}

func (e *elementWriter) flush() error {
	_, err := e.w.Write(e.buf)
	e.buf = e.buf[:0]
	return err
}

// fillInitTensor writes one tensor's initial values, drawn in float32 and
// rounded to the tensor's dtype. Each tensor draws from its own PCG stream
// keyed by (seed, name), so values do not depend on the order tensors are
// written in.
func fillInitTensor(w io.Writer, s TensorSpec, cfg *Config, seed int64) error {
	n := s.ByteLen() / int64(s.DType.Size())
	ew := newElementWriter(w, s.DType)
	var next func(i int64) float32
	switch {
	case strings.HasSuffix(s.Name, "norm.weight"):
		next = func(int64) float32 { return 1 }
	case strings.HasSuffix(s.Name, ".bias"):
		next = func(int64) float32 { return 0 }
	default:
		name := fnv.New64a()
		name.Write([]byte(s.Name))
		rng := rand.New(rand.NewPCG(uint64(seed), name.Sum64()))
		padRow := int64(-1)
		if s.Name == "model.embed_tokens.weight" && len(cfg.PadTokenID) == 1 {
			padRow = int64(cfg.PadTokenID[0])
		}
		cols := s.Shape[len(s.Shape)-1]
		next = func(i int64) float32 {
			v := float32(rng.NormFloat64() * cfg.InitializerRange)
			if i/cols == padRow {
				return 0 // nn.Embedding(padding_idx) keeps this row zero
			}
			return v
		}
	}
	for i := int64(0); i < n; i++ {
		if err := ew.put(next(i)); err != nil {
			return err
		}
	}
	return ew.flush()
}
