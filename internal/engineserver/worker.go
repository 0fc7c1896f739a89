package engineserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/worker"
)

// WorkerOptions say which model serve-engine loads and how.
type WorkerOptions struct {
	ModelDir string
	// WorkerLib and Getenv find the worker library (worker.FindLibrary:
	// WorkerLib if set, else $ORTRAIN_WORKER_LIB and the usual places).
	WorkerLib string
	Getenv    func(string) string
	Device    string // cpu, cuda, cuda:N
	DType     string // empty: the device's default
	Threads   int    // 0: libtorch's default
	Seed      int64  // for requests that give none
	// LoRARank > 0 serves runtime-loaded adapters of rank up to LoRARank.
	LoRARank int
	Logger   zerolog.Logger
}

// WorkerBackend is serve-engine's Backend over the libtorch worker. One
// mutex orders sampling, weight reloads and adapter swaps, so a batch never
// sees half-written weights.
type WorkerBackend struct {
	mu  sync.Mutex
	lib *worker.Library
	m   *worker.Model
	cfg *model.Config
	tok *chat.Tokenizer

	// LoRA: the worker holds one adapter slot of rank loraRank (scale 1);
	// adapters live here, already padded and scaled, and are written into
	// the slot when a batch asks for a different one.
	loraInfo []worker.TensorInfo
	loraRank int
	adapters map[string][]model.Tensor
	current  string // adapter in the slot; "" = base (B matrices zero)
	stale    bool   // the slot must be rewritten before the next batch
}

// OpenWorker loads the worker library and the model directory; Close
// releases both.
func OpenWorker(ctx context.Context, o WorkerOptions) (*WorkerBackend, error) {
	cfg, err := model.LoadConfig(o.ModelDir)
	if err != nil {
		return nil, fmt.Errorf("--model: %w", err)
	}
	path, _, err := worker.FindLibrary(o.WorkerLib, o.Getenv)
	if err != nil {
		return nil, err
	}
	lib, err := worker.Open(path)
	if err != nil {
		return nil, err
	}
	mo := worker.ModelOptions{Dir: o.ModelDir, Device: o.Device, DType: o.DType, Threads: o.Threads, Seed: o.Seed}
	if o.LoRARank > 0 {
		// Scale 1 (alpha = rank): each adapter's own alpha/r is folded into
		// its B matrix when it is installed.
		mo.LoRA = &worker.LoRAOptions{Rank: o.LoRARank, Alpha: float64(o.LoRARank)}
	}
	m, err := lib.LoadModel(ctx, mo)
	if err != nil {
		lib.Close()
		return nil, err
	}
	if k := m.DecodeKernels(); k.Applies {
		o.Logger.Info().Str("mode", k.Mode).Msg("decode kernels: " + k.Summary())
	}
	b := &WorkerBackend{lib: lib, m: m, cfg: cfg}
	if tok, err := chat.LoadTokenizer(o.ModelDir); err == nil {
		b.tok = tok
	} else {
		o.Logger.Warn().Err(err).Msg("no tokenizer: completion text will be empty (token ids are unaffected)")
	}
	if o.LoRARank > 0 {
		if err := b.initLoRA(); err != nil {
			b.Close()
			return nil, err
		}
	}
	return b, nil
}

// Close releases the model and the worker library.
func (b *WorkerBackend) Close() error {
	return errors.Join(b.m.Close(), b.lib.Close())
}

// MaxPositionEmbeddings is the model's context length (the default
// --max-model-len).
func (b *WorkerBackend) MaxPositionEmbeddings() int { return b.cfg.MaxPositionEmbeddings }

// VocabSize is the model's vocabulary size (config.json vocab_size): the
// token ids its embedding has rows for.
func (b *WorkerBackend) VocabSize() int { return b.cfg.VocabSize }

// EOSIDs are the model's end-of-sequence ids (stop ids unless a request
// sets ignore_eos).
func (b *WorkerBackend) EOSIDs() []int32 {
	ids := make([]int32, 0, len(b.cfg.EOSTokenID))
	for _, id := range b.cfg.EOSTokenID {
		ids = append(ids, int32(id))
	}
	return ids
}

func (b *WorkerBackend) initLoRA() error {
	info, err := b.m.Tensors(worker.KindLoRA)
	if err != nil {
		return fmt.Errorf("list LoRA tensors: %w", err)
	}
	b.loraInfo, b.adapters, b.stale = info, map[string][]model.Tensor{}, true
	for _, t := range info {
		if strings.HasSuffix(t.Name, ".lora_A.weight") && len(t.Shape) == 2 {
			b.loraRank = int(t.Shape[0])
		}
	}
	return nil
}

func (b *WorkerBackend) SampleBatch(ctx context.Context, adapter string, reqs []engine.Request) ([]engine.Result, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.loraInfo != nil && (adapter != b.current || b.stale) {
		if err := b.install(adapter); err != nil {
			return nil, err
		}
	} else if b.loraInfo == nil && adapter != "" {
		return nil, fmt.Errorf("adapter %q requested but serve-engine runs without --enable-lora", adapter)
	}
	return engine.WorkerSampler{Model: b.m}.SampleBatch(ctx, reqs)
}

// install writes adapter's tensors into the worker's slot; modules the
// adapter does not cover get a zero B, so they contribute nothing.
func (b *WorkerBackend) install(adapter string) error {
	have := map[string]model.Tensor{}
	for _, t := range b.adapters[adapter] {
		have[t.Name] = t
	}
	for _, info := range b.loraInfo {
		t, ok := have[info.Name]
		if !ok {
			if !strings.HasSuffix(info.Name, ".lora_B.weight") {
				continue
			}
			t = model.Tensor{Name: info.Name, DType: info.DType, Shape: info.Shape,
				Data: make([]byte, (model.TensorSpec{DType: info.DType, Shape: info.Shape}).ByteLen())}
		}
		if err := b.m.WriteTensor(worker.KindLoRA, t); err != nil {
			b.stale = true
			return fmt.Errorf("install adapter %q: %w", adapter, err)
		}
	}
	b.current, b.stale = adapter, false
	return nil
}

func (b *WorkerBackend) ReloadWeights(ctx context.Context, dir string) error {
	tensors, err := model.ReadModelTensors(dir)
	if err != nil {
		return fmt.Errorf("reload weights: %w", err)
	}
	names := make([]string, 0, len(tensors))
	for n := range tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	b.mu.Lock()
	defer b.mu.Unlock()
	headers := map[string]*model.SafetensorsHeader{}
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		t := tensors[name]
		path := filepath.Join(dir, t.File)
		h, ok := headers[path]
		if !ok {
			if h, err = model.ReadSafetensorsHeader(path); err != nil {
				return fmt.Errorf("reload weights: %w", err)
			}
			headers[path] = h
		}
		data, err := model.ReadTensorData(path, h, t.TensorInfo)
		if err != nil {
			return fmt.Errorf("reload weights: %w", err)
		}
		if err := b.m.WriteTensor(worker.KindWeight, model.Tensor{Name: name, DType: t.DType, Shape: t.Shape, Data: data}); err != nil {
			return fmt.Errorf("reload weights from %s: %w", dir, err)
		}
	}
	return nil
}

// peftConfig is the part of adapter_config.json that shapes the weights.
type peftConfig struct {
	R             int      `json:"r"`
	LoRAAlpha     float64  `json:"lora_alpha"`
	UseRSLoRA     bool     `json:"use_rslora"`
	UseDoRA       bool     `json:"use_dora"`
	Bias          string   `json:"bias"`
	TargetModules []string `json:"target_modules"`
}

func (b *WorkerBackend) LoadAdapter(ctx context.Context, name, dir string) error {
	if b.loraInfo == nil {
		return fmt.Errorf("load adapter %q: serve-engine runs without --enable-lora", name)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "adapter_config.json"))
	if err != nil {
		return fmt.Errorf("load adapter %q: %w", name, err)
	}
	var pc peftConfig
	if err := json.Unmarshal(raw, &pc); err != nil {
		return fmt.Errorf("load adapter %q: adapter_config.json: %w", name, err)
	}
	switch {
	case pc.R < 1 || pc.R > b.loraRank:
		return fmt.Errorf("load adapter %q: rank %d must be in 1..%d (--max-lora-rank)", name, pc.R, b.loraRank)
	case pc.UseDoRA:
		return fmt.Errorf("load adapter %q: DoRA adapters are not supported", name)
	case pc.Bias != "" && pc.Bias != "none":
		return fmt.Errorf("load adapter %q: bias %q is not supported (want none)", name, pc.Bias)
	}
	scale := pc.LoRAAlpha / float64(pc.R)
	if pc.UseRSLoRA {
		scale = pc.LoRAAlpha / math.Sqrt(float64(pc.R))
	}
	_, tensors, err := model.ReadSafetensors(filepath.Join(dir, "adapter_model.safetensors"))
	if err != nil {
		return fmt.Errorf("load adapter %q: %w", name, err)
	}
	slots := map[string]worker.TensorInfo{}
	for _, info := range b.loraInfo {
		slots[info.Name] = info
	}
	var out []model.Tensor
	for _, t := range tensors {
		info, ok := slots[t.Name]
		if !ok {
			return fmt.Errorf("load adapter %q: tensor %s matches no LoRA module of the served model", name, t.Name)
		}
		pt, err := padLoRA(t, info, pc.R, b.loraRank, scale)
		if err != nil {
			return fmt.Errorf("load adapter %q: %w", name, err)
		}
		out = append(out, pt)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.adapters[name] = out
	if b.current == name {
		b.stale = true
	}
	return nil
}

// padLoRA widens a rank-r PEFT tensor to the slot's rank R with zeros (A:
// [r,in] → [R,in]; B: [out,r] → [out,R]) and folds the adapter's scale
// into B, so the slot's scale of 1 reproduces scale·B·A exactly.
func padLoRA(t model.Tensor, slot worker.TensorInfo, r, R int, scale float64) (model.Tensor, error) {
	vals, err := decodeFloats(t)
	if err != nil {
		return model.Tensor{}, err
	}
	isB := strings.HasSuffix(t.Name, ".lora_B.weight")
	if len(t.Shape) != 2 || len(slot.Shape) != 2 {
		return model.Tensor{}, fmt.Errorf("tensor %s has shape %v, want 2-D", t.Name, t.Shape)
	}
	rows, cols := int(t.Shape[0]), int(t.Shape[1])
	want := [2]int{r, int(slot.Shape[1])}
	if isB {
		want = [2]int{int(slot.Shape[0]), r}
	}
	if rows != want[0] || cols != want[1] {
		return model.Tensor{}, fmt.Errorf("tensor %s has shape %v, want %v for rank %d", t.Name, t.Shape, want, r)
	}
	out := make([]float32, slot.Shape[0]*slot.Shape[1])
	outCols := int(slot.Shape[1])
	for i := range rows {
		for j := range cols {
			v := vals[i*cols+j]
			if isB {
				v = float32(float64(v) * scale)
			}
			out[i*outCols+j] = v
		}
	}
	data, err := encodeFloats(out, slot.DType)
	return model.Tensor{Name: t.Name, DType: slot.DType, Shape: slot.Shape, Data: data}, err
}

func decodeFloats(t model.Tensor) ([]float32, error) {
	switch t.DType {
	case model.F32:
		return model.DecodeF32(t.Data), nil
	case model.BF16:
		return model.DecodeBF16(t.Data), nil
	case model.F16:
		return model.DecodeF16(t.Data), nil
	}
	return nil, fmt.Errorf("tensor %s has dtype %s (want F32, BF16 or F16)", t.Name, t.DType)
}

func encodeFloats(v []float32, dt model.DType) ([]byte, error) {
	switch dt {
	case model.F32:
		return model.EncodeF32(v), nil
	case model.BF16:
		return model.EncodeBF16(v), nil
	case model.F16:
		return model.EncodeF16(v), nil
	}
	return nil, fmt.Errorf("LoRA slot dtype %s is not supported", dt)
}

func (b *WorkerBackend) UnloadAdapter(ctx context.Context, name string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.adapters, name)
	if b.current == name {
		b.stale = true
	}
	return nil
}

func (b *WorkerBackend) Detokenize(ids []int32) string {
	if b.tok == nil {
		return ""
	}
	return b.tok.Decode(ids, false)
}

// Tokenizer is the model's tokenizer (nil when the model directory has
// none), for text and chat completions (NewTextChat).
func (b *WorkerBackend) Tokenizer() *chat.Tokenizer { return b.tok }
