package vllm

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ParseGPUs reads a comma-separated list of GPU indices ("2,3").
func ParseGPUs(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("GPU list %q: %q is not a GPU index (want e.g. 2,3)", s, f)
		}
		out = append(out, n)
	}
	return out, nil
}

// JoinGPUs formats GPU indices for CUDA_VISIBLE_DEVICES.
func JoinGPUs(gpus []int) string {
	parts := make([]string, len(gpus))
	for i, g := range gpus {
		parts[i] = strconv.Itoa(g)
	}
	return strings.Join(parts, ",")
}

// GPUPlan is how the user asked vLLM to use GPUs.
type GPUPlan struct {
	// GPUs are the physical GPUs for vLLM (engine.vllm_gpus / --gpus).
	GPUs []int
	// Replicas is the number of servers; 0 derives len(GPUs)/TP (at least 1).
	Replicas int
	// TensorParallelSize is GPUs per replica; 0 means 1.
	TensorParallelSize int
	// TrainerGPUs are the worker's GPUs (worker.gpus), which vLLM must not
	// share unless Colocate.
	TrainerGPUs []int
	Colocate    bool
}

// GPUAssignmentError is a plan that cannot be honoured; Field names the
// setting to change.
type GPUAssignmentError struct {
	Field string
	Msg   string
}

func (e *GPUAssignmentError) Error() string { return e.Field + ": " + e.Msg }

// Assign returns each replica's GPUs. With no GPUs (CPU servers such as
// `ortrain serve-engine`) every replica gets an empty list. It refuses, with
// the field to fix, a GPU listed twice, a GPU shared with the trainer
// without colocation, and a count that does not split into replicas×TP.
func (p GPUPlan) Assign() ([][]int, error) {
	tp := max(p.TensorParallelSize, 1)
	if p.TensorParallelSize < 0 {
		return nil, &GPUAssignmentError{"engine.vllm_tensor_parallel_size (--tensor-parallel-size)", fmt.Sprintf("%d must be at least 1", p.TensorParallelSize)}
	}
	if p.Replicas < 0 {
		return nil, &GPUAssignmentError{"engine.vllm_replicas (--replicas)", fmt.Sprintf("%d must be at least 1", p.Replicas)}
	}
	seen := map[int]bool{}
	for _, g := range p.GPUs {
		if g < 0 {
			return nil, &GPUAssignmentError{"engine.vllm_gpus (--gpus)", fmt.Sprintf("GPU %d is not a GPU index", g)}
		}
		if seen[g] {
			return nil, &GPUAssignmentError{"engine.vllm_gpus (--gpus)", fmt.Sprintf("GPU %d is listed twice; each GPU serves one replica", g)}
		}
		seen[g] = true
		if !p.Colocate && slices.Contains(p.TrainerGPUs, g) {
			return nil, &GPUAssignmentError{"engine.vllm_gpus (--gpus)", fmt.Sprintf("GPU %d is also a trainer GPU (worker.gpus %s); give vLLM other GPUs, or set engine.vllm_colocate: true and a low --gpu-memory-utilization", g, JoinGPUs(p.TrainerGPUs))}
		}
	}
	replicas := p.Replicas
	if len(p.GPUs) == 0 {
		return make([][]int, max(replicas, 1)), nil
	}
	if replicas == 0 {
		replicas = max(len(p.GPUs)/tp, 1)
	}
	if replicas*tp != len(p.GPUs) {
		return nil, &GPUAssignmentError{"engine.vllm_gpus (--gpus)", fmt.Sprintf("%d GPUs (%s) do not split into %d replica(s) × tensor parallel size %d; list %d GPUs or change the replica count",
			len(p.GPUs), JoinGPUs(p.GPUs), replicas, tp, replicas*tp)}
	}
	out := make([][]int, replicas)
	for i := range out {
		out[i] = slices.Clone(p.GPUs[i*tp : (i+1)*tp])
	}
	return out, nil
}
