package train

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/runlock"
)

// TestLiveRunDirectoryIsRefused: while a run holds output_dir, another run
// (with --overwrite, or --resume) and an SFT job into it are refused,
// naming the holder, and nothing of the live run is deleted; once the
// holder is gone the directory is free.
func TestLiveRunDirectoryIsRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	held, err := runlock.Acquire(dir, "run")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "metrics.jsonl"), []byte("{\"step\":1}\n"), 0o644))

	cfg := quickstart(t, dir, 1)
	ro := RunOptions{Logger: zerolog.Nop(), Getenv: func(string) string { return "" }}
	for _, mode := range []string{"overwrite", "fresh"} {
		o := ro
		o.Overwrite = mode == "overwrite"
		_, err := Run(context.Background(), cfg, o)
		var he *runlock.HeldError
		require.ErrorAs(t, err, &he, mode)
		assert.Equal(t, os.Getpid(), he.Holder.PID)
		if mode == "overwrite" {
			assert.Contains(t, err.Error(), "--overwrite never deletes a live run")
		}
	}
	_, err = OpenTrainer(context.Background(), cfg, TrainerOptions{RunOptions: RunOptions{Logger: zerolog.Nop(), Getenv: ro.Getenv, Overwrite: true}, Kind: "sft"})
	var he *runlock.HeldError
	require.ErrorAs(t, err, &he, "sft")
	assert.FileExists(t, filepath.Join(dir, "metrics.jsonl"), "the live run's files are untouched")

	require.NoError(t, held.Release())
	l, err := runlock.Acquire(dir, "run")
	require.NoError(t, err, "free once the holder is gone")
	require.NoError(t, l.Release())
}
