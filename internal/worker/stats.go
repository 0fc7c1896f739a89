package worker

import "time"

// LossStats are one micro-batch's loss and metric sums and counts, so the
// trainer reduces exactly across micro-batches and processes
// (grpo-reference.md §5): e.g. entropy = sum EntropySum / sum ActiveTokens.
// The worker writes them in place: the fields mirror ort_loss_stats in
// csrc/worker_abi.h, in order, all float64 (checked at compile time in abi.go).
type LossStats struct {
	// Loss is the micro-batch loss that was back-propagated (§4.6).
	Loss           float64
	ActiveTokens   float64 // sum of the loss mask
	Rows           float64
	RowsWithTokens float64 // rows with at least one active token
	// Clip counts (clip loss types): tokens, or rows at sequence level;
	// ClipDenom is the matching token or row count.
	ClipLow, ClipHigh, ClipRegion, ClipDenom float64
	// ClipLowMin and ClipHighMax are the min / max over rows of the per-row
	// clipped fraction (clip_ratio/low_min, clip_ratio/high_max).
	ClipLowMin, ClipHighMax float64
	CISPOClip               float64 // tokens with w > epsilon_high and A > 0 (cispo)
	KLSum                   float64 // sum of k3 over active tokens (beta != 0)
	EntropySum              float64 // sum of token entropies over active tokens
	VESPOPhiSum             float64 // sum over rows of phi (vespo)
	// CorrectTokens counts active tokens whose argmax logit (at the loss's
	// temperature) is the label: TRL's mean_token_accuracy is
	// sum CorrectTokens / sum ActiveTokens. Every loss type reports it.
	CorrectTokens float64
}

// StepStats describe one optimizer step.
type StepStats struct {
	GradNorm float64 // global L2 norm before clipping
	LR       float64
}

// ShardStepStats describe one sharded optimizer step.
type ShardStepStats struct {
	StepStats
	// CommTime is the time spent waiting on the norm's all-reduce and the
	// parameters' all-gather.
	CommTime time.Duration
	// GatherBytes are the parameter bytes this rank sent to the all-gather.
	GatherBytes int64
}

// GradSyncStats describe one gradient reduction (ReduceGrads).
type GradSyncStats struct {
	Bytes   int64 // bytes each rank contributed, as sent (Gloo sends 16-bit floats as float32)
	Buckets int   // collectives, one per bucket
	// Emulated: the reduce-scatter of a sharded group was built from an
	// all-reduce (Gloo: 1.13 has no reduce-scatter, and 2.14's never
	// completed in our tests); NCCL runs its own.
	Emulated bool `json:",omitempty"`
	// Stage 3 (ShardParameters): the passes since the last ReduceGrads,
	// which gathered the layers and reduce-scattered their gradients as
	// they ran: the parameter bytes this rank sent to the all-gathers, and
	// the time they waited on collectives (the rest overlapped compute).
	GatherBytes int64         `json:",omitempty"`
	PassWait    time.Duration `json:",omitempty"`
}

// DeviceMemory is what the device allocator holds for a model's device.
type DeviceMemory struct {
	Allocated, PeakAllocated int64 // bytes now, and at most since the last reset
}

// DecoderStats counts what a decoder holds and what its prefills saved.
type DecoderStats struct {
	Live, CachedEntries, CachedBytes, SlotBytes int64
	PrefillTokens, ReusedTokens, SharedTokens   int64
	Evictions                                   int64
}

// ShardMemory is what a rank holds of its model, in bytes (Model.ShardMemory).
type ShardMemory struct {
	ParamBytes int64 // parameters kept (stage 3: this rank's slices, frozen ones included)
	GradBytes  int64 // gradients kept between micro-batches (stages 2 and 3: the slices)
	OptimBytes int64 // AdamW moments
	// Stage 3: full tensors gathered now, and at most at once since the
	// last reset (prefetched units and gradients waiting to be
	// reduce-scattered included).
	GatheredBytes, PeakGatheredBytes int64
}
