package train

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/worker"
)

type fakeTensors map[worker.TensorKind][]worker.TensorInfo

func (f fakeTensors) Tensors(kind worker.TensorKind) ([]worker.TensorInfo, error) {
	return f[kind], nil
}

// TestPolicyFootprint adds the worker's tensors up by kind: weights and
// LoRA adapters are parameters, then gradients and optimizer state.
func TestPolicyFootprint(t *testing.T) {
	f, err := policyFootprint(fakeTensors{
		worker.KindWeight: {{Name: "w", DType: model.BF16, Shape: []int64{4, 8}}, {Name: "n", DType: model.F32, Shape: []int64{8}}},
		worker.KindLoRA:   {{Name: "a", DType: model.F32, Shape: []int64{2, 8}}},
		worker.KindGrad:   {{Name: "a", DType: model.F32, Shape: []int64{2, 8}}},
		worker.KindOptim:  {{Name: "m", DType: model.F32, Shape: []int64{2, 8}}, {Name: "v", DType: model.F32, Shape: []int64{2, 8}}},
	})
	require.NoError(t, err)
	assert.Equal(t, footprint{Params: 4*8*2 + 8*4 + 16*4, Grads: 16 * 4, Optimizer: 2 * 16 * 4}, f)
}
