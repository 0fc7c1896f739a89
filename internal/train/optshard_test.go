package train

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fileSave stands in for Group.SaveOptimizerShard: it writes the rank's
// name into path.
func fileSave(_ context.Context, path string) error { return os.WriteFile(path, []byte(path), 0o644) }

// recordingMerger records what merge was asked to merge.
type recordingMerger struct{ shards []string }

func (m *recordingMerger) MergeOptimizerShards(_ context.Context, _ string, shards []string) error {
	m.shards = shards
	return nil
}

func TestOptimizerShardsMergeWaitsForEveryRank(t *testing.T) {
	out := t.TempDir()
	var logged bytes.Buffer
	rank := func(r int) *optimizerShards {
		return &optimizerShards{dir: shardStagingDir(out), rank: r, world: 3, save: fileSave, poll: time.Millisecond,
			patience: 10 * time.Millisecond, log: zerolog.New(&logged)}
	}
	for _, r := range []int{0, 1} {
		require.NoError(t, rank(r).write(context.Background(), 4))
	}

	// Rank 2's slice never comes: the deadline ends the wait with a typed
	// error naming the rank.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	var m recordingMerger
	err := rank(0).merge(ctx, &m, 4, filepath.Join(out, "optimizer.pt"))
	var missing *MissingShardError
	require.True(t, errors.As(err, &missing), "%v", err)
	assert.Equal(t, 2, missing.Rank)
	assert.Equal(t, 4, missing.Step)
	assert.Nil(t, m.shards, "nothing merged without every slice")
	assert.Contains(t, logged.String(), `"rank":2`, "a long wait says whom it waits for")

	// It comes a little later: merge takes all three, in rank order.
	go func() {
		time.Sleep(20 * time.Millisecond)
		_ = rank(2).write(context.Background(), 4)
	}()
	require.NoError(t, rank(0).merge(context.Background(), &m, 4, filepath.Join(out, "optimizer.pt")))
	require.Len(t, m.shards, 3)
	for r, p := range m.shards {
		assert.Equal(t, rank(0).path(4, r), p)
		assert.FileExists(t, p, "the slices stay until the checkpoint is published")
	}

	// Once step 4 is published its slices and older ones go; later stay.
	require.NoError(t, rank(1).write(context.Background(), 5))
	require.NoError(t, rank(1).write(context.Background(), 3))
	require.NoError(t, rank(0).published(4))
	entries, err := os.ReadDir(shardStagingDir(out))
	require.NoError(t, err)
	require.Len(t, entries, 1)
	assert.Equal(t, "step-000005", entries[0].Name())
	require.NoError(t, clearStaging(out))
	assert.NoDirExists(t, shardStagingDir(out))
}
