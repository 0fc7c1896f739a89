package train

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/curriculum"
	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/rollout"
	"github.com/ortrain/ortrain/internal/worker"
)

// roundRollouts is a pure-Go stand-in for rollout.Runner: every trajectory's
// first prompt token encodes (round, position) so tests can see which
// rollouts fed which micro-batch. Rewards alternate so groups have variance.
type roundRollouts struct {
	mu     sync.Mutex
	rounds int
	fail   map[int]bool // positions that fail with env_error
}

func (r *roundRollouts) RunAll(ctx context.Context, tasks []rollout.Task, onDone func(*rollout.Trajectory)) []*rollout.Trajectory {
	r.mu.Lock()
	round := r.rounds
	r.rounds++
	r.mu.Unlock()
	out := make([]*rollout.Trajectory, len(tasks))
	for i, t := range tasks {
		rew := float64(i % 2)
		tr := &rollout.Trajectory{
			Task:      t,
			Tokens:    []int32{int32(round*1000 + i), 7, 8, 9},
			PromptLen: 2,
			LossMask:  []uint8{1, 1},
			Logprobs:  []float32{-1, -1},
			Rewards:   []*float64{&rew},
			Outcome:   rollout.OutcomeDone,
		}
		if r.fail[i] {
			tr = &rollout.Trajectory{Task: t, Outcome: rollout.OutcomeEnvError, Err: fmt.Errorf("env down")}
		}
		out[i] = tr
		if onDone != nil {
			onDone(tr)
		}
	}
	return out
}

// recordingPolicy records what the optimizer saw.
type recordingPolicy struct {
	microBatches [][]int32 // first prompt token of each row, per forward/backward
	oldLogps     []bool    // whether rows carried old log-probs
	steps        int
	logprobCalls int
	discards     int
}

func (p *recordingPolicy) Logprobs(ctx context.Context, rows []grpo.Row, temperature float64, ref bool) ([][]float32, error) {
	p.logprobCalls++
	out := make([][]float32, len(rows))
	for i, r := range rows {
		out[i] = make([]float32, r.CompletionLen())
	}
	return out, nil
}

func (p *recordingPolicy) ForwardBackward(ctx context.Context, mb grpo.MicroBatch, cfg grpo.LossConfig) (worker.LossStats, error) {
	ids := make([]int32, len(mb.Rows))
	for i, r := range mb.Rows {
		ids[i] = r.Tokens[0]
	}
	p.microBatches = append(p.microBatches, ids)
	p.oldLogps = append(p.oldLogps, mb.Rows[0].OldLogprobs != nil)
	return worker.LossStats{Loss: 0.5, ActiveTokens: float64(grpo.ActiveTokens(mb.Rows))}, nil
}

func (p *recordingPolicy) OptimizerStep(ctx context.Context, lr float64) (float64, error) {
	p.steps++
	return 1, nil
}

func (p *recordingPolicy) writeCheckpoint(ctx context.Context, dir string, step int) error {
	return nil
}

func (p *recordingPolicy) DiscardGradients(ctx context.Context) error { p.discards++; return nil }

type noSync struct{ calls int }

func (n *noSync) SyncWeights(ctx context.Context, step int) error { n.calls++; return nil }

func newTestLoop(t *testing.T, shape roundShape, steps int, ro rolloutRunner) (*stepLoop, *recordingPolicy, *noSync) {
	t.Helper()
	s, err := curriculum.NewSampler([]curriculum.EnvTasks{{Indices: indices(16), Weight: 1}}, shape.K, shape.G, 1, true)
	require.NoError(t, err)
	p, g := &recordingPolicy{}, &noSync{}
	cfg := stepLoopConfig{
		Shape: shape, Loss: grpo.DefaultLossConfig(), Scale: grpo.ScaleGroup, Aggregation: grpo.RewardLast,
		MaxSteps: steps, Schedule: func(int) float64 { return 1e-3 }, LoggingSteps: 1, MaxFailureFrac: 0.5,
		EnvNames: []string{"letters"}, Splits: []string{"train"}, Secrets: []map[string]string{nil},
	}
	return newStepLoop(cfg, s, ro, p, g, zerolog.Nop()), p, g
}

// roundOf decodes the round number from a row's first token.
func roundOf(id int32) int { return int(id) / 1000 }

// TestBatchRelations checks grpo-reference.md §1 with P = 1: which
// rollouts feed which optimizer step, and when old log-probs are computed.
func TestBatchRelations(t *testing.T) {
	tests := []struct {
		name  string
		shape roundShape
		steps int
		// wantRounds[i] is the round each micro-step's rows come from.
		wantRounds []int
		wantOld    bool
	}{
		{"defaults: one round per step, one micro-batch", roundShape{K: 2, G: 4, B: 8, S: 1, GA: 1, Iterations: 1}, 3, []int{0, 1, 2}, false},
		{"GA=2, S=2: one round split over the step's two micro-steps", roundShape{K: 2, G: 4, B: 4, S: 2, GA: 2, Iterations: 1}, 2, []int{0, 0, 1, 1}, false},
		{"num_iterations=2: each round feeds two optimizer steps", roundShape{K: 2, G: 4, B: 4, S: 2, GA: 2, Iterations: 2}, 4, []int{0, 0, 0, 0, 1, 1, 1, 1}, true},
		{"steps_per_generation=4 > GA=2: a round spans two steps", roundShape{K: 4, G: 4, B: 4, S: 4, GA: 2, Iterations: 1}, 4, []int{0, 0, 0, 0, 1, 1, 1, 1}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			loop, p, g := newTestLoop(t, tc.shape, tc.steps, &roundRollouts{})
			require.NoError(t, loop.Run(context.Background()))
			assert.Equal(t, tc.steps, p.steps)
			assert.Equal(t, tc.steps, g.calls, "weights synced after every optimizer step")
			require.Len(t, p.microBatches, len(tc.wantRounds))
			for i, mb := range p.microBatches {
				assert.Len(t, mb, tc.shape.B)
				for _, id := range mb {
					assert.Equal(t, tc.wantRounds[i], roundOf(id), "micro-step %d", i)
				}
				assert.Equal(t, tc.wantOld, p.oldLogps[i], "old log-probs at micro-step %d", i)
			}
			// Within one pass over a round every row is used exactly once.
			perRound := map[int]map[int32]int{}
			for _, mb := range p.microBatches {
				for _, id := range mb {
					r := roundOf(id)
					if perRound[r] == nil {
						perRound[r] = map[int32]int{}
					}
					perRound[r][id]++
				}
			}
			for r, ids := range perRound {
				assert.Len(t, ids, tc.shape.K*tc.shape.G, "round %d", r)
				for id, n := range ids {
					assert.Equal(t, tc.shape.Iterations, n, "row %d used once per iteration", id)
				}
			}
		})
	}
}

func TestFailedRolloutsAreMaskedAndCounted(t *testing.T) {
	shape := roundShape{K: 2, G: 4, B: 8, S: 1, GA: 1, Iterations: 1}
	loop, p, _ := newTestLoop(t, shape, 1, &roundRollouts{fail: map[int]bool{1: true, 2: true}})
	var got StepMetrics
	loop.OnMetrics = func(m StepMetrics) { got = m }
	require.NoError(t, loop.Run(context.Background()))
	assert.Equal(t, 2, got.Outcomes["env_error"])
	assert.Equal(t, 2, got.Round.Unscorable)
	assert.False(t, math.IsNaN(got.Round.Reward))
	assert.Len(t, p.microBatches, 1)

	loop, _, _ = newTestLoop(t, shape, 1, &roundRollouts{fail: map[int]bool{0: true, 1: true, 2: true, 3: true, 4: true}})
	err := loop.Run(context.Background())
	require.ErrorIs(t, err, ErrTooManyFailures)
	assert.Contains(t, err.Error(), "5 of 8 rollouts failed")
	assert.Contains(t, err.Error(), "env down")
}

func TestLoopStopsOnCancel(t *testing.T) {
	loop, p, _ := newTestLoop(t, roundShape{K: 2, G: 4, B: 8, S: 1, GA: 1, Iterations: 1}, 100, &roundRollouts{})
	ctx, cancel := context.WithCancel(context.Background())
	loop.OnMetrics = func(m StepMetrics) {
		if m.Step == 2 {
			cancel()
		}
	}
	require.ErrorIs(t, loop.Run(ctx), context.Canceled)
	assert.Equal(t, 2, p.steps)
	assert.Equal(t, 2, loop.State().Step)
}

// failingPolicy fails the forward/backward of one micro-step.
type failingPolicy struct {
	recordingPolicy
	failAt int // 1-based micro-step that fails
}

func (p *failingPolicy) ForwardBackward(ctx context.Context, mb grpo.MicroBatch, cfg grpo.LossConfig) (worker.LossStats, error) {
	if len(p.microBatches)+1 == p.failAt {
		p.microBatches = append(p.microBatches, nil)
		return worker.LossStats{}, fmt.Errorf("worker out of memory")
	}
	return p.recordingPolicy.ForwardBackward(ctx, mb, cfg)
}

// A step that fails after some of its micro-steps leaves the loop at the
// previous step boundary: state, sampler position and round as they were,
// gradients discarded, and none of its rollouts logged. Issue 14, bug 1.
func TestFailedStepRollsBackToTheStepBoundary(t *testing.T) {
	// GA=2 over rounds of S=2 that feed mu=2 passes: micro-step 6 is the
	// second micro-step of step 3, inside the second pass over round 1.
	shape := roundShape{K: 2, G: 4, B: 4, S: 2, GA: 2, Iterations: 2}
	s, err := curriculum.NewSampler([]curriculum.EnvTasks{{Indices: indices(16), Weight: 1}}, shape.K, shape.G, 1, true)
	require.NoError(t, err)
	p := &failingPolicy{failAt: 6}
	cfg := stepLoopConfig{
		Shape: shape, Loss: grpo.DefaultLossConfig(), Scale: grpo.ScaleGroup, Aggregation: grpo.RewardLast,
		MaxSteps: 10, Schedule: func(int) float64 { return 1e-3 }, LoggingSteps: 1, MaxFailureFrac: 0.5,
		EnvNames: []string{"letters"}, Splits: []string{"train"}, Secrets: []map[string]string{nil},
	}
	ro := &taskRecorder{inner: &roundRollouts{}}
	loop := newStepLoop(cfg, s, ro, p, &noSync{}, zerolog.Nop())
	var logged []int
	loop.OnTrajectory = func(step int, _ []byte) { logged = append(logged, step) }

	for range 2 {
		_, err := loop.TrainStep(context.Background())
		require.NoError(t, err)
	}
	want := loop.State()
	wantRound := loop.PendingRound()
	require.Equal(t, State{Step: 2, MicroStep: 4, NumTokens: want.NumTokens, Sampler: want.Sampler, WorldSize: 1}, want)
	require.Nil(t, wantRound, "round 0 is consumed after step 2")

	_, err = loop.TrainStep(context.Background())
	require.ErrorContains(t, err, "out of memory")
	assert.Equal(t, 2, loop.Step())
	assert.Equal(t, want, loop.State())
	assert.Equal(t, want.MicroStep, loop.microStep)
	assert.Equal(t, want.Sampler, loop.sampler.State(), "the sampler is back where step 2 left it")
	assert.Nil(t, loop.round)
	assert.Equal(t, 1, p.discards, "the failed step's gradients were zeroed")
	assert.Equal(t, 2, p.steps, "no optimizer step for the failed step")
	assert.Equal(t, []int{1, 1, 1, 1, 1, 1, 1, 1}, logged, "only the trained round's rollouts are logged")

	// Step 3 runs again from the boundary and trains on the same round it
	// generated the first time (same sampler position, same seeds).
	p.failAt = 0
	_, err = loop.TrainStep(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 3, loop.Step())
	require.Len(t, ro.rounds, 3, "rounds: step 1, step 3 (failed), step 3 again")
	assert.Equal(t, ro.rounds[1], ro.rounds[2], "the retried step draws the same tasks with the same seeds")
	assert.NotNil(t, loop.PendingRound(), "round 1 still feeds step 4")
	assert.Len(t, logged, 16)
}

// taskRecorder records the tasks of every round it runs.
type taskRecorder struct {
	inner  rolloutRunner
	rounds [][]rollout.Task
}

func (r *taskRecorder) RunAll(ctx context.Context, tasks []rollout.Task, onDone func(*rollout.Trajectory)) []*rollout.Trajectory {
	r.rounds = append(r.rounds, tasks)
	return r.inner.RunAll(ctx, tasks, onDone)
}

// A round that later steps still train on is saved with the checkpoint and
// restored with it.
func TestPendingRoundRoundTrips(t *testing.T) {
	shape := roundShape{K: 2, G: 4, B: 4, S: 2, GA: 2, Iterations: 2}
	loop, _, _ := newTestLoop(t, shape, 10, &roundRollouts{})
	_, err := loop.TrainStep(context.Background())
	require.NoError(t, err)
	round := loop.PendingRound()
	require.Len(t, round, 2)
	dir := t.TempDir()
	require.NoError(t, writeRound(dir, round))
	got, err := readRound(dir)
	require.NoError(t, err)
	assert.Equal(t, round, got)
	none, err := readRound(t.TempDir())
	require.NoError(t, err)
	assert.Nil(t, none)
}

// blockingPolicy blocks in the phase named by block until its context ends,
// as a hung worker call would.
type blockingPolicy struct {
	recordingPolicy
	block string // "forward", "logprobs" or "optimizer"
}

func (p *blockingPolicy) wait(ctx context.Context, phase string) error {
	if p.block != phase {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

func (p *blockingPolicy) Logprobs(ctx context.Context, rows []grpo.Row, temperature float64, ref bool) ([][]float32, error) {
	if err := p.wait(ctx, "logprobs"); err != nil {
		return nil, err
	}
	return p.recordingPolicy.Logprobs(ctx, rows, temperature, ref)
}

func (p *blockingPolicy) ForwardBackward(ctx context.Context, mb grpo.MicroBatch, cfg grpo.LossConfig) (worker.LossStats, error) {
	if err := p.wait(ctx, "forward"); err != nil {
		return worker.LossStats{}, err
	}
	return p.recordingPolicy.ForwardBackward(ctx, mb, cfg)
}

func (p *blockingPolicy) OptimizerStep(ctx context.Context, lr float64) (float64, error) {
	if err := p.wait(ctx, "optimizer"); err != nil {
		return 0, err
	}
	return p.recordingPolicy.OptimizerStep(ctx, lr)
}

// Each worker phase has its own deadline: a call blocked past it ends the
// step with an error (and a rollback) instead of hanging the run (issue 14).
func TestWorkerPhasesHaveDeadlines(t *testing.T) {
	for _, phase := range []string{"forward", "logprobs", "optimizer"} {
		t.Run(phase, func(t *testing.T) {
			// num_iterations 2 computes old log-probs, so the log-prob phase runs.
			shape := roundShape{K: 2, G: 4, B: 8, S: 1, GA: 1, Iterations: 2}
			s, err := curriculum.NewSampler([]curriculum.EnvTasks{{Indices: indices(16), Weight: 1}}, shape.K, shape.G, 1, true)
			require.NoError(t, err)
			p := &blockingPolicy{block: phase}
			cfg := stepLoopConfig{
				Shape: shape, Loss: grpo.DefaultLossConfig(), Scale: grpo.ScaleGroup, Aggregation: grpo.RewardLast,
				MaxSteps: 3, Schedule: func(int) float64 { return 1e-3 }, LoggingSteps: 1, MaxFailureFrac: 0.5,
				EnvNames: []string{"letters"}, Splits: []string{"train"}, Secrets: []map[string]string{nil},
				StepTimeout: 50 * time.Millisecond, LogprobTimeout: 50 * time.Millisecond, OptimizerTimeout: 50 * time.Millisecond,
			}
			loop := newStepLoop(cfg, s, &roundRollouts{}, p, &noSync{}, zerolog.Nop())
			start := time.Now()
			err = loop.Run(context.Background())
			require.ErrorIs(t, err, context.DeadlineExceeded)
			assert.Less(t, time.Since(start), 5*time.Second)
			assert.Equal(t, 0, loop.Step(), "the step did not complete")
			if phase != "optimizer" {
				assert.Equal(t, 1, p.discards, "its gradients were discarded")
			}
		})
	}
}

func indices(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}
