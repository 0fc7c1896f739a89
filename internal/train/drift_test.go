package train

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSamplerDrift: a sudden jump of the trainer/sampler difference that
// lasts stops the run; noise, a single spike and half-precision levels do
// not.
func TestSamplerDrift(t *testing.T) {
	cases := []struct {
		name    string
		means   []float64
		failsAt int // index of the step that fails; -1: none
	}{
		{"float32 noise then stale weights", []float64{1e-7, 2e-7, 1e-7, 0.34, 0.35, 0.4}, 4},
		{"a single spike", []float64{1e-7, 1e-7, 1e-7, 0.3, 1e-7, 0.3, 1e-7}, -1},
		{"bfloat16 level, steady", []float64{0.03, 0.02, 0.04, 0.045, 0.04, 0.048, 0.03}, -1},
		{"bfloat16 level, then a jump", []float64{0.03, 0.02, 0.04, 0.045, 0.5, 0.6}, 5},
		{"growing float32 noise below the floor", []float64{1e-7, 1e-7, 1e-7, 1e-5, 1e-3, 0.01, 0.02}, -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var d samplerDrift
			failed := -1
			for i, m := range tc.means {
				if err := d.observe(i+1, m); err != nil {
					require.True(t, errors.Is(err, ErrSamplerDrift))
					failed = i
					break
				}
			}
			assert.Equal(t, tc.failsAt, failed)
		})
	}
}
