//go:build !cgo

package worker

// This file stands in for the cgo files (abi.go cmem.go decode_kernels_cgo.go decoder.go dist.go
// library.go model.go sample.go shard.go train.go) in a build without cgo:
// the handle types hold no C state, and every function and method those
// files export is here with the same signature. Each returns a *NoCGOError
// (errors.Is ErrNoCGO) and the accessors return zero values; none
// dereferences its receiver, so nil and zero handles are safe too.
// checkpoint.go and window.go build in both: their methods reach the worker
// only through begin, tensors, readTensor and writeTensor, which fail here.

import (
	"context"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/model"
)

// CGOEnabled says whether this build can open the worker library.
const CGOEnabled = false

// noCGO is the error of the call op in a build without cgo.
func noCGO(op string) error { return &NoCGOError{Op: op} }

// Library is an opened worker library. Without cgo none can be opened:
// Open returns a *NoCGOError.
type Library struct{}

// Open returns a *NoCGOError: a build without cgo cannot load the library.
func Open(path string) (*Library, error) { return nil, noCGO("open worker library " + path) }

// Info returns the zero Info.
func (l *Library) Info() Info { return Info{} }

// Close returns a *NoCGOError.
func (l *Library) Close() error { return noCGO("close worker library") }

// LoadModel returns a *NoCGOError.
func (l *Library) LoadModel(ctx context.Context, o ModelOptions) (*Model, error) {
	return nil, noCGO("load model " + o.Dir)
}

// Model is a loaded policy. Without cgo none can be loaded; the fields are
// those checkpoint.go and window.go read, and stay zero.
type Model struct {
	cfg   *model.Config
	opts  ModelOptions
	dtype model.DType
	shard ShardStage
}

// begin fails: there is no worker to lock.
func (m *Model) begin(ctx context.Context) (func(), error) { return nil, noCGO("") }

func (m *Model) tensors(kind TensorKind, nameRoom, shapeRoom int) ([]TensorInfo, error) {
	return nil, noCGO("list tensors")
}

func (m *Model) readTensor(kind TensorKind, t TensorInfo) ([]byte, error) {
	return nil, noCGO("read tensor")
}

func (m *Model) writeTensor(kind TensorKind, t model.Tensor) error { return noCGO("set tensor") }

// Config returns nil.
func (m *Model) Config() *model.Config { return nil }

// DType returns "".
func (m *Model) DType() model.DType { return "" }

// Close returns a *NoCGOError.
func (m *Model) Close() error { return noCGO("close model") }

// Tensors returns a *NoCGOError.
func (m *Model) Tensors(kind TensorKind) ([]TensorInfo, error) { return m.tensors(kind, 0, 0) }

// ReadTensor returns a *NoCGOError.
func (m *Model) ReadTensor(kind TensorKind, t TensorInfo) ([]byte, error) {
	return m.readTensor(kind, t)
}

// WriteTensor returns a *NoCGOError.
func (m *Model) WriteTensor(kind TensorKind, t model.Tensor) error { return m.writeTensor(kind, t) }

// Sample returns a *NoCGOError.
func (m *Model) Sample(ctx context.Context, reqs []SampleRequest) ([]SampleResult, error) {
	return nil, noCGO("sample")
}

// Logprobs returns a *NoCGOError.
func (m *Model) Logprobs(ctx context.Context, rows []grpo.Row, temperature float64, ref bool) (logps, entropies [][]float32, err error) {
	return nil, nil, noCGO("logprobs")
}

// ForwardBackward returns a *NoCGOError.
func (m *Model) ForwardBackward(ctx context.Context, mb grpo.MicroBatch, cfg grpo.LossConfig) (LossStats, error) {
	return LossStats{}, noCGO("forward/backward")
}

// EvalLoss returns a *NoCGOError.
func (m *Model) EvalLoss(ctx context.Context, mb grpo.MicroBatch, cfg grpo.LossConfig) (LossStats, error) {
	return LossStats{}, noCGO("eval loss")
}

// OptimizerStep returns a *NoCGOError.
func (m *Model) OptimizerStep(ctx context.Context, lr float64) (StepStats, error) {
	return StepStats{}, noCGO("optimizer step")
}

// ZeroGrad returns a *NoCGOError.
func (m *Model) ZeroGrad(ctx context.Context) error { return noCGO("zero grad") }

// DeviceMemory returns a *NoCGOError.
func (m *Model) DeviceMemory(ctx context.Context, resetPeak bool) (mem DeviceMemory, ok bool, err error) {
	return DeviceMemory{}, false, noCGO("device memory")
}

// NewDecoder returns a *NoCGOError.
func (m *Model) NewDecoder(ctx context.Context, o DecoderOptions) (*Decoder, error) {
	return nil, noCGO("new decoder")
}

// JoinGroup returns a *NoCGOError.
func (m *Model) JoinGroup(ctx context.Context, o DistOptions) (*Group, error) {
	return nil, noCGO("join process group")
}

// MergeOptimizerShards returns a *NoCGOError: it checks the shards against
// a loaded model's tensors. The package function MergeOptimizerShards needs
// no worker.
func (m *Model) MergeOptimizerShards(ctx context.Context, dst string, shards []string) error {
	return noCGO("merge optimizer shards")
}

// Decoder is a running batch of sequences over a Model. Without cgo none
// can be created: Model.NewDecoder returns a *NoCGOError.
type Decoder struct{}

// Add returns a *NoCGOError.
func (d *Decoder) Add(ctx context.Context, reqs []DecodeRequest) ([]int64, error) {
	return nil, noCGO("decoder add")
}

// Step returns a *NoCGOError.
func (d *Decoder) Step(ctx context.Context, live int) ([]DecodeEvent, error) {
	return nil, noCGO("decoder step")
}

// Advance returns a *NoCGOError.
func (d *Decoder) Advance(ctx context.Context, live int) ([]DecodeEvent, error) {
	return nil, noCGO("decoder step")
}

// Release returns a *NoCGOError.
func (d *Decoder) Release(ctx context.Context, seq int64) error { return noCGO("decoder release") }

// Forget returns a *NoCGOError.
func (d *Decoder) Forget(ctx context.Context, key string) error { return noCGO("decoder forget") }

// Stats returns a *NoCGOError.
func (d *Decoder) Stats(ctx context.Context) (DecoderStats, error) {
	return DecoderStats{}, noCGO("decoder stats")
}

// Close returns a *NoCGOError.
func (d *Decoder) Close() error { return noCGO("close decoder") }

// Group is a joined data-parallel process group. Without cgo none can be
// joined: Model.JoinGroup returns a *NoCGOError.
type Group struct{}

// Rank returns 0.
func (g *Group) Rank() int { return 0 }

// WorldSize returns 0.
func (g *Group) WorldSize() int { return 0 }

// Backend returns "".
func (g *Group) Backend() string { return "" }

// Shard returns ShardNone.
func (g *Group) Shard() ShardStage { return ShardNone }

// BroadcastTrainable returns a *NoCGOError.
func (g *Group) BroadcastTrainable(ctx context.Context) error {
	return noCGO("broadcast trainable tensors")
}

// ReduceGrads returns a *NoCGOError.
func (g *Group) ReduceGrads(ctx context.Context) (GradSyncStats, error) {
	return GradSyncStats{}, noCGO("reduce gradients")
}

// AllReduceSum returns a *NoCGOError.
func (g *Group) AllReduceSum(ctx context.Context, values []float64) ([]float64, error) {
	return g.AllReduce(ctx, ReduceSum, values)
}

// AllReduce returns a *NoCGOError.
func (g *Group) AllReduce(ctx context.Context, op Reduction, values []float64) ([]float64, error) {
	return nil, noCGO("all-reduce")
}

// AllGather returns a *NoCGOError.
func (g *Group) AllGather(ctx context.Context, data []byte) ([][]byte, error) {
	return nil, noCGO("all-gather")
}

// OptimizerStep returns a *NoCGOError.
func (g *Group) OptimizerStep(ctx context.Context, lr float64) (ShardStepStats, error) {
	return ShardStepStats{}, noCGO("sharded optimizer step")
}

// SaveOptimizerShard returns a *NoCGOError.
func (g *Group) SaveOptimizerShard(ctx context.Context, path string) error {
	return noCGO("save optimizer shard " + path)
}

// Close returns a *NoCGOError.
func (g *Group) Close() error { return noCGO("leave process group") }

// MeasureDecodeKernels returns a *NoCGOError.
func (l *Library) MeasureDecodeKernels(ctx context.Context, cfg *model.Config, threads int, cacheDir string) (KernelMeasurement, error) {
	return KernelMeasurement{}, noCGO("measure decode kernels")
}

// DecodeKernels returns the zero DecodeKernels.
func (m *Model) DecodeKernels() DecodeKernels { return DecodeKernels{} }

// ChooseDecodeKernels returns a *NoCGOError.
func (l *Library) ChooseDecodeKernels(ctx context.Context, mode string, cfg *model.Config, threads int, cacheDir string) (DecodeKernels, error) {
	return DecodeKernels{}, noCGO("choose decode kernels")
}

// BenchGemm returns a *NoCGOError.
func (l *Library) BenchGemm(shapes []GemmTiming, threads int) ([]GemmTiming, error) {
	return nil, noCGO("bench gemm")
}

// GatherUnit needs cgo.
func (g *Group) GatherUnit(ctx context.Context, unit int) (int, error) {
	return 0, noCGO("gather unit")
}

// ReadSharded needs cgo.
func (g *Group) ReadSharded(ctx context.Context, kind TensorKind, fn func(TensorInfo, []byte) error) error {
	return noCGO("read sharded tensors")
}

// ShardMemory needs cgo.
func (m *Model) ShardMemory(ctx context.Context, resetPeak bool) (ShardMemory, error) {
	return ShardMemory{}, noCGO("shard memory")
}

// SaveParameterShard needs cgo.
func (g *Group) SaveParameterShard(ctx context.Context, path string) error {
	return noCGO("save parameter shard")
}
