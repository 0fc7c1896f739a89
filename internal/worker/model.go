//go:build cgo

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
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"unsafe"

	"github.com/ortrain/ortrain/internal/model"
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
	// kernels is the choice of CPU decode kernels made at load.
	kernels DecodeKernels
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
	if err := m.chooseKernels(ctx, o); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
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

// Tensors lists the tensors of a kind, in a stable order.
func (m *Model) Tensors(kind TensorKind) ([]TensorInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.tensors(kind, maxTensorName, maxTensorDims)
}

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
