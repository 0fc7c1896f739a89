package engineserver

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/worker"
)

// TestPadLoRA: a rank-r adapter widened to the slot's rank R reproduces
// scale·B·A with the slot's scale of 1.
func TestPadLoRA(t *testing.T) {
	a := model.Tensor{Name: "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", DType: model.BF16, Shape: []int64{2, 3},
		Data: model.EncodeBF16([]float32{1, 2, 3, 4, 5, 6})}
	b := model.Tensor{Name: "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", DType: model.F32, Shape: []int64{2, 2},
		Data: model.EncodeF32([]float32{1, -1, 0.5, 2})}
	slotA := worker.TensorInfo{Name: a.Name, DType: model.F32, Shape: []int64{4, 3}}
	slotB := worker.TensorInfo{Name: b.Name, DType: model.F32, Shape: []int64{2, 4}}
	pa, err := padLoRA(a, slotA, 2, 4, 4)
	require.NoError(t, err)
	assert.Equal(t, []float32{1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 0, 0}, model.DecodeF32(pa.Data))
	pb, err := padLoRA(b, slotB, 2, 4, 4)
	require.NoError(t, err)
	assert.Equal(t, []float32{4, -4, 0, 0, 2, 8, 0, 0}, model.DecodeF32(pb.Data), "B carries the adapter's alpha/r")
	_, err = padLoRA(b, slotB, 3, 4, 1)
	assert.ErrorContains(t, err, "want [2 3] for rank 3")
}
