package train

import (
	"fmt"
	"strings"

	"github.com/rs/zerolog"
)

// largeOnCPU is the size from which training on CPU is worth a warning:
// above it a step of full fine-tuning takes minutes to hours on a few cores.
const largeOnCPU = 500_000_000

// cpuTrainingMemory is what full fine-tuning of params parameters holds on
// the device: the weights in dtype, float32 gradients and AdamW's two
// float32 moments (LoRA keeps the gradients and moments of the adapters
// only, so the weights alone).
func cpuTrainingMemory(params int64, dtype string, lora bool) int64 {
	weight := int64(4)
	if d := strings.ToLower(dtype); d == "bfloat16" || d == "float16" || d == "bf16" || d == "fp16" {
		weight = 2
	}
	if lora {
		return params * weight
	}
	return params * (weight + 4 + 8)
}

// warnLargeOnCPU says, before a long run starts, that a large model is
// about to train on CPU: the headline command with Qwen/Qwen3-4B and the
// default device would otherwise spend hours on a step without a word.
func warnLargeOnCPU(device, dtype string, params int64, lora bool, log zerolog.Logger) {
	if !strings.EqualFold(device, "cpu") || params < largeOnCPU {
		return
	}
	log.Warn().Int64("params", params).Str("dtype", dtype).Bool("lora", lora).
		Str("training_memory", fmt.Sprintf("%.1f GiB", float64(cpuTrainingMemory(params, dtype, lora))/(1<<30))).
		Msgf("training a %.1fB-parameter model on the CPU: expect minutes to hours per optimizer step and %.0f GiB or more of memory; "+
			"set worker.device: cuda (--device cuda) with a CUDA build of the worker, or use a smaller model",
			float64(params)/1e9, float64(cpuTrainingMemory(params, dtype, lora))/(1<<30))
}
