package train

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/curriculum"
	"github.com/ortrain/ortrain/internal/rollout"
	"github.com/ortrain/ortrain/internal/worker"
)

// gradedRollouts stands in for an env whose tasks have graded difficulty:
// task i is solved with probability level(i)/levels, decided by the
// rollout's seed, so every run of the same seeds earns the same rewards.
// Level 0 is never solved and level `levels` always: their groups are
// uniform. The first token is the seed's low digits, naming the rollout.
type gradedRollouts struct {
	levels int
	mu     sync.Mutex
	calls  int
}

func (r *gradedRollouts) level(index int) int { return index % (r.levels + 1) }

func (r *gradedRollouts) RunAll(ctx context.Context, tasks []rollout.Task, onDone func(*rollout.Trajectory)) []*rollout.Trajectory {
	r.mu.Lock()
	r.calls++
	r.mu.Unlock()
	out := make([]*rollout.Trajectory, len(tasks))
	for i, t := range tasks {
		x := uint64(t.Seed) * 0x9e3779b97f4a7c15
		rew := 0.0
		if int((x>>33)%uint64(r.levels)) < r.level(t.Index) {
			rew = 1
		}
		out[i] = &rollout.Trajectory{
			Task: t, Tokens: []int32{int32(uint64(t.Seed) % 1_000_000), 7, 8, 9}, PromptLen: 2,
			LossMask: []uint8{1, 1}, Logprobs: []float32{-1, -2}, Rewards: []*float64{&rew}, Outcome: rollout.OutcomeDone,
		}
		if onDone != nil {
			onDone(out[i])
		}
	}
	return out
}

// newGradedLoop is a loop over 16 graded tasks with dynamic sampling and,
// when cur, the curriculum (window: one group).
func newGradedLoop(t *testing.T, shape roundShape, n, steps, levels int, cur bool, p trainPolicy) (*stepLoop, *gradedRollouts) {
	t.Helper()
	ro := &gradedRollouts{levels: levels}
	loop := newAsyncLoop(t, shape, n, steps, ro, p, newSampler(1))
	loop.cfg.DynamicSampling, loop.cfg.MaxExtraRounds = true, 8
	c := curriculumConfig(cur, shape.G)
	loop.sampler.SetCurriculum(c)
	return loop, ro
}

// TestDynamicSamplingTrainsOnlyGroupsWithSpread: with a third of the tasks
// never solved and a third always, every trained row belongs to a group
// with a reward spread (nonzero advantage), the step's batch is full, and
// the metrics count what was generated and dropped.
func TestDynamicSamplingTrainsOnlyGroupsWithSpread(t *testing.T) {
	shape := roundShape{K: 4, G: 4, B: 8, S: 2, GA: 2, Iterations: 1}
	p := &asyncPolicy{}
	loop, _ := newGradedLoop(t, shape, 0, 5, 2, false, p)
	metrics := collectMetrics(loop)
	require.NoError(t, loop.Run(context.Background()))

	require.Len(t, p.mbs, 10)
	for i, mb := range p.mbs {
		require.Len(t, mb, shape.B, "micro-step %d: the batch is full", i)
		for _, r := range mb {
			assert.NotZero(t, r.Advantage, "micro-step %d: row %d is from a uniform group", i, r.ID)
		}
	}
	dropped := 0.0
	for i, m := range *metrics {
		gen, drop := m["dynamic_sampling/groups_generated"], m["dynamic_sampling/groups_dropped"]
		assert.GreaterOrEqual(t, gen, 4.0, "step %d", i+1)
		assert.Equal(t, gen-4, drop, "step %d: all but the K trained groups are dropped", i+1)
		assert.Zero(t, m["dynamic_sampling/filled_groups"], "step %d", i+1)
		assert.Equal(t, 4*(m["dynamic_sampling/extra_rounds"]+1), gen, "step %d: each extra round rolls out K tasks", i+1)
		assert.Equal(t, m["tokens/generated"], 2*gen*float64(shape.G), "step %d: two completion tokens per rollout", i+1)
		assert.Equal(t, m["dynamic_sampling/dropped_tokens"], 2*drop*float64(shape.G), "step %d", i+1)
		assert.Zero(t, m["frac_reward_zero_std"], "step %d: no trained group is uniform", i+1)
		dropped += drop
	}
	assert.Positive(t, dropped, "two thirds of the tasks give uniform groups: some were dropped")
}

// TestDynamicSamplingShortBatchSaysSo: when no task ever gives a reward
// spread, the round trains after the last refill on uniform groups, and
// the run says so: a warning naming the counts, and a metric.
func TestDynamicSamplingShortBatchSaysSo(t *testing.T) {
	shape := roundShape{K: 2, G: 4, B: 8, S: 1, GA: 1, Iterations: 1}
	p := &asyncPolicy{}
	loop, ro := newGradedLoop(t, shape, 0, 2, 1, false, p)
	// levels 1: tasks alternate never / always solved.
	loop.cfg.MaxExtraRounds = 3
	var logs bytes.Buffer
	loop.log = zerolog.New(&logs)
	metrics := collectMetrics(loop)
	require.NoError(t, loop.Run(context.Background()))

	assert.Equal(t, 2*4, ro.calls, "each step's round and its 3 refills")
	for i, m := range *metrics {
		assert.Equal(t, 2.0, m["dynamic_sampling/filled_groups"], "step %d", i+1)
		assert.Equal(t, 3.0, m["dynamic_sampling/extra_rounds"], "step %d", i+1)
		assert.Equal(t, 8.0, m["dynamic_sampling/groups_generated"], "step %d", i+1)
	}
	require.Len(t, p.mbs, 2)
	for _, mb := range p.mbs {
		require.Len(t, mb, shape.B, "the batch keeps its shape")
	}
	warned := 0
	dec := json.NewDecoder(&logs)
	for dec.More() {
		var line map[string]any
		require.NoError(t, dec.Decode(&line))
		if line["level"] == "warn" && line["groups_with_spread"] != nil {
			warned++
			assert.Equal(t, 0.0, line["groups_with_spread"])
			assert.Equal(t, 2.0, line["groups"])
		}
	}
	assert.Equal(t, 2, warned, "one warning per short round")
}

// TestDynamicSamplingAndCurriculumResumeExact: with both on, a run stopped
// at a step boundary and resumed from its saved state (through JSON, as a
// checkpoint holds it) trains on exactly the rows and logs exactly the
// metrics of an uninterrupted one, synchronous and async.
func TestDynamicSamplingAndCurriculumResumeExact(t *testing.T) {
	const steps, stop = 12, 5
	for _, n := range []int{0, 1} {
		t.Run(fmt.Sprintf("max_off_policy_steps %d", n), func(t *testing.T) {
			shape := roundShape{K: 2, G: 4, B: 4, S: 2, GA: 1, Iterations: 1}
			fresh := func() (*stepLoop, *asyncPolicy) {
				p := &asyncPolicy{}
				l, _ := newGradedLoop(t, shape, n, steps, 4, true, p)
				return l, p
			}
			whole, wp := fresh()
			wantM := collectMetrics(whole)
			require.NoError(t, whole.Run(context.Background()))
			skipped := 0.0
			for _, m := range *wantM {
				skipped += m["curriculum/skipped_draws"]
			}
			assert.Positive(t, skipped, "the curriculum skipped solved and unsolvable tasks")

			first, _ := fresh()
			for range stop {
				_, err := first.TrainStep(context.Background())
				require.NoError(t, err)
			}
			st, round, ahead := interruptedCheckpoint(t, first)
			require.NotEmpty(t, st.Sampler.Tasks, "the checkpoint holds the pass rates")

			resumed, rp := fresh()
			require.NoError(t, resumed.Restore(st, round, ahead))
			gotM := collectMetrics(resumed)
			require.NoError(t, resumed.Run(context.Background()))
			require.Len(t, *gotM, steps-stop)
			for i, m := range *gotM {
				assert.Equal(t, (*wantM)[stop+i], m, "step %d", stop+i+1)
			}
			offset := len(wp.mbs) - len(rp.mbs)
			for i := range rp.mbs {
				assert.Equal(t, wp.mbs[offset+i], rp.mbs[i], "micro-step %d", offset+i)
			}
			assert.Equal(t, whole.State().Sampler, resumed.State().Sampler, "the same pass rates at the end")
		})
	}
}

// pairGroup joins two in-process ranks: AllGather waits for both.
type pairGroup struct {
	hub  *pairHub
	rank int
}

type pairHub struct {
	mu    sync.Mutex
	cond  *sync.Cond
	round [2]int
	data  [2][][]byte
}

func newPairHub() *pairHub {
	h := &pairHub{}
	h.cond = sync.NewCond(&h.mu)
	return h
}

func (g pairGroup) Rank() int      { return g.rank }
func (g pairGroup) WorldSize() int { return 2 }
func (g pairGroup) AllGather(ctx context.Context, b []byte) ([][]byte, error) {
	h := g.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.round[g.rank]
	h.data[g.rank] = append(h.data[g.rank], b)
	h.round[g.rank]++
	h.cond.Broadcast()
	other := 1 - g.rank
	for h.round[other] <= n {
		h.cond.Wait()
	}
	out := [][]byte{h.data[0][n], h.data[1][n]}
	return out, nil
}
func (g pairGroup) ReduceGrads(context.Context) (worker.GradSyncStats, error) {
	return worker.GradSyncStats{}, nil
}
func (g pairGroup) Shard() worker.ShardStage { return worker.ShardNone }
func (g pairGroup) OptimizerStep(context.Context, float64) (worker.ShardStepStats, error) {
	return worker.ShardStepStats{}, nil
}

// TestDynamicSamplingRankShare: two data-parallel ranks with dynamic
// sampling and the curriculum refill alike (each sees the gathered
// groups), and each trains on exactly its half of every global
// micro-batch one process trains on.
func TestDynamicSamplingRankShare(t *testing.T) {
	shape := roundShape{K: 4, G: 4, B: 8, S: 2, GA: 2, Iterations: 1}
	const steps = 3
	one := &asyncPolicy{}
	single, _ := newGradedLoop(t, shape, 0, steps, 2, true, one)
	single.cfg.UseSamplerLogps = false
	require.NoError(t, single.Run(context.Background()))

	hub := newPairHub()
	pols := [2]*asyncPolicy{{}, {}}
	var wg sync.WaitGroup
	errs := [2]error{}
	for rank := range 2 {
		loop, _ := newGradedLoop(t, shape, 0, steps, 2, true, pols[rank])
		loop.cfg.UseSamplerLogps = false
		loop.dist = pairGroup{hub: hub, rank: rank}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[rank] = loop.Run(context.Background())
		}()
	}
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])

	require.Len(t, one.mbs, steps*shape.GA)
	for i, global := range one.mbs {
		require.Len(t, pols[0].mbs[i], shape.B/2, "micro-step %d: rank 0 trains half", i)
		require.Len(t, pols[1].mbs[i], shape.B/2, "micro-step %d: rank 1 trains half", i)
		ids := func(v []rowView) []int32 {
			out := make([]int32, len(v))
			for j, r := range v {
				out[j] = r.ID
			}
			return out
		}
		assert.Equal(t, ids(global), append(ids(pols[0].mbs[i]), ids(pols[1].mbs[i])...),
			"micro-step %d: the two ranks' rows are the one process's, in order", i)
		assert.True(t, slices.Equal(ids(global[:shape.B/2]), ids(pols[0].mbs[i])))
	}
}

func curriculumConfig(enabled bool, g int) curriculum.Config {
	c := curriculum.DefaultConfig()
	c.Enabled, c.Window = enabled, g
	return c
}
