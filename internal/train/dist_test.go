package train

import (
	"bytes"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/launch"
	"github.com/ortrain/ortrain/internal/reward"
	"github.com/ortrain/ortrain/internal/rollout"
	"github.com/ortrain/ortrain/internal/worker"
)

func TestRankDevice(t *testing.T) {
	two := func(local int) launch.World {
		return launch.World{Rank: local, WorldSize: 2, LocalRank: local, LocalWorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: 29500}
	}
	tests := []struct {
		name, device string
		gpus         []int
		world        launch.World
		visible      string
		want, err    string
	}{
		{name: "one process keeps cuda", device: "cuda", world: launch.Single(), want: "cuda"},
		{name: "cpu stays cpu", device: "cpu", world: two(1), want: "cpu"},
		{name: "local rank picks its GPU", device: "cuda", world: two(1), want: "cuda:1"},
		{name: "worker.gpus maps local ranks", device: "cuda", gpus: []int{4, 6}, world: two(1), want: "cuda:6"},
		{name: "one visible GPU per process", device: "cuda", world: two(1), visible: "3", want: "cuda:0"},
		{name: "several visible GPUs", device: "cuda", world: two(1), visible: "2,3", want: "cuda:1"},
		{name: "explicit index kept", device: "cuda:2", world: two(1), want: "cuda:2"},
		{name: "too few gpus", device: "cuda", gpus: []int{4}, world: two(1), err: "worker.gpus"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := rankDevice(tc.device, tc.gpus, tc.world, func(k string) string {
				if k == "CUDA_VISIBLE_DEVICES" {
					return tc.visible
				}
				return ""
			})
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestRankRangeAndLocalSlice(t *testing.T) {
	lo, hi := rankRange(32, 1, 2)
	assert.Equal(t, [2]int{16, 32}, [2]int{lo, hi})
	rows := make([]grpo.Row, 8)
	for i := range rows {
		rows[i].Advantage = float32(i)
	}
	mb := grpo.MicroBatch{Rows: rows, RoundTokens: 100, GradAccumSteps: 2}
	s := localSlice(mb, 1, 2)
	require.Len(t, s.Rows, 4)
	assert.Equal(t, float32(4), s.Rows[0].Advantage)
	assert.Equal(t, 50.0, s.RoundTokens, "the dapo normaliser is the global count over P")
	assert.Equal(t, 2, s.GradAccumSteps)
}

// echoGroup is a two-rank group in one process: this rank's payload and a
// fixed one from the peer, in rank order.
type echoGroup struct {
	rank int
	peer func() []byte
}

func (g echoGroup) Rank() int      { return g.rank }
func (g echoGroup) WorldSize() int { return 2 }
func (g echoGroup) AllGather(_ context.Context, b []byte) ([][]byte, error) {
	if g.rank == 0 {
		return [][]byte{b, g.peer()}, nil
	}
	return [][]byte{g.peer(), b}, nil
}
func (g echoGroup) ReduceGrads(context.Context) (worker.GradSyncStats, error) {
	return worker.GradSyncStats{}, nil
}
func (g echoGroup) Shard() worker.ShardStage { return worker.ShardNone }
func (g echoGroup) OptimizerStep(context.Context, float64) (worker.ShardStepStats, error) {
	return worker.ShardStepStats{}, errors.New("echoGroup does not shard")
}

// TestGatherRoundKeepsRankOrderAndFailures: the merged round is rank 0's
// rollouts then rank 1's, a failed rollout's NaN reward and a reward
// error survive the trip, and counters add up.
func TestGatherRoundKeepsRankOrderAndFailures(t *testing.T) {
	part := func(r float64, env int, scoreErr error) *roundPart {
		return &roundPart{
			Samples:  []grpo.Sample{{PromptIDs: []int32{1}, CompletionIDs: []int32{2, 3}, ToolMask: []uint8{1, 1}, Reward: r}},
			Scores:   []reward.Scores{{Values: []float64{r}, Total: r, Err: scoreErr}},
			Failures: map[bool]int{true: 1}[math.IsNaN(r)],
			Stats: roundStats{Outcomes: map[string]int{"done": 1}, FormatErrors: 2, EnvBusy: time.Second,
				Tools: toolCounts{Calls: 3, Failed: 1, Example: fmt.Sprintf("env %d", env)}},
			Records: []trajectoryRecord{{Env: env, Turns: []rollout.Turn{{Role: "tool", Text: "x"}}}},
		}
	}
	peer, err := part(math.NaN(), 1, errors.New("reward server down")).wire()
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, gob.NewEncoder(&buf).Encode(peer))
	g := echoGroup{rank: 0, peer: func() []byte { return buf.Bytes() }}

	got, err := gatherRound(context.Background(), g, part(0.5, 0, nil), true)
	require.NoError(t, err)
	require.Len(t, got.Samples, 2)
	assert.Equal(t, 0.5, got.Samples[0].Reward)
	assert.True(t, math.IsNaN(got.Samples[1].Reward), "a failed rollout stays unscorable")
	assert.NoError(t, got.Scores[0].Err)
	assert.EqualError(t, got.Scores[1].Err, "reward server down")
	assert.Equal(t, 1, got.Failures)
	assert.Equal(t, map[string]int{"done": 2}, got.Stats.Outcomes)
	assert.Equal(t, 4, got.Stats.FormatErrors)
	assert.Equal(t, 2*time.Second, got.Stats.EnvBusy)
	assert.Equal(t, toolCounts{Calls: 6, Failed: 2, Example: "env 0"}, got.Stats.Tools)
	require.Len(t, got.Records, 2)
	assert.Equal(t, []int{0, 1}, []int{got.Records[0].Env, got.Records[1].Env})
}

// mirrorGroup is rank 0 of two whose peer sends exactly what it sends.
type mirrorGroup struct{ reduces int }

func (g *mirrorGroup) Rank() int      { return 0 }
func (g *mirrorGroup) WorldSize() int { return 2 }
func (g *mirrorGroup) AllGather(_ context.Context, b []byte) ([][]byte, error) {
	return [][]byte{b, b}, nil
}
func (g *mirrorGroup) ReduceGrads(context.Context) (worker.GradSyncStats, error) {
	g.reduces++
	return worker.GradSyncStats{Bytes: 1 << 20, Buckets: 1}, nil
}
func (g *mirrorGroup) Shard() worker.ShardStage { return worker.ShardNone }
func (g *mirrorGroup) OptimizerStep(context.Context, float64) (worker.ShardStepStats, error) {
	return worker.ShardStepStats{}, errors.New("mirrorGroup does not shard")
}

// TestDataParallelStepTrainsItsSlice: a rank rolls out its half of the
// round's groups, trains on B of every global micro-batch's 2B rows,
// all-reduces once per optimizer step, and, with no IS correction, sees no
// sampler log-probs (as one rank does); the loss is the mean over slices.
func TestDataParallelStepTrainsItsSlice(t *testing.T) {
	shape := roundShape{K: 4, G: 4, B: 8, S: 2, GA: 2, Iterations: 1}
	sampler := &versionSyncer{}
	ro := &seededRollouts{sampler: sampler}
	p := &asyncPolicy{}
	loop := newAsyncLoop(t, shape, 0, 2, ro, p, sampler)
	loop.cfg.UseSamplerLogps = false
	g := &mirrorGroup{}
	loop.dist = g
	metrics := collectMetrics(loop)
	require.NoError(t, loop.Run(context.Background()))

	require.Len(t, p.mbs, 4, "2 steps x 2 micro-steps")
	for i, mb := range p.mbs {
		assert.Len(t, mb, 4, "micro-step %d: half of the global micro-batch's 8 rows", i)
		for _, r := range mb {
			assert.False(t, r.Sampler, "micro-step %d: no sampler log-probs without IS correction", i)
		}
	}
	assert.Equal(t, 2, g.reduces, "one gradient all-reduce per optimizer step")
	require.Len(t, *metrics, 2)
	for _, m := range *metrics {
		assert.Equal(t, 2.0, m["dist/world_size"])
		// Two micro-steps of two slices of loss 0.5 each: the global
		// micro-batch losses (0.5 each) summed over the step.
		assert.InDelta(t, 1.0, m["loss"], 1e-12)
		assert.Equal(t, 1.0, m["dist/allreduce_mib"])
	}
	calls := ro.roundVersions()
	assert.Len(t, calls, 2, "one round per step")
}

// worker.device auto follows what the worker's libtorch sees, and a
// distributed run's CUDA is the rank's own GPU.
func TestPolicyDevice(t *testing.T) {
	two := launch.World{Rank: 1, WorldSize: 2, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: 29500}
	tests := []struct {
		name, device string
		cuda         int
		world        launch.World
		want         string
	}{
		{"auto without CUDA is CPU", "auto", 0, launch.Single(), "cpu"},
		{"auto with a GPU is CUDA", "auto", 1, launch.Single(), "cuda"},
		{"auto with GPUs picks the rank's", "auto", 2, two, "cuda:1"},
		{"auto without CUDA, distributed", "auto", 0, two, "cpu"},
		{"cpu kept with GPUs", "cpu", 2, launch.Single(), "cpu"},
		{"cuda kept without GPUs (the load says why)", "cuda", 0, launch.Single(), "cuda"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			got, err := policyDevice(config.WorkerConfig{Device: tc.device}, worker.Info{CUDADevices: tc.cuda, LibtorchVersion: "2.14.0"},
				tc.world, func(string) string { return "" }, zerolog.New(&logs))
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			if tc.device == "auto" {
				assert.Contains(t, logs.String(), `"device":"`+strings.SplitN(tc.want, ":", 2)[0]+`"`, "auto is logged with what it chose")
			}
		})
	}
}
