package train

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/config"
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

// TestResumeOnOtherRanksIsAChange: a checkpoint records how many ranks
// trained it; resuming with another count (which changes the global
// batch) is refused as a change, and with --resume-with-changes accepted
// and recorded.
func TestResumeOnOtherRanksIsAChange(t *testing.T) {
	requireWorker(t)
	out := filepath.Join(t.TempDir(), "run")
	cfg := quickstart(t, out, 1)
	cfg.GRPO.SaveSteps = 1
	ro := RunOptions{Logger: zerolog.Nop(), Getenv: func(string) string { return "" }}
	_, err := Run(context.Background(), cfg, ro)
	require.NoError(t, err)
	statePath := filepath.Join(out, "checkpoints", "step-000001", "trainer_state.json")
	var state map[string]any
	require.NoError(t, ReadJSON(statePath, &state))
	assert.Equal(t, float64(1), state["world_size"], "one rank trained it")

	// As if two ranks had trained it.
	state["world_size"] = 2
	b, err := json.Marshal(state)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(statePath, b, 0o644))
	cfg = quickstart(t, out, 2)
	resume := ro
	resume.Resume = true
	_, err = Run(context.Background(), cfg, resume)
	var ce *config.ResumeChangedError
	require.ErrorAs(t, err, &ce)
	require.Len(t, ce.Changes, 1)
	assert.Equal(t, "ranks", ce.Changes[0].Field)
	assert.Contains(t, ce.Changes[0].Old, "2 (global batch 2 × 32 = 64")
	assert.Contains(t, ce.Changes[0].New, "1 (global batch 1 × 32 = 32")

	resume.ResumeWithChanges = true
	res, err := Run(context.Background(), cfg, resume)
	require.NoError(t, err)
	assert.Equal(t, 2, res.Steps)
	recorded, err := os.ReadFile(filepath.Join(out, "resume-changes.jsonl"))
	require.NoError(t, err)
	assert.Contains(t, string(recorded), `"ranks"`)
}
