package engine

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSyncTolerance: servers that matched the trainer to float32 precision
// at the start are held to a tight bound; half-precision servers to one
// that their own noise sets, capped.
func TestSyncTolerance(t *testing.T) {
	cases := []struct {
		noise, want float64
	}{
		{0, 2e-3},
		{1e-6, 2e-3 + 4e-6},
		{1e-4, 5e-3 + 4e-4},
		{0.02, 5e-2 + 0.08},
		{0.3, 5e-2 + 1.2},
	}
	for _, tc := range cases {
		assert.InDelta(t, tc.want, syncTolerance(tc.noise), 1e-12, "noise %v", tc.noise)
	}
}

// TestLogpDiff against a float64 computation by hand.
func TestLogpDiff(t *testing.T) {
	mean, mx, err := logpDiff([]float64{-1, -2.5, -0.25}, []float32{-1.5, -2.5, -0.75})
	require.NoError(t, err)
	assert.InDelta(t, (0.5+0+0.5)/3, mean, 1e-7)
	assert.InDelta(t, 0.5, mx, 1e-7)
	_, _, err = logpDiff([]float64{-1}, []float32{-1, -2})
	assert.Error(t, err)
	_, _, err = logpDiff(nil, nil)
	assert.Error(t, err)
}
