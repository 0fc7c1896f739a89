//go:build cgo

package worker

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestABIVocabularyCoversGrpo: every loss type and importance-sampling mode
// grpo can parse has a code in worker_abi.h (the values themselves are
// checked at compile time in abi.go).
func TestABIVocabularyCoversGrpo(t *testing.T) {
	require.Len(t, grpo.LossTypeNames(), abiLossTypes)
	require.Len(t, grpo.ISCorrectionNames(), abiISCorrections)
}

// TestOutputBuffersAreChecked: a caller buffer too small for the output is
// an error naming both sizes, never a write past its end, and the model
// keeps working afterwards.
func TestOutputBuffersAreChecked(t *testing.T) {
	m := loadTiny(t, ModelOptions{})
	ctx := context.Background()
	rows := []grpo.Row{
		{Tokens: []int32{1, 2, 3, 4}, PromptLen: 2, LossMask: []uint8{1, 1}},
		{Tokens: []int32{5, 6, 7, 8, 9}, PromptLen: 2, LossMask: []uint8{1, 1, 1}},
	}

	t.Run("logprobs", func(t *testing.T) {
		err := m.logprobsInto(ctx, rows, 1, false, make([]float32, 4), make([]float32, 5))
		require.ErrorContains(t, err, "room for 4 floats, the batch has 5 completion tokens")
		err = m.logprobsInto(ctx, rows, 1, false, make([]float32, 5), nil)
		require.ErrorContains(t, err, "room for 0 floats, the batch has 5 completion tokens")
		lp, ent := make([]float32, 6), make([]float32, 6)
		lp[5], ent[5] = 42, 42
		require.NoError(t, m.logprobsInto(ctx, rows, 1, false, lp, ent))
		assert.Equal(t, float32(42), lp[5], "the worker wrote past the batch's tokens")
		assert.Equal(t, float32(42), ent[5])
		want, _, err := m.Logprobs(ctx, rows, 1, false)
		require.NoError(t, err)
		assert.Equal(t, append(append([]float32{}, want[0]...), want[1]...), lp[:5])
	})

	t.Run("sample", func(t *testing.T) {
		reqs := []SampleRequest{
			{PromptIDs: []int32{1, 2}, MaxNewTokens: 3, Temperature: 1, Seed: 1},
			{PromptIDs: []int32{3}, MaxNewTokens: 4, Temperature: 1, Seed: 2},
		}
		_, err := m.sample(ctx, reqs, []int{3, 3})
		require.ErrorContains(t, err, "sample request 1: result buffers have room for 3 tokens, max_new_tokens is 4")
		got, err := m.sample(ctx, reqs, []int{8, 8})
		require.NoError(t, err)
		want, err := m.Sample(ctx, reqs)
		require.NoError(t, err)
		assert.Equal(t, want, got)
	})

	t.Run("tensor listing", func(t *testing.T) {
		_, err := m.tensors(KindWeight, 8, maxTensorDims)
		require.ErrorContains(t, err, "name buffer has room for 8 bytes, tensor name model.embed_tokens.weight needs 26")
		_, err = m.tensors(KindWeight, maxTensorName, 1)
		require.ErrorContains(t, err, "tensor model.embed_tokens.weight has 2 dims, shape buffer has room for 1")
		infos, err := m.Tensors(KindWeight)
		require.NoError(t, err)
		require.NotEmpty(t, infos)
	})

	t.Run("tensor read", func(t *testing.T) {
		infos, err := m.Tensors(KindWeight)
		require.NoError(t, err)
		info := infos[0]
		short := TensorInfo{Name: info.Name, DType: info.DType, Shape: []int64{info.Shape[0] - 1, info.Shape[1]}}
		_, err = m.ReadTensor(KindWeight, short)
		require.ErrorContains(t, err, fmt.Sprintf("tensor %s needs %d bytes, buffer has %d", info.Name,
			(model.TensorSpec{DType: info.DType, Shape: info.Shape}).ByteLen(), (model.TensorSpec{DType: short.DType, Shape: short.Shape}).ByteLen()))
	})
}

// TestRowsWithTokens: the worker counts the rows that carry at least one
// active token, the divisor of the per-row clip extremes.
func TestRowsWithTokens(t *testing.T) {
	m := loadTiny(t, ModelOptions{})
	rows := []grpo.Row{
		{Tokens: []int32{1, 2, 3, 4}, PromptLen: 2, LossMask: []uint8{1, 0}, Advantage: 1},
		{Tokens: []int32{5, 6, 7}, PromptLen: 2, LossMask: []uint8{0}, Advantage: -1}, // truncated: nothing to learn
		{Tokens: []int32{5, 6, 7, 8}, PromptLen: 1, LossMask: []uint8{1, 1, 1}, Advantage: 0.5},
	}
	cfg := grpo.DefaultLossConfig()
	cfg.ISCorrection = grpo.ISCorrectionOff
	st, err := m.EvalLoss(context.Background(), grpo.MicroBatch{Rows: rows, RoundTokens: 4, GradAccumSteps: 1}, cfg)
	require.NoError(t, err)
	assert.Equal(t, 3.0, st.Rows)
	assert.Equal(t, 2.0, st.RowsWithTokens)
	assert.Equal(t, 4.0, st.ActiveTokens)
}

// TestTensorsByKind: listings follow the model's state (optimizer state
// appears after the first step), and each kind accepts only its own names.
func TestTensorsByKind(t *testing.T) {
	ctx := context.Background()
	full := loadTiny(t, ModelOptions{})
	optim, err := full.Tensors(KindOptim)
	require.NoError(t, err)
	require.Equal(t, []TensorInfo{{Name: "step", DType: model.I64, Shape: []int64{1}}}, optim)
	weights, err := full.Tensors(KindWeight)
	require.NoError(t, err)
	grads, err := full.Tensors(KindGrad)
	require.NoError(t, err)
	require.Equal(t, weights, grads, "full fine-tuning trains every weight")

	cfg := grpo.DefaultLossConfig()
	cfg.ISCorrection = grpo.ISCorrectionOff
	rows := []grpo.Row{{Tokens: []int32{1, 2, 3, 4}, PromptLen: 2, LossMask: []uint8{1, 1}, Advantage: 1}}
	_, err = full.ForwardBackward(ctx, grpo.MicroBatch{Rows: rows, RoundTokens: 2, GradAccumSteps: 1}, cfg)
	require.NoError(t, err)
	_, err = full.OptimizerStep(ctx, 1e-3)
	require.NoError(t, err)
	optim, err = full.Tensors(KindOptim)
	require.NoError(t, err)
	require.Len(t, optim, 1+2*len(weights))
	assert.Equal(t, "exp_avg."+weights[0].Name, optim[1].Name)
	assert.Equal(t, "exp_avg_sq."+weights[0].Name, optim[2].Name)
	assert.Equal(t, weights[0].Shape, optim[1].Shape)

	w := weights[0]
	data, err := full.ReadTensor(KindWeight, w)
	require.NoError(t, err)
	for _, tc := range []struct {
		kind TensorKind
		name string
		want string
	}{
		{KindOptim, w.Name, "unexpected tensor " + w.Name + " for tensor kind 2"},
		{KindOptim, "exp_avg.no.such.weight", "unexpected tensor exp_avg.no.such.weight"},
		{KindLoRA, w.Name, "unexpected tensor " + w.Name + " for tensor kind 1"}, // no adapters without LoRA
		{KindGrad, w.Name, "unexpected tensor " + w.Name + " for tensor kind 3"}, // gradients are read only
		{TensorKind(9), w.Name, "unknown tensor kind 9"},
		{KindWeight, "model.layers.99.mlp.up_proj.weight", "unexpected tensor model.layers.99.mlp.up_proj.weight"},
	} {
		err := full.WriteTensor(tc.kind, model.Tensor{Name: tc.name, DType: w.DType, Shape: w.Shape, Data: data})
		require.ErrorContains(t, err, tc.want, "kind %d name %s", tc.kind, tc.name)
	}
	_, err = full.ReadTensor(KindLoRA, w)
	require.ErrorContains(t, err, "no tensor named "+w.Name)
	_, err = full.ReadTensor(TensorKind(9), w)
	require.ErrorContains(t, err, "unknown tensor kind 9")
	after, err := full.ReadTensor(KindWeight, w)
	require.NoError(t, err)
	require.Equal(t, data, after, "refused writes leave the weight alone")

	lora := loadTiny(t, ModelOptions{LoRA: &LoRAOptions{Rank: 2, Alpha: 4, TargetModules: []string{"q_proj", "v_proj"}}})
	adapters, err := lora.Tensors(KindLoRA)
	require.NoError(t, err)
	require.Len(t, adapters, 2*2*2) // layers x targets x {A, B}
	for _, a := range adapters {
		assert.Regexp(t, `^base_model\.model\.model\.layers\.[01]\.self_attn\.[qv]_proj\.lora_[AB]\.weight$`, a.Name)
	}
	grads, err = lora.Tensors(KindGrad)
	require.NoError(t, err)
	require.Equal(t, adapters, grads, "LoRA trains the adapters only")
	bare := strings.TrimPrefix(adapters[0].Name, "base_model.model.") // PEFT names only
	_, err = lora.ReadTensor(KindLoRA, TensorInfo{Name: bare, DType: adapters[0].DType, Shape: adapters[0].Shape})
	require.ErrorContains(t, err, "no tensor named "+bare)
}
