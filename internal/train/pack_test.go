package train

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPackedRunMatchesPadded: the quickstart's first step trains on the
// same rollouts with worker.pack_tokens as without, to the same loss (the
// float32 floor), and reports the positions computed packed and padded
// (the quickstart's rows are all one length, so nothing is saved here; the
// worker's TestPackedMatchesPadded packs a batch of mixed lengths).
func TestPackedRunMatchesPadded(t *testing.T) {
	requireWorker(t)
	run := func(pack int) []map[string]float64 {
		out := filepath.Join(t.TempDir(), "run")
		cfg := quickstart(t, out, 2)
		cfg.GRPO.SaveSteps = 0
		cfg.Worker.PackTokens = pack
		_, err := Run(context.Background(), cfg, RunOptions{Logger: zerolog.Nop(), Getenv: func(string) string { return "" }})
		require.NoError(t, err)
		return readMetrics(t, out)
	}
	padded, packed := run(0), run(256)
	require.Len(t, packed, 2)
	assert.Equal(t, padded[0]["reward"], packed[0]["reward"], "the same rollouts")
	assert.InDelta(t, padded[0]["loss"], packed[0]["loss"], 1e-6)
	assert.InDelta(t, padded[0]["grad_norm"], packed[0]["grad_norm"], 1e-5)
	assert.NotContains(t, padded[0], "packing/padding_saved")
	assert.Contains(t, packed[0], "packing/padding_saved")
	assert.LessOrEqual(t, packed[0]["packing/packed_positions"], packed[0]["packing/padded_positions"])
	assert.Greater(t, packed[0]["packing/packed_positions"], 0.0)
	t.Logf("step 1: positions padded %.0f, packed %.0f", packed[0]["packing/padded_positions"], packed[0]["packing/packed_positions"])
}
