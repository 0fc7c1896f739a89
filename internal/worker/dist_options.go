package worker

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// DefaultDistTimeout bounds the rendezvous and each collective when
// DistOptions.Timeout is 0. It is torch.distributed's default: a rank waits
// at the step's first collective while the slowest rank still rolls out, so
// the timeout must exceed the spread of rollout times. A peer that dies is
// noticed sooner (Gloo: its connection closes).
const DefaultDistTimeout = 30 * time.Minute

// DefaultBucketBytes is the gradient bucket size when
// DistOptions.BucketBytes is 0 (PyTorch DDP's bucket_cap_mb = 25).
const DefaultBucketBytes = 25 << 20

// DistOptions say how a rank joins a data-parallel process group: the
// launcher's MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE.
type DistOptions struct {
	// Addr and Port are the rendezvous: rank 0 serves a c10d TCPStore there
	// and the other ranks connect to it.
	Addr string
	Port int
	// Rank is this process's index in [0, WorldSize).
	Rank, WorldSize int
	// Timeout bounds the rendezvous and every collective: a peer that stays
	// away longer makes the call fail with a *TimeoutError (ErrTimeout)
	// instead of hang. 0 means DefaultDistTimeout.
	Timeout time.Duration
	// BucketBytes caps the bytes of one gradient all-reduce; 0 means
	// DefaultBucketBytes. Sharding slices each bucket over the ranks.
	BucketBytes int64
	// Shard spreads the optimizer over the ranks (ZeRO stage 1 or 2); see
	// ShardStage. Every rank must pass the same.
	Shard ShardStage
}

func (o DistOptions) resolve() (DistOptions, error) {
	if o.Timeout == 0 {
		o.Timeout = DefaultDistTimeout
	}
	if o.BucketBytes == 0 {
		o.BucketBytes = DefaultBucketBytes
	}
	switch {
	case o.Addr == "":
		return o, fmt.Errorf("master address is empty")
	case o.Port < 1 || o.Port > 65535:
		return o, fmt.Errorf("master port %d is not in 1..65535", o.Port)
	case o.WorldSize < 1:
		return o, fmt.Errorf("world size %d must be >= 1", o.WorldSize)
	case o.Rank < 0 || o.Rank >= o.WorldSize:
		return o, fmt.Errorf("rank %d is not in [0, %d)", o.Rank, o.WorldSize)
	case o.Timeout < time.Millisecond:
		return o, fmt.Errorf("timeout %v must be >= 1ms", o.Timeout)
	case o.BucketBytes < 0:
		return o, fmt.Errorf("bucket bytes %d must be >= 0", o.BucketBytes)
	case o.Shard < ShardNone || o.Shard > ShardParameters:
		return o, fmt.Errorf("shard stage %d is not none (0), optimizer (1), gradients (2) or parameters (3)", o.Shard)
	}
	return o, nil
}

// ShardStage is how a data-parallel group spreads the optimizer over its
// ranks (DistOptions.Shard), as DeepSpeed's ZeRO stages do. The trainable
// tensors are flattened into the gradient buckets and rank r of P owns a
// contiguous 1/P slice of each bucket.
type ShardStage int32

const (
	// ShardNone: every rank holds all gradients and AdamW state; the
	// gradients are all-reduced.
	ShardNone ShardStage = 0
	// ShardOptimizer (ZeRO-1): each rank holds the AdamW state of its
	// slice, receives its slice of the averaged gradients by
	// reduce-scatter after the last micro-batch, steps it, and the
	// parameters are all-gathered.
	ShardOptimizer ShardStage = 1
	// ShardGradients (ZeRO-2): as ShardOptimizer, and the gradients are
	// reduce-scattered after every micro-batch, so between micro-batches a
	// rank keeps only its slice of them.
	ShardGradients ShardStage = 2
	// ShardParameters (ZeRO-3, FSDP): as ShardGradients, and each rank keeps
	// only its slice of the parameters as well, cut by unit (the embedding,
	// each decoder layer, the final norm, the LM head; frozen LoRA base
	// weights and the reference copy too). A unit is all-gathered just
	// before it runs and dropped after; each layer's backward gathers it
	// again, recomputes it and reduce-scatters its gradients at once. Every
	// rank must make the same ForwardBackward, EvalLoss and Logprobs calls
	// in the same order, since they are collectives. The parameters are
	// sliced at the first such call, so BroadcastTrainable still sees them
	// whole; afterwards weights are read a unit at a time (GatherUnit,
	// ReadSharded) and the model cannot sample.
	ShardParameters ShardStage = 3
)

var shardStageNames = map[ShardStage]string{ShardNone: "none", ShardOptimizer: "optimizer", ShardGradients: "gradients",
	ShardParameters: "parameters"}

func (s ShardStage) String() string {
	if n, ok := shardStageNames[s]; ok {
		return n
	}
	return fmt.Sprintf("ShardStage(%d)", int32(s))
}

// ParseShardStage reads worker.shard: "none" (or ""), "optimizer",
// "gradients", "parameters".
func ParseShardStage(s string) (ShardStage, error) {
	if s == "" {
		return ShardNone, nil
	}
	for k, v := range shardStageNames {
		if v == s {
			return k, nil
		}
	}
	return ShardNone, fmt.Errorf("shard stage %q is not none, optimizer, gradients or parameters", s)
}

// Reduction is an element-wise reduction over the ranks.
type Reduction int32

const (
	ReduceSum Reduction = 0
	ReduceMin Reduction = 1
	ReduceMax Reduction = 2
)

var reductionNames = map[Reduction]string{ReduceSum: "sum", ReduceMin: "min", ReduceMax: "max"}

// ShardUnitOf is the stage-3 unit of a weight (HF name) or trainable tensor
// (PEFT name) of a model with layers decoder layers: 0 the embedding, 1+i
// layer i, layers+1 the final norm, layers+2 an untied LM head (a tied one
// is the embedding). -1: none.
func ShardUnitOf(name string, layers int, tied bool) int {
	name = strings.TrimPrefix(name, "base_model.model.")
	switch {
	case name == "model.embed_tokens.weight":
		return 0
	case name == "model.norm.weight":
		return layers + 1
	case name == "lm_head.weight":
		if tied {
			return 0
		}
		return layers + 2
	}
	rest, ok := strings.CutPrefix(name, "model.layers.")
	if !ok {
		return -1
	}
	i, _, ok := strings.Cut(rest, ".")
	n, err := strconv.Atoi(i)
	if !ok || err != nil || n < 0 || n >= layers {
		return -1
	}
	return n + 1
}
