package train

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/worker"
)

// With a sharded optimizer (worker.shard) no rank holds the whole AdamW
// state, and a checkpoint must not depend on a collective: after an
// interrupt the group is often broken (a rank left mid-step), yet the last
// completed step must still be saved. So at each save every rank writes its
// slice to a staging directory under the run's checkpoints, and rank 0
// waits for all of them and merges them into the checkpoint's optimizer
// file in the unsharded format, which resumes under any world size. Ranks
// on several machines need output_dir on shared storage, as resuming
// already does.

// shardStagingDir is where ranks leave their slices, one directory a step.
func shardStagingDir(outputDir string) string {
	return filepath.Join(outputDir, "checkpoints", ".optimizer-shards")
}

// optimizerShards writes and merges one rank's optimizer slices.
type optimizerShards struct {
	dir         string // shardStagingDir of the run
	rank, world int
	// save writes this rank's slice (worker.Group.SaveOptimizerShard).
	save func(ctx context.Context, path string) error
	// poll is how often rank 0 looks for the other ranks' slices; after
	// patience without one it says whom it waits for.
	poll, patience time.Duration
	log            zerolog.Logger
}

func newOptimizerShards(outputDir string, g *worker.Group, log zerolog.Logger) *optimizerShards {
	return &optimizerShards{dir: shardStagingDir(outputDir), rank: g.Rank(), world: g.WorldSize(),
		save: g.SaveOptimizerShard, poll: 50 * time.Millisecond, patience: 5 * time.Second, log: log}
}

func (s *optimizerShards) stepDir(step int) string { return filepath.Join(s.dir, checkpointName(step)) }

func (s *optimizerShards) path(step, rank int) string {
	return filepath.Join(s.stepDir(step), fmt.Sprintf("rank-%d-of-%d.safetensors", rank, s.world))
}

// write leaves this rank's slice of step's optimizer state (atomically).
func (s *optimizerShards) write(ctx context.Context, step int) error {
	if err := os.MkdirAll(s.stepDir(step), 0o755); err != nil {
		return fmt.Errorf("optimizer slice of rank %d: %w", s.rank, err)
	}
	if err := s.save(ctx, s.path(step, s.rank)); err != nil {
		return fmt.Errorf("optimizer slice of rank %d: %w", s.rank, err)
	}
	return nil
}

// MissingShardError is a rank's optimizer slice that did not appear before
// rank 0's checkpoint deadline (worker.save_timeout).
type MissingShardError struct {
	Rank, Step int
	Path       string
	// What the file holds ("" means the optimizer slice of a checkpoint).
	What string
}

func (e *MissingShardError) Error() string {
	what := e.What
	if what == "" {
		what = "optimizer slice"
	}
	return fmt.Sprintf("rank %d's %s of step %d never appeared at %s: is that rank alive, and does it see output_dir (shared storage when ranks run on several machines)?", e.Rank, what, e.Step, e.Path)
}

// merge waits until every rank's slice of step is there and merges them
// into dst (the unsharded format).
// merger is the model that merges slices (worker.Model).
type merger interface {
	MergeOptimizerShards(ctx context.Context, dst string, shards []string) error
}

func (s *optimizerShards) merge(ctx context.Context, m merger, step int, dst string) error {
	paths, err := s.await(ctx, step)
	if err != nil {
		return err
	}
	return m.MergeOptimizerShards(ctx, dst, paths)
}

// await waits until every rank's slice of step is there and returns their
// paths in rank order.
func (s *optimizerShards) await(ctx context.Context, step int) ([]string, error) {
	paths := make([]string, s.world)
	for r := range paths {
		paths[r] = s.path(step, r)
	}
	return paths, awaitRankFiles(ctx, paths, s.poll, s.patience, s.log, step, "checkpoint waits for another rank's optimizer slice")
}

// awaitRankFiles waits until paths[r], rank r's file for step, exists for
// every rank, saying after patience whom it waits for; ctx's end is a
// *MissingShardError naming the first missing one.
func awaitRankFiles(ctx context.Context, paths []string, poll, patience time.Duration, log zerolog.Logger, step int, waiting string) error {
	start := time.Now()
	for r, path := range paths {
		told := false
		for {
			if _, err := os.Stat(path); err == nil {
				break
			} else if !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("slice of rank %d: %w", r, err)
			}
			if !told && patience > 0 && time.Since(start) > patience {
				deadline, _ := ctx.Deadline()
				log.Info().Int("rank", r).Int("step", step).Str("path", path).Time("until", deadline).Msg(waiting)
				told = true
			}
			select {
			case <-ctx.Done():
				return &MissingShardError{Rank: r, Step: step, Path: path}
			case <-time.After(poll):
			}
		}
	}
	return nil
}

// published drops the staged slices of step and earlier once its checkpoint
// is in place: until then a failed save can be retried from them (the other
// ranks wrote theirs once).
func (s *optimizerShards) published(step int) error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	for _, e := range entries {
		var n int
		if _, err := fmt.Sscanf(e.Name(), "step-%d", &n); err == nil && n <= step {
			if err := os.RemoveAll(filepath.Join(s.dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// clearStaging removes slices an earlier process of the run left behind
// (rank 0, before the ranks join: no rank writes before the first step).
func clearStaging(outputDir string) error {
	if err := os.RemoveAll(shardStagingDir(outputDir)); err != nil {
		return fmt.Errorf("clear earlier optimizer slices: %w", err)
	}
	return nil
}
