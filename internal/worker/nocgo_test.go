//go:build !cgo

package worker

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// requireNoCGO checks err is the typed error of a build without cgo.
func requireNoCGO(t *testing.T, err error) {
	t.Helper()
	require.ErrorIs(t, err, ErrNoCGO)
	var nc *NoCGOError
	require.ErrorAs(t, err, &nc)
	require.Contains(t, err.Error(), "built without cgo (CGO_ENABLED=0)")
}

func TestNoCGOOpen(t *testing.T) {
	lib, err := Open(filepath.Join(t.TempDir(), LibraryName))
	requireNoCGO(t, err)
	assert.Nil(t, lib)
	assert.Contains(t, err.Error(), "open worker library ")
	assert.False(t, errors.Is(err, ErrClosed))

	var l *Library
	assert.Equal(t, Info{}, l.Info())
	m, err := l.LoadModel(context.Background(), ModelOptions{Dir: t.TempDir()})
	requireNoCGO(t, err)
	assert.Nil(t, m)
	requireNoCGO(t, l.Close())
	requireNoCGO(t, (&Library{}).Close())
}

// TestNoCGOHandles calls every method of zero and nil handles: each fails
// with ErrNoCGO (or returns a zero value) and none panics.
func TestNoCGOHandles(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	mb := grpo.MicroBatch{Rows: []grpo.Row{{Tokens: []int32{1, 2}, PromptLen: 1, LossMask: []uint8{1}}}, RoundTokens: 1, GradAccumSteps: 1}
	for _, m := range []*Model{{}, nil} {
		assert.Nil(t, m.Config())
		assert.Equal(t, model.DType(""), m.DType())
		_, err := m.Tensors(KindWeight)
		requireNoCGO(t, err)
		_, err = m.ReadTensor(KindWeight, TensorInfo{Name: "x", DType: model.F32, Shape: []int64{1}})
		requireNoCGO(t, err)
		requireNoCGO(t, m.WriteTensor(KindWeight, model.Tensor{Name: "x", DType: model.F32, Shape: []int64{1}, Data: make([]byte, 4)}))
		_, err = m.Sample(ctx, []SampleRequest{{PromptIDs: []int32{1}, MaxNewTokens: 1}})
		requireNoCGO(t, err)
		_, _, err = m.Logprobs(ctx, mb.Rows, 1, false)
		requireNoCGO(t, err)
		_, err = m.ForwardBackward(ctx, mb, grpo.LossConfig{})
		requireNoCGO(t, err)
		_, err = m.EvalLoss(ctx, mb, grpo.LossConfig{})
		requireNoCGO(t, err)
		_, err = m.OptimizerStep(ctx, 1e-5)
		requireNoCGO(t, err)
		requireNoCGO(t, m.ZeroGrad(ctx))
		_, ok, err := m.DeviceMemory(ctx, true)
		requireNoCGO(t, err)
		assert.False(t, ok)
		d, err := m.NewDecoder(ctx, DecoderOptions{})
		requireNoCGO(t, err)
		assert.Nil(t, d)
		g, err := m.JoinGroup(ctx, DistOptions{Addr: "127.0.0.1", Port: 29500, WorldSize: 1})
		requireNoCGO(t, err)
		assert.Nil(t, g)
		requireNoCGO(t, m.MergeOptimizerShards(ctx, filepath.Join(dir, "optimizer.safetensors"), nil))
		// checkpoint.go builds in both: it fails at the worker, writing nothing.
		requireNoCGO(t, m.SaveHF(ctx, filepath.Join(dir, "hf")))
		requireNoCGO(t, m.SavePEFT(ctx, filepath.Join(dir, "peft")))
		requireNoCGO(t, m.LoadPEFT(ctx, filepath.Join(dir, "peft")))
		requireNoCGO(t, m.SaveOptimizer(ctx, filepath.Join(dir, "optimizer.safetensors")))
		requireNoCGO(t, m.LoadOptimizer(ctx, filepath.Join(dir, "optimizer.safetensors")))
		requireNoCGO(t, m.Close())
	}
	entries, err := filepath.Glob(filepath.Join(dir, "*"))
	require.NoError(t, err)
	assert.Empty(t, entries)

	for _, d := range []*Decoder{{}, nil} {
		_, err := d.Add(ctx, []DecodeRequest{{SampleRequest: SampleRequest{PromptIDs: []int32{1}, MaxNewTokens: 1}}})
		requireNoCGO(t, err)
		_, err = d.Step(ctx, 1)
		requireNoCGO(t, err)
		_, err = d.Advance(ctx, 1)
		requireNoCGO(t, err)
		requireNoCGO(t, d.Release(ctx, 0))
		requireNoCGO(t, d.Forget(ctx, "k"))
		_, err = d.Stats(ctx)
		requireNoCGO(t, err)
		requireNoCGO(t, d.Close())
	}

	for _, g := range []*Group{{}, nil} {
		assert.Zero(t, g.Rank())
		assert.Zero(t, g.WorldSize())
		assert.Empty(t, g.Backend())
		assert.Equal(t, ShardNone, g.Shard())
		requireNoCGO(t, g.BroadcastTrainable(ctx))
		_, err := g.ReduceGrads(ctx)
		requireNoCGO(t, err)
		_, err = g.AllReduceSum(ctx, []float64{1})
		requireNoCGO(t, err)
		_, err = g.AllReduce(ctx, ReduceMax, []float64{1})
		requireNoCGO(t, err)
		_, err = g.AllGather(ctx, []byte("x"))
		requireNoCGO(t, err)
		_, err = g.OptimizerStep(ctx, 1e-5)
		requireNoCGO(t, err)
		requireNoCGO(t, g.SaveOptimizerShard(ctx, filepath.Join(dir, "shard.safetensors")))
		requireNoCGO(t, g.Close())
	}
}

func TestNoCGOErrorText(t *testing.T) {
	assert.Equal(t, "worker: this ortrain was built without cgo (CGO_ENABLED=0): training, sampling and checkpoints "+
		"need the worker; build with cgo and a C compiler (make build)", (&NoCGOError{}).Error())
	assert.Equal(t, "sample: "+ErrNoCGO.Error(), (&NoCGOError{Op: "sample"}).Error())
	assert.ErrorIs(t, &NoCGOError{Op: "sample"}, ErrNoCGO)
	assert.NotErrorIs(t, ErrNoCGO, ErrTimeout)
}

// Without cgo no library is looked for: the error is the build, not a path.
func TestFindLibraryNamesTheNoCGOBuild(t *testing.T) {
	_, _, err := FindLibrary("", func(string) string { return "" })
	require.ErrorIs(t, err, ErrNoCGO)
	var nf *NotFoundError
	require.False(t, errors.As(err, &nf), "not a missing file: the build cannot open any")
}
