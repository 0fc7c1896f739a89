package worker

/*
#include <stdlib.h>
#include "dlapi.h"
*/
import "C"

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"unsafe"

	"github.com/ortrain/ortrain/internal/model"
)

// LoRAOptions select LoRA training instead of full fine-tuning.
type LoRAOptions struct {
	Rank    int
	Alpha   float64
	Dropout float64
	// TargetModules are projection names: q_proj, k_proj, v_proj, o_proj,
	// gate_proj, up_proj, down_proj. Empty means all seven.
	TargetModules []string
	// ModulesToSave are modules trained in full beside the adapters, as
	// PEFT's modules_to_save: embed_tokens, lm_head, norm, input_layernorm,
	// post_attention_layernorm, q_norm, k_norm. Each gets a trainable copy
	// (the loaded weights stay the base and the KL reference). With tied
	// embeddings lm_head and embed_tokens are one matrix: naming either
	// trains that one copy, and SavePEFT writes it under both PEFT names.
	ModulesToSave []string
}

// saveableModules are the names LoRAOptions.ModulesToSave accepts.
var saveableModules = []string{"embed_tokens", "lm_head", "norm", "input_layernorm", "post_attention_layernorm", "q_norm", "k_norm"}

// AdamWOptions are torch.optim.AdamW's settings plus gradient clipping.
// The learning rate is given per step (OptimizerStep), from an LRSchedule.
type AdamWOptions struct {
	Beta1, Beta2 float64
	Eps          float64
	WeightDecay  float64
	// MaxGradNorm clips gradients by global L2 norm; 0 = no clipping.
	MaxGradNorm float64
}

// DefaultAdamW returns PyTorch's AdamW defaults with weight decay 0 and
// clipping at 1.0 (transformers' max_grad_norm).
func DefaultAdamW() AdamWOptions {
	return AdamWOptions{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0, MaxGradNorm: 1.0}
}

// ModelOptions say what to load and how to train it.
type ModelOptions struct {
	Dir string // a Hugging Face model directory
	// ChatTemplatePath, when set, is the chat template saved models carry
	// as chat_template.jinja instead of Dir's (chat.template_path).
	ChatTemplatePath string
	// PackTokens > 0 packs the rows of every training and log-prob batch
	// into sequences of at most this many tokens (padding-free, PackRows)
	// instead of padding each row to the longest; 0 pads.
	PackTokens int
	// Device is "cpu" (default), "cuda" or "cuda:N".
	Device string
	// DType is float32 (default on CPU), bfloat16, float16 or float64; empty
	// on CUDA means the checkpoint's torch_dtype.
	DType string
	// Threads is libtorch's intra-op thread count; 0 means one per CPU
	// (libtorch itself would default to 1 here).
	Threads int
	Seed    int64
	LoRA    *LoRAOptions
	// Reference keeps a frozen copy for the KL term (full fine-tuning); with
	// LoRA the reference is the base model with adapters off.
	Reference             bool
	GradientCheckpointing bool
	Optim                 AdamWOptions
	// LogprobChunkRows bounds how many token rows of logits ([rows, vocab])
	// exist at once when computing log-probs; 0 picks a size from the vocab
	// (16M logits on CPU, 64M on GPU). Smaller saves memory.
	LogprobChunkRows int
	// LogprobPath selects how ForwardBackward differentiates the vocab
	// projection; the zero value (LogprobAuto) is the fast choice.
	LogprobPath LogprobPath
}

// LogprobPath is how ForwardBackward gets the gradient through the vocab
// projection (csrc/worker_abi.h, ORT_LOGPROB_*).
type LogprobPath int

const (
	// LogprobAuto takes LogprobFused where it applies, else LogprobRecompute.
	LogprobAuto LogprobPath = iota
	// LogprobRecompute computes chunked log-probs in forward and recomputes
	// each chunk's logits in backward.
	LogprobRecompute
	// LogprobFused computes each chunk's log-probs and the loss gradient
	// through it in one pass, never recomputing logits. It needs a loss that
	// is separable per token: not vespo, not sequence-level importance
	// sampling, and a sequence-level vLLM correction only where every row
	// with sampler log-probs has old ones; otherwise ForwardBackward and
	// EvalLoss fail.
	LogprobFused
)

// Model is a loaded policy. Its methods serialise on one mutex: libtorch
// state is not safe for concurrent training and sampling.
type Model struct {
	mu    sync.Mutex
	lib   *Library
	api   *C.ort_api
	h     *C.ort_model
	cfg   *model.Config
	opts  ModelOptions
	dtype model.DType
	// shard is the stage of the group the model joined: with one, its
	// optimizer state is this rank's slice (Group.SaveOptimizerShard).
	shard ShardStage
}

var dtypeCodes = map[model.DType]C.int32_t{
	model.F32: C.ORT_F32, model.BF16: C.ORT_BF16, model.F16: C.ORT_F16, model.F64: C.ORT_F64, model.I64: C.ORT_I64,
}

func dtypeOf(code C.int32_t) model.DType {
	for d, c := range dtypeCodes {
		if c == code {
			return d
		}
	}
	return ""
}

// parseDType maps a config spelling to a safetensors dtype.
func parseDType(s string) (model.DType, error) {
	switch strings.ToLower(s) {
	case "float32", "fp32":
		return model.F32, nil
	case "bfloat16", "bf16":
		return model.BF16, nil
	case "float16", "fp16", "half":
		return model.F16, nil
	case "float64", "fp64":
		return model.F64, nil
	}
	return "", fmt.Errorf("dtype %q is unknown (allowed: float32, bfloat16, float16, float64)", s)
}

var torchDTypeNames = map[model.DType]string{model.F32: "float32", model.BF16: "bfloat16", model.F16: "float16", model.F64: "float64"}

var deviceRE = regexp.MustCompile(`^(cpu|cuda(:[0-9]+)?)$`)

var allTargets = []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}

// arch converts a parsed config.json into the C architecture struct.
func arch(cfg *model.Config) (C.ort_arch, error) {
	a := C.ort_arch{
		vocab_size: C.int32_t(cfg.VocabSize), hidden_size: C.int32_t(cfg.HiddenSize),
		intermediate_size: C.int32_t(cfg.IntermediateSize), num_layers: C.int32_t(cfg.NumHiddenLayers),
		num_heads: C.int32_t(cfg.NumAttentionHeads), num_kv_heads: C.int32_t(cfg.NumKeyValueHeads),
		head_dim: C.int32_t(cfg.HeadDim), rms_eps: C.double(cfg.RMSNormEps), rope_theta: C.double(cfg.RopeTheta),
		tie_embeddings: cbool(cfg.TieWordEmbeddings), attention_bias: cbool(cfg.HasQKVBias()),
		qk_norm: cbool(cfg.HasQKNorm()), o_bias: cbool(cfg.HasOProjBias()),
	}
	raw := strings.TrimSpace(string(cfg.RopeScaling))
	if raw == "" || raw == "null" {
		return a, nil
	}
	var rs struct {
		RopeType      string  `json:"rope_type"`
		Type          string  `json:"type"`
		Factor        float64 `json:"factor"`
		LowFreq       float64 `json:"low_freq_factor"`
		HighFreq      float64 `json:"high_freq_factor"`
		OriginalMaxPE int     `json:"original_max_position_embeddings"`
	}
	if err := json.Unmarshal(cfg.RopeScaling, &rs); err != nil {
		return a, fmt.Errorf("config.json rope_scaling: %w", err)
	}
	kind := rs.RopeType
	if kind == "" {
		kind = rs.Type
	}
	switch kind {
	case "default":
	case "linear":
		a.rope_scaling, a.rope_factor = C.ORT_ROPE_LINEAR, C.double(rs.Factor)
	case "llama3":
		a.rope_scaling, a.rope_factor = C.ORT_ROPE_LLAMA3, C.double(rs.Factor)
		a.rope_low_freq_factor, a.rope_high_freq_factor = C.double(rs.LowFreq), C.double(rs.HighFreq)
		a.rope_original_max_pos = C.int32_t(rs.OriginalMaxPE)
	default:
		return a, fmt.Errorf("config.json rope_scaling type %q is not supported by the worker (supported: default, linear, llama3)", kind)
	}
	return a, nil
}

func cbool(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}

// resolveOptions fills defaults and refuses bad values, naming the field.
func resolveOptions(o ModelOptions, cfg *model.Config) (ModelOptions, model.DType, error) {
	if o.Device == "" {
		o.Device = "cpu"
	}
	if !deviceRE.MatchString(o.Device) {
		return o, "", fmt.Errorf("device %q is invalid (want cpu, cuda or cuda:N)", o.Device)
	}
	if o.Threads <= 0 {
		o.Threads = runtime.NumCPU()
	}
	if o.DType == "" {
		o.DType = "float32"
		if o.Device != "cpu" {
			o.DType = cfg.TorchDType
		}
	}
	dt, err := parseDType(o.DType)
	if err != nil {
		return o, "", err
	}
	if o.LogprobChunkRows < 0 {
		return o, "", fmt.Errorf("logprob_chunk_rows: %d must be >= 0 (0 = automatic)", o.LogprobChunkRows)
	}
	if o.LogprobPath < LogprobAuto || o.LogprobPath > LogprobFused {
		return o, "", fmt.Errorf("logprob_path: %d is unknown (0 auto, 1 recompute, 2 fused)", o.LogprobPath)
	}
	if o.Optim == (AdamWOptions{}) {
		o.Optim = DefaultAdamW()
	}
	p := o.Optim
	if p.Beta1 < 0 || p.Beta1 >= 1 || p.Beta2 < 0 || p.Beta2 >= 1 || !(p.Eps > 0) || p.WeightDecay < 0 || p.MaxGradNorm < 0 {
		return o, "", fmt.Errorf("optimizer: betas must be in [0, 1), eps > 0, weight_decay and max_grad_norm >= 0 (got %+v)", p)
	}
	if o.LoRA != nil {
		l := *o.LoRA
		if l.Rank <= 0 || !(l.Alpha > 0) || l.Dropout < 0 || l.Dropout >= 1 {
			return o, "", fmt.Errorf("lora: rank must be > 0, alpha > 0 and dropout in [0, 1) (got rank %d, alpha %v, dropout %v)", l.Rank, l.Alpha, l.Dropout)
		}
		if len(l.TargetModules) == 0 {
			l.TargetModules = allTargets
		}
		for _, name := range l.ModulesToSave {
			if !slices.Contains(saveableModules, name) {
				return o, "", fmt.Errorf("lora: module to save %q is not one of %s", name, strings.Join(saveableModules, ", "))
			}
			if (name == "q_norm" || name == "k_norm") && !cfg.HasQKNorm() {
				return o, "", fmt.Errorf("lora: module to save %q: the model has no q/k norms", name)
			}
		}
		o.LoRA = &l
	}
	return o, dt, nil
}

// LoadModel reads a Hugging Face model directory (config.json and
// model.safetensors or a sharded index) into the worker.
func (l *Library) LoadModel(ctx context.Context, o ModelOptions) (*Model, error) {
	cfg, err := model.LoadConfig(o.Dir)
	if err != nil {
		return nil, fmt.Errorf("load model: %w", err)
	}
	o, dt, err := resolveOptions(o, cfg)
	if err != nil {
		return nil, fmt.Errorf("load model %s: %w", o.Dir, err)
	}
	a, err := arch(cfg)
	if err != nil {
		return nil, fmt.Errorf("load model %s: %w", o.Dir, err)
	}
	tensors, err := model.ReadModelTensors(o.Dir)
	if err != nil {
		return nil, fmt.Errorf("load model: %w", err)
	}
	var ar arena
	defer ar.free()
	copts := C.ort_model_options{
		device: ar.cstring(o.Device), dtype: dtypeCodes[dt], threads: C.int32_t(o.Threads), seed: C.int64_t(o.Seed),
		reference: cbool(o.Reference), grad_checkpointing: cbool(o.GradientCheckpointing),
		beta1: C.double(o.Optim.Beta1), beta2: C.double(o.Optim.Beta2), adam_eps: C.double(o.Optim.Eps),
		weight_decay: C.double(o.Optim.WeightDecay), max_grad_norm: C.double(o.Optim.MaxGradNorm),
		logprob_chunk_rows: C.int64_t(o.LogprobChunkRows),
	}
	if o.LoRA != nil {
		copts.lora_rank, copts.lora_alpha, copts.lora_dropout = C.int32_t(o.LoRA.Rank), C.double(o.LoRA.Alpha), C.double(o.LoRA.Dropout)
		copts.lora_targets = ar.cstring(strings.Join(o.LoRA.TargetModules, ","))
		copts.lora_modules_to_save = ar.cstring(strings.Join(o.LoRA.ModulesToSave, ","))
	}
	eb := newErrBuf()
	defer eb.free()
	m := &Model{lib: l, api: l.api, cfg: cfg, opts: o, dtype: dt}
	var h *C.ort_model
	if err := m.call(eb, "create model "+o.Dir, func() C.int { return C.ort_call_model_new(l.api, &a, &copts, &h, eb.p, errLen) }); err != nil {
		return nil, err
	}
	m.h = h
	if err := m.loadWeights(ctx, o.Dir, tensors); err != nil {
		m.Close()
		return nil, err
	}
	if err := m.call(eb, "load model "+o.Dir, func() C.int { return C.ort_call_finalize(m.api, m.h, eb.p, errLen) }); err != nil {
		m.Close()
		return nil, err
	}
	// The per-tensor read buffers are garbage now: return them to the OS
	// rather than keep a checkpoint-sized Go heap next to libtorch's copy.
	debug.FreeOSMemory()
	if msg := oneDNNWarning(l.info, o.Device, dt); msg != "" {
		oneDNNWarned.Do(func() { fmt.Fprintf(os.Stderr, "ortrain worker: %s\n", msg) })
	}
	return m, nil
}

// oneDNNWarned makes the oneDNN warning once per process: every model of it
// shares the one libtorch.
var oneDNNWarned sync.Once

// oneDNNWarning is what LoadModel says when a CPU float32 model's sampling
// cannot reach oneDNN's sgemm; "" when it can, when the model would not use
// it, or when the library does not report it.
func oneDNNWarning(info Info, device string, dt model.DType) string {
	if device != "cpu" || dt != model.F32 || info.OneDNN == nil || info.OneDNN.Active {
		return ""
	}
	return fmt.Sprintf("oneDNN decode matmuls unavailable (%s): CPU sampling runs them on at::mm, several times slower "+
		"at a few rows; `ortrain doctor` reports it", info.OneDNN.Detail)
}

func (m *Model) loadWeights(ctx context.Context, dir string, tensors map[string]model.ModelTensor) error {
	names := make([]string, 0, len(tensors))
	for n := range tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	headers := map[string]*model.SafetensorsHeader{}
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		t := tensors[name]
		if _, ok := dtypeCodes[t.DType]; !ok || t.DType == model.I64 {
			return fmt.Errorf("load model %s: tensor %s has dtype %s (supported: F32, BF16, F16, F64)", dir, name, t.DType)
		}
		path := filepath.Join(dir, t.File)
		h, ok := headers[path]
		if !ok {
			var err error
			if h, err = model.ReadSafetensorsHeader(path); err != nil {
				return fmt.Errorf("load model: %w", err)
			}
			headers[path] = h
		}
		data, err := model.ReadTensorData(path, h, t.TensorInfo)
		if err != nil {
			return fmt.Errorf("load model: %w", err)
		}
		if err := m.writeTensor(KindWeight, model.Tensor{Name: name, DType: t.DType, Shape: t.Shape, Data: data}); err != nil {
			return fmt.Errorf("load model %s: %w", dir, err)
		}
	}
	return nil
}

// Config is the model's parsed config.json.
func (m *Model) Config() *model.Config { return m.cfg }

// DType is the dtype the model computes in.
func (m *Model) DType() model.DType { return m.dtype }

// Close frees the model. Later calls return ErrClosed.
func (m *Model) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.h != nil {
		h := m.h
		_, err := m.lib.run(func() C.int { C.ort_call_model_free(m.api, h); return 0 })
		m.h = nil
		return err
	}
	return nil
}

// TensorKind selects a family of named tensors.
type TensorKind int

const (
	KindWeight TensorKind = 0 // HF names; reads fold LoRA in
	KindLoRA   TensorKind = 1 // PEFT names
	KindOptim  TensorKind = 2 // AdamW state
	KindGrad   TensorKind = 3 // gradients, by trainable name (read only)
)

// TensorInfo names one tensor of the model.
type TensorInfo struct {
	Name  string
	DType model.DType
	Shape []int64
}

// Bytes is the tensor's size in bytes.
func (t TensorInfo) Bytes() int64 { return model.TensorSpec{DType: t.DType, Shape: t.Shape}.ByteLen() }

// TensorBytes is the size of a listing's tensors (Model.Tensors) in bytes:
// what a model holds of that kind.
func TensorBytes(ts []TensorInfo) int64 {
	var n int64
	for _, t := range ts {
		n += t.Bytes()
	}
	return n
}

// Tensors lists the tensors of a kind, in a stable order.
func (m *Model) Tensors(kind TensorKind) ([]TensorInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.tensors(kind, maxTensorName, maxTensorDims)
}

// Room for one tensor's name and shape when listing: HF and PEFT names are
// far shorter, and no tensor of these models has more than 2 dims.
const (
	maxTensorName = 1024
	maxTensorDims = 8
)

// tensors lists a kind with buffers of nameRoom bytes and shapeRoom dims.
func (m *Model) tensors(kind TensorKind, nameRoom, shapeRoom int) ([]TensorInfo, error) {
	if m.h == nil {
		return nil, ErrClosed
	}
	eb := newErrBuf()
	defer eb.free()
	var n C.int32_t
	if err := m.call(eb, "list tensors", func() C.int { return C.ort_call_tensor_count(m.api, m.h, C.int32_t(kind), &n, eb.p, errLen) }); err != nil {
		return nil, err
	}
	var ar arena
	defer ar.free()
	namep, _ := carray[byte](&ar, nameRoom)
	shapep, shape := carray[int64](&ar, shapeRoom)
	out := make([]TensorInfo, 0, int(n))
	for i := 0; i < int(n); i++ {
		var dt, nd C.int32_t
		err := m.call(eb, "list tensors", func() C.int {
			return C.ort_call_tensor_info(m.api, m.h, C.int32_t(kind), C.int32_t(i), (*C.char)(namep), C.size_t(nameRoom), &dt,
				(*C.int64_t)(shapep), C.size_t(shapeRoom), &nd, eb.p, errLen)
		})
		if err != nil {
			return nil, err
		}
		out = append(out, TensorInfo{Name: C.GoString((*C.char)(namep)), DType: dtypeOf(dt), Shape: append([]int64{}, shape[:nd]...)})
	}
	return out, nil
}

// ReadTensor copies one tensor's bytes (little-endian, its DType).
func (m *Model) ReadTensor(kind TensorKind, t TensorInfo) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.readTensor(kind, t)
}

func (m *Model) readTensor(kind TensorKind, t TensorInfo) ([]byte, error) {
	if m.h == nil {
		return nil, ErrClosed
	}
	n := int((model.TensorSpec{DType: t.DType, Shape: t.Shape}).ByteLen())
	var ar arena
	defer ar.free()
	// A []byte holds no Go pointers, so C may write into it during the call.
	buf := make([]byte, max(n, 1))
	eb := newErrBuf()
	defer eb.free()
	name := ar.cstring(t.Name)
	err := m.call(eb, "read tensor", func() C.int {
		return C.ort_call_get_tensor(m.api, m.h, C.int32_t(kind), name, unsafe.Pointer(unsafe.SliceData(buf)), C.size_t(n), eb.p, errLen)
	})
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// WriteTensor overwrites one tensor (weights in place, LoRA, optimizer state).
func (m *Model) WriteTensor(kind TensorKind, t model.Tensor) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.h == nil {
		return ErrClosed
	}
	return m.writeTensor(kind, t)
}

func (m *Model) writeTensor(kind TensorKind, t model.Tensor) error {
	code, ok := dtypeCodes[t.DType]
	if !ok {
		return fmt.Errorf("tensor %s: dtype %s is not supported", t.Name, t.DType)
	}
	if want := (model.TensorSpec{DType: t.DType, Shape: t.Shape}).ByteLen(); int64(len(t.Data)) != want {
		return fmt.Errorf("tensor %s: %d bytes, %s%v needs %d", t.Name, len(t.Data), t.DType, t.Shape, want)
	}
	var ar arena
	defer ar.free()
	eb := newErrBuf()
	defer eb.free()
	data := ccopy(&ar, []byte{0}) // for empty tensors
	if len(t.Data) > 0 {
		// Passed without a copy: the bytes hold no Go pointers and the
		// worker copies them before returning.
		data = unsafe.Pointer(unsafe.SliceData(t.Data))
	}
	name, shape := ar.cstring(t.Name), (*C.int64_t)(ccopy(&ar, t.Shape))
	return m.call(eb, "set tensor", func() C.int {
		return C.ort_call_set_tensor(m.api, m.h, C.int32_t(kind), name, code, shape, C.int32_t(len(t.Shape)), data, eb.p, errLen)
	})
}

// call runs one C entry point on the library's thread and turns its status
// into an error prefixed by what.
func (m *Model) call(eb errBuf, what string, f func() C.int) error {
	rc, err := m.lib.run(f)
	if err != nil {
		return err
	}
	return eb.err(rc, what)
}
