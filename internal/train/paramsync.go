package train

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/worker"
)

// With parameters sharded (worker.shard parameters) no rank holds the
// policy whole, yet rank 0 pushes whole weights to the vLLM replicas every
// rank shares, and verifies each push against the policy's log-probs. So a
// push is done by every rank together, without holding the model in one
// place:
//   - every rank writes its parameter slices to a file of the push
//     (paramSync.stage), as it does its optimizer slice for a checkpoint;
//   - rank 0's exporter waits for all of them and writes the directory vLLM
//     loads from them, one tensor at a time (paramSync.export);
//   - the check's log-probs are a forward pass over the sharded policy, a
//     collective: rank 0 hands each probe row to the other ranks, which run
//     the pass with it until rank 0 says the push is over (scoreService).

// paramSyncDir is where ranks leave their slices for rank 0's pushes.
func paramSyncDir(outputDir string) string { return filepath.Join(outputDir, "weight-sync-slices") }

// paramSync stages one rank's parameter slices for each weight push.
type paramSync struct {
	dir         string
	rank, world int
	// n counts the pushes staged, the same on every rank (every rank stages
	// each push): the key of the files of the latest one.
	n              int
	save           func(ctx context.Context, path string) error // worker.Group.SaveParameterShard
	policy         *workerPolicy
	poll, patience time.Duration
	log            zerolog.Logger
}

func newParamSync(outputDir string, g *worker.Group, p *workerPolicy, log zerolog.Logger) *paramSync {
	return &paramSync{dir: paramSyncDir(outputDir), rank: g.Rank(), world: g.WorldSize(), save: g.SaveParameterShard,
		policy: p, poll: 50 * time.Millisecond, patience: 5 * time.Second, log: log}
}

func (s *paramSync) path(n, rank int) string {
	return filepath.Join(s.dir, fmt.Sprintf("push-%06d", n), fmt.Sprintf("rank-%d-of-%d.safetensors", rank, s.world))
}

// stage writes this rank's slices for the next push.
func (s *paramSync) stage(ctx context.Context) error {
	s.n++
	p := s.path(s.n, s.rank)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("parameter slices of rank %d: %w", s.rank, err)
	}
	if err := s.save(ctx, p); err != nil {
		return fmt.Errorf("parameter slices of rank %d: %w", s.rank, err)
	}
	return nil
}

// export is rank 0's engine.WeightExporter: the weights (or the adapter)
// of the push staged last, merged from every rank's slices into dir.
func (s *paramSync) export(ctx context.Context, dir string) error {
	paths := make([]string, s.world)
	for r := range paths {
		paths[r] = s.path(s.n, r)
	}
	if err := awaitRankFiles(ctx, paths, s.poll, s.patience, s.log, s.n, "weight push waits for another rank's parameter slices"); err != nil {
		var missing *MissingShardError
		if errors.As(err, &missing) {
			missing.What = "parameter slices for weight push"
		}
		return err
	}
	var err error
	if s.policy.lora {
		err = s.policy.m.SavePEFTFromShards(ctx, dir, paths)
	} else {
		err = s.policy.m.SaveHFFromShards(ctx, dir, paths)
	}
	if err != nil {
		return err
	}
	s.prune()
	return nil
}

// prune drops the slices of earlier pushes (a replica that restarts loads
// the directory exported from them, not the slices).
func (s *paramSync) prune() {
	for n := s.n - 1; n >= 1; n-- {
		d := filepath.Dir(s.path(n, 0))
		if _, err := os.Stat(d); err != nil {
			return
		}
		_ = os.RemoveAll(d)
	}
}

// scoreRequest is what rank 0 sends the other ranks during a push: a probe
// row whose log-probs the check needs (every rank takes part in the
// pass), or the push's end and, if it failed, why.
type scoreRequest struct {
	Row    *grpo.Row
	Done   bool
	Failed string
}

// scoreService is one push seen from the process group.
type scoreService struct {
	g      collectives
	policy trainPolicy
}

// score is rank 0's log-probs of row when every rank must run the pass.
func (s scoreService) score(ctx context.Context, row grpo.Row) ([]float32, error) {
	if _, err := gatherGob(ctx, s.g, scoreRequest{Row: &row}); err != nil {
		return nil, fmt.Errorf("hand the sync probe to the other ranks: %w", err)
	}
	lp, err := s.policy.Logprobs(ctx, []grpo.Row{row}, 1, false)
	if err != nil {
		return nil, err
	}
	return lp[0], nil
}

// end tells the other ranks that rank 0's push is over (pushErr: how it
// failed) and returns pushErr.
func (s scoreService) end(ctx context.Context, pushErr error) error {
	req := scoreRequest{Done: true}
	if pushErr != nil {
		req.Failed = pushErr.Error()
	}
	if _, err := gatherGob(ctx, s.g, req); err != nil && pushErr == nil {
		return fmt.Errorf("tell the other ranks the weight push is over: %w", err)
	}
	return pushErr
}

// serve is a rank other than 0 during rank 0's push: it runs the passes
// rank 0's check asks for until the push is over.
func (s scoreService) serve(ctx context.Context) error {
	for {
		all, err := gatherGob(ctx, s.g, scoreRequest{})
		if err != nil {
			return fmt.Errorf("wait for rank 0's weight push: %w", err)
		}
		req := all[0]
		if req.Done {
			if req.Failed != "" {
				return fmt.Errorf("rank 0's weight push failed: %s", req.Failed)
			}
			return nil
		}
		if req.Row == nil {
			return errors.New("rank 0 sent a weight-push message without a row or an end")
		}
		if _, err := s.policy.Logprobs(ctx, []grpo.Row{*req.Row}, 1, false); err != nil {
			return fmt.Errorf("log-probs of rank 0's sync probe: %w", err)
		}
	}
}

// sharedPush runs one push of a stage-3 run's weights to the replicas the
// ranks share: every rank stages its slices, then rank 0 runs push (which
// exports and checks) while the others serve its check's passes. It
// returns on every rank once the push is over, with rank 0's error on
// every rank.
func sharedPush(ctx context.Context, ps *paramSync, svc scoreService, push func() error) error {
	if err := ps.stage(ctx); err != nil {
		if svc.g.Rank() == 0 {
			return svc.end(ctx, err)
		}
		return err
	}
	if svc.g.Rank() != 0 {
		return svc.serve(ctx)
	}
	return svc.end(ctx, push())
}
