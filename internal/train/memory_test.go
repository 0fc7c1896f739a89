package train

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ortrain/ortrain/internal/worker"
)

// TestShardMemoryMetrics: what a rank holds is reported under memory/*,
// the gathered peak only where parameters are sharded (it is 0 elsewhere).
func TestShardMemoryMetrics(t *testing.T) {
	m := StepMetrics{ShardMemory: worker.ShardMemory{ParamBytes: 100, GradBytes: 20, OptimBytes: 40}}
	out := m.Map()
	assert.Equal(t, 100.0, out["memory/params_bytes"])
	assert.Equal(t, 20.0, out["memory/grads_bytes"])
	assert.Equal(t, 40.0, out["memory/optimizer_bytes"])
	assert.NotContains(t, out, "memory/peak_gathered_bytes")
	m.ShardMemory.PeakGatheredBytes = 64
	assert.Equal(t, 64.0, m.Map()["memory/peak_gathered_bytes"])
	assert.NotContains(t, StepMetrics{}.Map(), "memory/params_bytes", "a policy that cannot tell reports nothing")
}
