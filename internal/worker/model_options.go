package worker

import (
	"fmt"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"

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
	// DecodeKernels chooses the kernels of CPU float32 sampling and
	// decoding: KernelsAuto ("" too) measures them on the model's shapes at
	// load, KernelsTorch and KernelsOneDNN fix them (Model.DecodeKernels).
	DecodeKernels string
	// KernelCacheDir keeps auto's measurements, one file per directory
	// ("" = KernelCacheDir(os.Getenv)).
	KernelCacheDir string
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
	if o.DecodeKernels == "" {
		o.DecodeKernels = KernelsAuto
	}
	if !slices.Contains(KernelModes, o.DecodeKernels) {
		return o, "", fmt.Errorf("decode_kernels %q is unknown (allowed: %s)", o.DecodeKernels, strings.Join(KernelModes, ", "))
	}
	if o.KernelCacheDir == "" {
		o.KernelCacheDir = KernelCacheDir(os.Getenv)
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
