package train

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
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

// versionSyncer is the sampler's side of a fake run: the policy version its
// weights hold.
type versionSyncer struct {
	mu      sync.Mutex
	version int
}

func (v *versionSyncer) SyncWeights(ctx context.Context, step int) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.version = step
	return nil
}

func (v *versionSyncer) current() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.version
}

func (v *versionSyncer) versionFor(context.Context) int { return v.current() }

// sampledVersion is the sampler of a fake run as a round sees it.
type sampledVersion interface {
	weightSyncer
	versionFor(ctx context.Context) int
}

// copiesSyncer is a sampler holding two weight versions (pipeline depth 2,
// as samplerCopy with two copies): copy v%2 holds version v. A round sees
// the version its context names, or -1 if its copy holds another one.
type copiesSyncer struct {
	mu       sync.Mutex
	versions [2]int
}

func (c *copiesSyncer) PipelineDepth() int { return 2 }

func (c *copiesSyncer) SyncWeights(ctx context.Context, step int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.versions[step%2] = step
	return nil
}

func (c *copiesSyncer) versionFor(ctx context.Context) int {
	v, ok := ctx.Value(samplerVersionKey{}).(int)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !ok || c.versions[v%2] != v {
		return -1
	}
	return v
}

// newSampler is a fake sampler of the given pipeline depth.
func newSampler(depth int) sampledVersion {
	if depth == 2 {
		return &copiesSyncer{}
	}
	return &versionSyncer{}
}

// seededRollouts derives every trajectory from its task's seed (as the real
// runner does), so a resumed loop with fresh fakes sees the same rollouts,
// and records which sampler version generated each round. gate, when set,
// runs before a round and may block it.
type seededRollouts struct {
	sampler sampledVersion
	gate    func(ctx context.Context, round int) error

	mu    sync.Mutex
	calls []roundCall
}

// roundCall is one RunAll: the round and the version that generated it.
type roundCall struct{ round, version int }

// firstSeedRound is the round whose first rollout has seed seed (newAsyncLoop's
// seed 3): rounds of two versions may generate at once, so call order
// does not tell them.
func firstSeedRound(seed int64) int {
	for r := range 1000 {
		// A job's seeds use the sampler's round count after drawing it.
		if seeds(3).rollout(int64(r+1), 0, 0) == seed {
			return r
		}
	}
	return -1
}

func (r *seededRollouts) RunAll(ctx context.Context, tasks []rollout.Task, onDone func(*rollout.Trajectory)) []*rollout.Trajectory {
	round, version := firstSeedRound(tasks[0].Seed), r.sampler.versionFor(ctx)
	r.mu.Lock()
	r.calls = append(r.calls, roundCall{round, version})
	r.mu.Unlock()
	var gateErr error
	if r.gate != nil {
		gateErr = r.gate(ctx, round)
	}
	if v := r.sampler.versionFor(ctx); v != version {
		gateErr = fmt.Errorf("round %d: the sampler changed from version %d to %d while it generated", round, version, v)
	}
	out := make([]*rollout.Trajectory, len(tasks))
	for i, t := range tasks {
		rew := float64(t.Seed%7) / 7
		out[i] = &rollout.Trajectory{
			Task: t, Tokens: []int32{int32(t.Seed % 1_000_000), 7, 8, 9}, PromptLen: 2,
			LossMask: []uint8{1, 1}, Logprobs: []float32{-1, -2}, Rewards: []*float64{&rew}, Outcome: rollout.OutcomeDone,
		}
		if gateErr != nil {
			out[i] = &rollout.Trajectory{Task: t, Outcome: rollout.OutcomeCanceled, Err: gateErr}
		}
	}
	return out
}

// roundVersions are the versions that generated the rounds, by round (a
// round generated again after a failed step appears twice, in call order).
func (r *seededRollouts) roundVersions() []int {
	r.mu.Lock()
	calls := slices.Clone(r.calls)
	r.mu.Unlock()
	slices.SortStableFunc(calls, func(a, b roundCall) int { return a.round - b.round })
	out := make([]int, len(calls))
	for i, c := range calls {
		out[i] = c.version
	}
	return out
}

// rowView is what the fake policy saw of one row.
type rowView struct {
	ID                 int32
	Active             int
	Advantage          float32
	Sampler, Old, Kept bool
	FirstSamplerLogp   float32
}

// asyncPolicy records every micro-batch and the loss settings it got.
type asyncPolicy struct {
	mu    sync.Mutex
	mbs   [][]rowView
	cfgs  []grpo.LossConfig
	steps int
	fbs   chan struct{} // one send per forward/backward, when set
}

func (p *asyncPolicy) Logprobs(ctx context.Context, rows []grpo.Row, temperature float64, ref bool) ([][]float32, error) {
	out := make([][]float32, len(rows))
	for i, r := range rows {
		out[i] = make([]float32, r.CompletionLen())
	}
	return out, nil
}

func (p *asyncPolicy) ForwardBackward(ctx context.Context, mb grpo.MicroBatch, cfg grpo.LossConfig) (worker.LossStats, error) {
	p.mu.Lock()
	var view []rowView
	for _, r := range mb.Rows {
		active := 0
		for _, m := range r.LossMask {
			active += int(m)
		}
		v := rowView{ID: r.Tokens[0], Active: active, Advantage: r.Advantage,
			Sampler: r.SamplerLogprobs != nil, Old: r.OldLogprobs != nil, Kept: active > 0}
		if len(r.SamplerLogprobs) > 0 {
			v.FirstSamplerLogp = r.SamplerLogprobs[0]
		}
		view = append(view, v)
	}
	p.mbs = append(p.mbs, view)
	p.cfgs = append(p.cfgs, cfg)
	p.mu.Unlock()
	if p.fbs != nil {
		p.fbs <- struct{}{}
	}
	return worker.LossStats{Loss: 0.5, ActiveTokens: float64(grpo.ActiveTokens(mb.Rows))}, nil
}

func (p *asyncPolicy) OptimizerStep(ctx context.Context, lr float64) (float64, error) {
	p.steps++
	return 1, nil
}

// failAtPolicy fails the forward/backward of one micro-step (1-based, over
// the policy's life).
type failAtPolicy struct {
	asyncPolicy
	calls, failAt int
}

func (p *failAtPolicy) ForwardBackward(ctx context.Context, mb grpo.MicroBatch, cfg grpo.LossConfig) (worker.LossStats, error) {
	p.calls++
	if p.calls == p.failAt {
		return worker.LossStats{}, fmt.Errorf("worker out of memory")
	}
	return p.asyncPolicy.ForwardBackward(ctx, mb, cfg)
}

func (p *asyncPolicy) writeCheckpoint(ctx context.Context, dir string, step int) error { return nil }
func (p *asyncPolicy) DiscardGradients(ctx context.Context) error                      { return nil }

func newAsyncLoop(t *testing.T, shape roundShape, n, steps int, ro rolloutRunner, p trainPolicy, g weightSyncer) *stepLoop {
	t.Helper()
	s, err := curriculum.NewSampler([]curriculum.EnvTasks{{Indices: indices(16), Weight: 1}}, shape.K, shape.G, 1, true)
	require.NoError(t, err)
	cfg := stepLoopConfig{
		Shape: shape, Loss: grpo.DefaultLossConfig(), Scale: grpo.ScaleGroup, Aggregation: grpo.RewardLast,
		MaxSteps: steps, Schedule: func(int) float64 { return 1e-3 }, LoggingSteps: 1, MaxFailureFrac: 0.5,
		EnvNames: []string{"letters"}, Splits: []string{"train"}, Secrets: []map[string]string{nil},
		UseSamplerLogps: true, MaxOffPolicySteps: n, Seed: 3,
	}
	return newStepLoop(cfg, s, ro, p, g, zerolog.Nop())
}

// interruptedCheckpoint is what an interrupt at l's last step boundary
// saves and a resumed run reads back: the state (through JSON, as
// trainer_state.json holds it), the round in use and the rounds generated
// ahead. As an interrupt does, it cancels the rounds drawn after the
// boundary and lets older ones finish for the checkpoint.
func interruptedCheckpoint(t *testing.T, l *stepLoop) (State, []grpo.MicroBatch, []*genRound) {
	t.Helper()
	l.cancelGeneration(l.Step())
	dir := t.TempDir()
	require.NoError(t, writeAhead(dir, aheadRounds(t, l)))
	l.Close()
	require.NoError(t, writeRound(dir, l.PendingRound()))
	b, err := json.Marshal(l.State())
	require.NoError(t, err)
	var st State
	require.NoError(t, json.Unmarshal(b, &st))
	ahead, err := readAhead(dir)
	require.NoError(t, err)
	round, err := readRound(dir)
	require.NoError(t, err)
	return st, round, ahead
}

// aheadRounds is what a checkpoint of the loop's last step would save.
func aheadRounds(t *testing.T, l *stepLoop) []*genRound {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := l.AheadRounds(ctx)
	require.NoError(t, err)
	return out
}

// collectMetrics gathers the metrics each step logs, without the
// wall-clock ones.
func collectMetrics(loop *stepLoop) *[]map[string]float64 {
	var out []map[string]float64
	loop.OnMetrics = func(m StepMetrics) {
		mm := m.Map()
		for k := range mm {
			if strings.HasPrefix(k, "time/") || strings.HasPrefix(k, "memory/") || k == "step_time" {
				delete(mm, k)
			}
		}
		out = append(out, mm)
	}
	return &out
}

// TestAsyncSchedule: round r is generated with the weights of step
// max(0, start(r)-N), the rounds are trained on in the synchronous order,
// and the metrics report each step's staleness.
func TestAsyncSchedule(t *testing.T) {
	tests := []struct {
		name  string
		shape roundShape
		n     int
		steps int
		// wantVersions[r] is the sampler version that generated round r.
		wantVersions []int
		// wantStaleness[s] is step s+1's async/staleness_mean (= max).
		wantStaleness []float64
	}{
		{"one round per step, N=1", roundShape{K: 2, G: 4, B: 8, S: 1, GA: 1, Iterations: 1}, 1, 4, []int{0, 0, 1, 2}, []float64{0, 1, 1, 1}},
		{"one round per step, N=2", roundShape{K: 2, G: 4, B: 8, S: 1, GA: 1, Iterations: 1}, 2, 5, []int{0, 0, 0, 1, 2}, []float64{0, 1, 2, 2, 2}},
		{"a round spans two steps, N=1", roundShape{K: 4, G: 4, B: 4, S: 4, GA: 2, Iterations: 1}, 1, 6, []int{0, 1, 3}, []float64{0, 0, 1, 1, 1, 1}},
		{"two rounds per step, N=1", roundShape{K: 2, G: 4, B: 8, S: 1, GA: 2, Iterations: 1}, 1, 3, []int{0, 0, 0, 0, 1, 1}, []float64{0, 1, 1}},
	}
	for _, tc := range tests {
		for _, depth := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s, %d sampler copies", tc.name, depth), func(t *testing.T) {
				sampler := newSampler(depth)
				ro := &seededRollouts{sampler: sampler}
				p := &asyncPolicy{}
				loop := newAsyncLoop(t, tc.shape, tc.n, tc.steps, ro, p, sampler)
				metrics := collectMetrics(loop)
				require.NoError(t, loop.Run(context.Background()))
				assert.Equal(t, tc.wantVersions, ro.roundVersions(), "the sampler version of each round")
				require.Len(t, *metrics, tc.steps)
				for i, m := range *metrics {
					assert.Equal(t, tc.wantStaleness[i], m["async/staleness_mean"], "step %d", i+1)
					assert.Equal(t, tc.wantStaleness[i], m["async/staleness_max"], "step %d", i+1)
					assert.Zero(t, m["async/dropped_samples"], "step %d", i+1)
				}
				// The same rows in the same order as a synchronous run.
				syncP := &asyncPolicy{}
				syncLoop := newAsyncLoop(t, tc.shape, 0, tc.steps, &seededRollouts{sampler: &versionSyncer{}}, syncP, &versionSyncer{})
				require.NoError(t, syncLoop.Run(context.Background()))
				require.Len(t, p.mbs, len(syncP.mbs))
				for i := range p.mbs {
					for j := range p.mbs[i] {
						assert.Equal(t, syncP.mbs[i][j].ID, p.mbs[i][j].ID, "micro-step %d row %d", i, j)
					}
				}
			})
		}
	}
}

// TestAsyncGenerationOverlapsTraining: the rollouts of round r+1 wait until
// the step training on round r has run its forward/backward; a loop that
// generated before training would never get there.
func TestAsyncGenerationOverlapsTraining(t *testing.T) {
	shape := roundShape{K: 2, G: 4, B: 8, S: 1, GA: 1, Iterations: 1}
	sampler := &versionSyncer{}
	p := &asyncPolicy{fbs: make(chan struct{}, 16)}
	trained := make(chan int, 16) // forward/backward calls so far
	go func() {
		n := 0
		for range p.fbs {
			n++
			trained <- n
		}
	}()
	var mu sync.Mutex
	seen := 0
	ro := &seededRollouts{sampler: sampler, gate: func(ctx context.Context, round int) error {
		// Rounds 0 and 1 are generated before step 1; round r >= 2 is
		// generated during step r, which trains on round r-1.
		if round < 2 {
			return nil
		}
		deadline := time.After(10 * time.Second)
		for {
			mu.Lock()
			ok := seen >= round
			mu.Unlock()
			if ok {
				return nil
			}
			select {
			case n := <-trained:
				mu.Lock()
				seen = n
				mu.Unlock()
			case <-deadline:
				return fmt.Errorf("round %d: step %d never trained while it generated", round, round)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}}
	loop := newAsyncLoop(t, shape, 1, 5, ro, p, sampler)
	require.NoError(t, loop.Run(context.Background()))
	close(p.fbs)
	assert.Equal(t, 5, p.steps)
}

// TestDropStale: a group is dropped whole when any of its samples is more
// than N versions old; the rest is left as it was.
// TestDropStaleDropsForksWithTheirGroup: an agent's fork (a row after the
// samples' own) is dropped with its group and kept with it.
func TestDropStaleDropsForksWithTheirGroup(t *testing.T) {
	samples := []grpo.Sample{{}, {Forks: []grpo.Fork{{}}}, {}, {}}
	groups := forkGroups(samples, 2)
	assert.Equal(t, []int{0, 0, 1, 1, 0}, groups)
	rows := make([]grpo.Row, 5)
	for i := range rows {
		rows[i] = grpo.Row{Tokens: []int32{1, 2}, PromptLen: 1, LossMask: []uint8{1}, Advantage: 1}
	}
	st := dropStale(rows, []int{1, 3, 3, 3, 1}, groups, 2, 4, 1)
	assert.Equal(t, 3, st.Dropped, "group 0: its two rows and the fork")
	for i, want := range []uint8{0, 0, 1, 1, 0} {
		assert.Equal(t, []uint8{want}, rows[i].LossMask, "row %d", i)
	}
}

func TestDropStale(t *testing.T) {
	rows := func(n int) []grpo.Row {
		out := make([]grpo.Row, n)
		for i := range out {
			out[i] = grpo.Row{Tokens: []int32{1, 2, 3}, PromptLen: 1, LossMask: []uint8{1, 1}, Advantage: float32(i%2)*2 - 1}
		}
		return out
	}
	tests := []struct {
		name        string
		versions    []int
		now, maxOff int
		wantKept    []bool
		want        staleness
	}{
		{"all fresh", []int{3, 3, 3, 3}, 4, 1, []bool{true, true, true, true}, staleness{Sum: 4, Count: 4, Max: 1}},
		{"one stale group", []int{1, 1, 3, 3}, 4, 1, []bool{false, false, true, true}, staleness{Sum: 8, Count: 4, Max: 3, Dropped: 2}},
		{"a partly stale group goes whole", []int{3, 1, 3, 3}, 4, 1, []bool{false, false, true, true}, staleness{Sum: 6, Count: 4, Max: 3, Dropped: 2}},
		{"at the limit is kept", []int{2, 2, 2, 2}, 4, 2, []bool{true, true, true, true}, staleness{Sum: 8, Count: 4, Max: 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := rows(len(tc.versions))
			got := dropStale(r, tc.versions, nil, 2, tc.now, tc.maxOff)
			assert.Equal(t, tc.want, got)
			for i, kept := range tc.wantKept {
				if kept {
					assert.Equal(t, []uint8{1, 1}, r[i].LossMask, "row %d", i)
					assert.Equal(t, float32(i%2)*2-1, r[i].Advantage, "row %d", i)
				} else {
					assert.Equal(t, []uint8{0, 0}, r[i].LossMask, "row %d", i)
					assert.Zero(t, r[i].Advantage, "row %d", i)
				}
			}
		})
	}
}

// TestAsyncDropsOverStaleSamplesAndCorrectsTheRest resumes a loop at step 3
// with a saved round of which one group was generated at version 0 (3
// steps old, N = 1) and one at version 2: the old group is dropped and
// counted, the other reaches the loss with the sampler's log-probs and the
// trainer's old log-probs, under the configured IS correction.
func TestAsyncDropsOverStaleSamplesAndCorrectsTheRest(t *testing.T) {
	shape := roundShape{K: 2, G: 4, B: 8, S: 1, GA: 1, Iterations: 1}
	sampler := &versionSyncer{}
	p := &asyncPolicy{}
	loop := newAsyncLoop(t, shape, 1, 4, &seededRollouts{sampler: sampler}, p, sampler)
	for range 4 { // rounds 0-3 drawn: 3 trained on, one saved ahead
		loop.sampler.Next()
	}
	var rows []grpo.Row
	for i := range 8 {
		rows = append(rows, grpo.Row{Tokens: []int32{int32(100 + i), 5, 6}, PromptLen: 1, LossMask: []uint8{1, 1},
			SamplerLogprobs: []float32{-1, -1}, Advantage: float32(i%2)*2 - 1})
	}
	saved := &genRound{Round: 4, Version: 0, Versions: []int{0, 0, 0, 0, 2, 2, 2, 2}, Rows: rows,
		Stats: roundStats{Outcomes: map[string]int{"done": 8}}}
	require.NoError(t, loop.Restore(State{Step: 3, MicroStep: 3, Sampler: loop.sampler.State()}, nil, []*genRound{saved}))
	metrics := collectMetrics(loop)
	require.NoError(t, loop.Run(context.Background()))

	require.Len(t, p.mbs, 1)
	kept, dropped := 0, 0
	for _, r := range p.mbs[0] {
		if r.ID < 104 {
			dropped++
			assert.Zero(t, r.Active, "row %d of the stale group", r.ID)
			assert.Zero(t, r.Advantage, "row %d of the stale group", r.ID)
			continue
		}
		kept++
		assert.Equal(t, 2, r.Active, "row %d", r.ID)
		assert.True(t, r.Sampler, "row %d carries the sampler's log-probs", r.ID)
		assert.True(t, r.Old, "row %d carries the trainer's old log-probs", r.ID)
	}
	assert.Equal(t, 4, kept)
	assert.Equal(t, 4, dropped)
	assert.Equal(t, grpo.ISCorrectionSequenceMask, p.cfgs[0].ISCorrection, "the IS correction reaches the loss")
	require.Len(t, *metrics, 1)
	m := (*metrics)[0]
	assert.Equal(t, 4.0, m["async/dropped_samples"])
	assert.Equal(t, 3.0, m["async/staleness_max"])
	assert.Equal(t, 2.0, m["async/staleness_mean"])
	assert.Contains(t, m, "sampling/importance_sampling_ratio/mean", "IS metrics are reported")
}

// TestAsyncResumeIsExact: a loop stopped at a step boundary and restored
// from what a checkpoint holds (state, pending round, rounds generated
// ahead, through their files) continues exactly as the uninterrupted loop.
func TestAsyncResumeIsExact(t *testing.T) {
	tests := []struct {
		name  string
		shape roundShape
		n     int
		stop  int
	}{
		{"one round per step, N=1, after step 2", roundShape{K: 2, G: 4, B: 8, S: 1, GA: 1, Iterations: 1}, 1, 2},
		{"one round per step, N=2, after step 3", roundShape{K: 2, G: 4, B: 8, S: 1, GA: 1, Iterations: 1}, 2, 3},
		{"mid-round, N=1, after step 3", roundShape{K: 4, G: 4, B: 4, S: 4, GA: 2, Iterations: 1}, 1, 3},
		{"num_iterations 2, N=1, after step 1", roundShape{K: 2, G: 4, B: 4, S: 2, GA: 2, Iterations: 2}, 1, 1},
	}
	const steps = 6
	for _, tc := range tests {
		for _, depth := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s, %d sampler copies", tc.name, depth), func(t *testing.T) {
				run := func(loop *stepLoop, p *asyncPolicy) []map[string]float64 {
					m := collectMetrics(loop)
					require.NoError(t, loop.Run(context.Background()))
					return *m
				}
				fresh := func(steps int) (*stepLoop, *asyncPolicy) {
					s, p := newSampler(depth), &asyncPolicy{}
					return newAsyncLoop(t, tc.shape, tc.n, steps, &seededRollouts{sampler: s}, p, s), p
				}
				whole, wp := fresh(steps)
				want := run(whole, wp)

				// Stop at a step boundary of the full run's schedule, as an
				// interrupted run does.
				first, _ := fresh(steps)
				for range tc.stop {
					_, err := first.TrainStep(context.Background())
					require.NoError(t, err)
				}
				st, round, ahead := interruptedCheckpoint(t, first)

				resumed, rp := fresh(steps)
				require.NoError(t, resumed.Restore(st, round, ahead))
				got := run(resumed, rp)
				require.Len(t, got, steps-tc.stop)
				for i := range got {
					assert.Equal(t, want[tc.stop+i], got[i], "step %d", tc.stop+i+1)
				}
				offset := len(wp.mbs) - len(rp.mbs)
				for i := range rp.mbs {
					assert.Equal(t, wp.mbs[offset+i], rp.mbs[i], "micro-step %d", offset+i)
				}
			})
		}
	}
}

// scoringSampler is a sampler that scores rows again (as the builtin copy
// does): every completion token gets -0.5.
type scoringSampler struct {
	versionSyncer
	calls int
}

func (s *scoringSampler) SamplerLogprobs(ctx context.Context, rows []grpo.Row, temperature float64) ([][]float32, error) {
	s.calls++
	out := make([][]float32, len(rows))
	for i, r := range rows {
		out[i] = make([]float32, r.CompletionLen())
		for j := range out[i] {
			out[i][j] = -0.5
		}
	}
	return out, nil
}

// TestAsyncRescoresSamplerLogprobs: an engine that can score its rounds
// again replaces the log-probs recorded while sampling, unless sampling
// truncated the distribution (then the recorded ones are the right ones).
func TestAsyncRescoresSamplerLogprobs(t *testing.T) {
	shape := roundShape{K: 2, G: 4, B: 8, S: 1, GA: 1, Iterations: 1}
	for _, rescore := range []bool{true, false} {
		t.Run(fmt.Sprint("rescore=", rescore), func(t *testing.T) {
			sampler := &scoringSampler{}
			p := &asyncPolicy{}
			loop := newAsyncLoop(t, shape, 1, 3, &seededRollouts{sampler: &sampler.versionSyncer}, p, sampler)
			loop.cfg.RescoreSamplerLogps = rescore
			require.NoError(t, loop.Run(context.Background()))
			want, calls := float32(-1), 0 // what seededRollouts records
			if rescore {
				want, calls = -0.5, 3
			}
			assert.Equal(t, calls, sampler.calls, "one pass per round")
			for i, mb := range p.mbs {
				for _, r := range mb {
					assert.Equal(t, want, r.FirstSamplerLogp, "micro-step %d row %d", i, r.ID)
				}
			}
		})
	}
}

// TestAsyncFailedStepRollsBack: a step that fails mid-way leaves the loop at
// the previous boundary (state, rounds generated ahead); the loop then goes
// on exactly as one that never failed.
func TestAsyncFailedStepRollsBack(t *testing.T) {
	shape := roundShape{K: 2, G: 4, B: 8, S: 1, GA: 1, Iterations: 1}
	const steps = 5
	s0 := &versionSyncer{}
	whole := &asyncPolicy{}
	wholeRO := &seededRollouts{sampler: s0}
	wholeLoop := newAsyncLoop(t, shape, 1, steps, wholeRO, whole, s0)
	wantMetrics := collectMetrics(wholeLoop)
	require.NoError(t, wholeLoop.Run(context.Background()))

	s1 := &versionSyncer{}
	p := &failAtPolicy{failAt: 3}
	ro := &seededRollouts{sampler: s1}
	loop := newAsyncLoop(t, shape, 1, steps, ro, p, s1)
	gotMetrics := collectMetrics(loop)
	for range 2 {
		_, err := loop.TrainStep(context.Background())
		require.NoError(t, err)
	}
	state, ahead := loop.State(), aheadRounds(t, loop)
	require.Len(t, ahead, 1, "round 2 was generated during step 2")
	saved := t.TempDir()
	require.NoError(t, writeAhead(saved, ahead))
	_, err := loop.TrainStep(context.Background())
	require.ErrorContains(t, err, "out of memory")
	assert.Equal(t, state, loop.State())
	asSaved, err := readAhead(saved)
	require.NoError(t, err)
	assert.Equal(t, asSaved, aheadRounds(t, loop), "the failed step left the saved round as it was generated")
	assert.Equal(t, state.Sampler, loop.sampler.State(), "the draws of the cancelled rounds are undone")
	assert.Empty(t, loop.inflight, "no generation left running")

	require.NoError(t, loop.Run(context.Background()))
	assert.Equal(t, whole.mbs, p.mbs, "the same micro-batches as a loop that never failed")
	assert.Equal(t, []int{0, 0, 1, 2, 3}, wholeRO.roundVersions())
	assert.Equal(t, []int{0, 0, 1, 2, 2, 3}, ro.roundVersions(), "round 3 generated again with version 2")
	assert.Equal(t, (*wantMetrics)[2:], *gotMetrics, "steps 3-5 log the same metrics, staleness included")
}

// TestAsyncTwoCopiesOverlapTwoVersions: with two sampler copies, a round of
// version v is still generating when the round of version v+1 starts (so
// an env-bound round spans two training steps); with one copy that never
// happens, and the same gate times out.
func TestAsyncTwoCopiesOverlapTwoVersions(t *testing.T) {
	shape := roundShape{K: 2, G: 4, B: 8, S: 1, GA: 1, Iterations: 1}
	for _, depth := range []int{2, 1} {
		t.Run(fmt.Sprintf("%d copies", depth), func(t *testing.T) {
			sampler := newSampler(depth)
			var mu sync.Mutex
			started := map[int]bool{}
			ro := &seededRollouts{sampler: sampler}
			ro.gate = func(ctx context.Context, round int) error {
				mu.Lock()
				started[round] = true
				mu.Unlock()
				if round < 2 || round > 4 {
					return nil
				}
				// Round r (version r-1) waits until round r+1 (version r)
				// has started.
				deadline := time.Now().Add(2 * time.Second)
				for time.Now().Before(deadline) {
					mu.Lock()
					next := started[round+1]
					mu.Unlock()
					if next {
						return nil
					}
					time.Sleep(time.Millisecond)
				}
				return fmt.Errorf("round %d finished before round %d started", round, round+1)
			}
			p := &asyncPolicy{}
			loop := newAsyncLoop(t, shape, 1, 6, ro, p, sampler)
			err := loop.Run(context.Background())
			loop.Close()
			if depth == 1 {
				require.ErrorContains(t, err, "round 2 finished before round 3 started")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, []int{0, 0, 1, 2, 3, 4}, ro.roundVersions(), "the schedule is the one-copy schedule")
		})
	}
}
