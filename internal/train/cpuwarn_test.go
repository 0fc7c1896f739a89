package train

import (
	"bytes"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
)

// TestWarnLargeOnCPU: a 4B model on the CPU is warned about with its size
// and memory; small models, GPUs and LoRA's footprint are as expected.
func TestWarnLargeOnCPU(t *testing.T) {
	cases := []struct {
		device string
		params int64
		warn   bool
	}{
		{"cpu", 4_000_000_000, true},
		{"CPU", 600_000_000, true},
		{"cpu", 100_000, false},
		{"cuda", 4_000_000_000, false},
		{"cuda:1", 4_000_000_000, false},
	}
	for _, tc := range cases {
		var buf bytes.Buffer
		warnLargeOnCPU(tc.device, "float32", tc.params, false, zerolog.New(&buf))
		assert.Equal(t, tc.warn, buf.Len() > 0, "%s %d", tc.device, tc.params)
		if tc.warn {
			assert.Contains(t, buf.String(), `"level":"warn"`)
		}
	}
	assert.Equal(t, int64(4e9*16), cpuTrainingMemory(4e9, "float32", false))
	assert.Equal(t, int64(4e9*14), cpuTrainingMemory(4e9, "bfloat16", false))
	assert.Equal(t, int64(4e9*2), cpuTrainingMemory(4e9, "bfloat16", true))
}
