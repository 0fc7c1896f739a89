package worker

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The data-parallel tests run rank 0 in the test process and rank 1 in a
// re-executed copy of the test binary (TestDistRankProcess), talking Gloo
// over loopback like two ranks of a real run.

// requireGloo skips a test when the worker was built without Gloo, unless
// ORTRAIN_REQUIRE_WORKER is set (CI), where that is a failure.
func requireGloo(t testing.TB) {
	t.Helper()
	lib := testLib(t)
	if slices.Contains(lib.Info().DistBackends, "gloo") {
		return
	}
	if os.Getenv("ORTRAIN_REQUIRE_WORKER") != "" {
		t.Fatalf("ORTRAIN_REQUIRE_WORKER is set but the worker has no c10d Gloo backend (has %v); install libgloo-dev and rebuild", lib.Info().DistBackends)
	}
	t.Skipf("worker built without c10d Gloo (has %v): install libgloo-dev and run scripts/build-worker.sh", lib.Info().DistBackends)
}

// distChildEnv carries rank 1's job, as JSON, to the re-executed binary.
const distChildEnv = "ORTRAIN_DIST_TEST_JOB"

// distJob is what the re-executed rank does.
type distJob struct {
	// Role is "train" (join, broadcast, train like rank 0), "park" (join,
	// one all-reduce, then stay alive without joining another collective)
	// or "bench" (gradient all-reduces while rank 0 asks for more).
	Role      string
	Opts      distModel
	Port      int
	Rank      int
	World     int
	TimeoutMS int64
	Loss      grpo.LossType
	// Shard and BucketBytes are the group's (DistOptions); with a shard,
	// "train" writes this rank's optimizer slice to ShardFile at the end.
	Shard       ShardStage
	BucketBytes int64
	ShardFile   string
}

// distModel selects the tiny model a rank loads.
type distModel struct {
	Dir       string
	DType     string
	Seed      int64 // LoRA initialisation
	LoRA      bool
	Reference bool // a frozen reference copy (full fine-tuning)
	NoKL      bool // train with beta 0 (else distBeta)
}

// distBeta is the KL coefficient the data-parallel tests train with.
const distBeta = 0.04

func (d distModel) beta() float64 {
	if d.NoKL {
		return 0
	}
	return distBeta
}

func (d distModel) options() ModelOptions {
	o := ModelOptions{Dir: d.Dir, DType: d.DType, Seed: d.Seed, Threads: 1, Reference: d.Reference}
	if d.LoRA {
		o.LoRA = &LoRAOptions{Rank: 4, Alpha: 8, ModulesToSave: []string{"norm"}}
	}
	return o
}

// Each optimizer step trains on distRows rows, in distGA micro-batches per
// rank.
const (
	distRows  = 8
	distGA    = 2
	distSteps = 3
	distLR    = 1e-3
)

// trainRanks runs distSteps optimizer steps as rank of world (g is nil for a
// single process): each rank takes its contiguous slice of the step's
// global rows, makes the round's token count global before the loss,
// accumulates distGA micro-batches, averages the gradients and steps. A
// sharded group reduces after every micro-batch (ShardGradients) or after
// the last, and steps with Group.OptimizerStep. It returns the global loss
// of each step and what each gradient reduction sent.
func trainRanks(ctx context.Context, m *Model, g *Group, loss grpo.LossType, beta float64, rank, world int) ([]float64, []GradSyncStats, error) {
	cfg := grpo.DefaultLossConfig()
	cfg.Type = loss
	cfg.ISCorrection = grpo.ISCorrectionOff
	cfg.MaxCompletionLength = 8
	cfg.Beta = beta
	var losses []float64
	var syncs []GradSyncStats
	for step := range distSteps {
		all := offPolicyRows(rand.New(rand.NewPCG(7, uint64(step))), distRows, m.Config().VocabSize)
		per := distRows / world
		mine := all[rank*per : (rank+1)*per]
		tokens := []float64{float64(grpo.ActiveTokens(mine))}
		if g != nil {
			var err error
			if tokens, err = g.AllReduceSum(ctx, tokens); err != nil {
				return nil, nil, err
			}
		}
		roundTokens := max(1, tokens[0]) / float64(world)
		stepLoss := []float64{0}
		rows := per / distGA
		for i := range distGA {
			mb := grpo.MicroBatch{Rows: mine[i*rows : (i+1)*rows], RoundTokens: roundTokens, GradAccumSteps: distGA}
			st, err := m.ForwardBackward(ctx, mb, cfg)
			if err != nil {
				return nil, nil, err
			}
			stepLoss[0] += st.Loss
			if g != nil && (g.Shard() >= ShardGradients || i == distGA-1) {
				sync, err := g.ReduceGrads(ctx)
				if err != nil {
					return nil, nil, err
				}
				syncs = append(syncs, sync)
			}
		}
		if g != nil {
			var err error
			if stepLoss, err = g.AllReduceSum(ctx, stepLoss); err != nil {
				return nil, nil, err
			}
		}
		if g != nil && g.Shard() != ShardNone {
			if _, err := g.OptimizerStep(ctx, distLR); err != nil {
				return nil, nil, err
			}
		} else if _, err := m.OptimizerStep(ctx, distLR); err != nil {
			return nil, nil, err
		}
		losses = append(losses, stepLoss[0]/float64(world))
	}
	return losses, syncs, nil
}

// offPolicyRows are randomRows with old and reference log-probs around the
// tiny model's (about -ln(vocab)), so ratios clip on both sides, the KL term
// is live and the loss depends on the weights.
func offPolicyRows(rng *rand.Rand, n, vocab int) []grpo.Row {
	rows := randomRows(rng, n, vocab)
	around := func(T int) []float32 {
		lp := make([]float32, T)
		for i := range lp {
			lp[i] = float32(-math.Log(float64(vocab)) + 0.3*rng.NormFloat64())
		}
		return lp
	}
	for i := range rows {
		rows[i].OldLogprobs = around(rows[i].CompletionLen())
		rows[i].RefLogprobs = around(rows[i].CompletionLen())
	}
	return rows
}

// rankGreeting is rank's contribution to the all-gather tests: a length
// that differs per rank, with a zero byte inside.
func rankGreeting(rank int) []byte {
	return bytes.Repeat([]byte(fmt.Sprintf("rank %d\x00", rank)), rank+2)
}

// rankExtremes reduces (rank + 0.5, -rank) to its minimum and maximum over
// the ranks.
func rankExtremes(ctx context.Context, g *Group) (lo, hi []float64, err error) {
	v := []float64{float64(g.Rank()) + 0.5, -float64(g.Rank())}
	if lo, err = g.AllReduce(ctx, ReduceMin, v); err != nil {
		return nil, nil, err
	}
	hi, err = g.AllReduce(ctx, ReduceMax, v)
	return lo, hi, err
}

// TestDistRankProcess is rank 1 of the data-parallel tests when they
// re-execute the test binary; run directly it has nothing to do.
func TestDistRankProcess(t *testing.T) {
	spec := os.Getenv(distChildEnv)
	if spec == "" {
		t.Skip("helper process: runs only when a data-parallel test re-executes the test binary")
	}
	var job distJob
	require.NoError(t, json.Unmarshal([]byte(spec), &job))
	ctx := context.Background()
	m := loadTiny(t, job.Opts.options())
	fmt.Println(distJoiningMark)
	g, err := m.JoinGroup(ctx, DistOptions{Addr: "127.0.0.1", Port: job.Port, Rank: job.Rank, WorldSize: job.World,
		Timeout: time.Duration(job.TimeoutMS) * time.Millisecond, Shard: job.Shard, BucketBytes: job.BucketBytes})
	require.NoError(t, err)
	defer g.Close()
	switch job.Role {
	case "train":
		require.NoError(t, g.BroadcastTrainable(ctx))
		_, _, err := trainRanks(ctx, m, g, job.Loss, job.Opts.beta(), job.Rank, job.World)
		require.NoError(t, err)
		_, _, err = rankExtremes(ctx, g)
		require.NoError(t, err)
		_, err = g.AllGather(ctx, rankGreeting(job.Rank))
		require.NoError(t, err)
		_, err = g.AllGather(ctx, nil)
		require.NoError(t, err)
		if job.Shard == ShardParameters {
			_, err := stage3Checks(ctx, m, g, job.Opts.LoRA || job.Opts.Reference)
			require.NoError(t, err)
		}
		if job.ShardFile != "" {
			require.NoError(t, g.SaveOptimizerShard(ctx, job.ShardFile))
		}
	case "bench":
		require.NoError(t, benchRank(ctx, m, g))
	case "park":
		_, err := g.AllReduceSum(ctx, []float64{1})
		require.NoError(t, err)
		time.Sleep(10 * time.Minute) // until the test kills this process
	default:
		t.Fatalf("unknown role %q", job.Role)
	}
}

// distJoiningMark is what a re-executed rank prints when it starts to join.
const distJoiningMark = "ortrain-dist-test: joining"

// rankProcess is a re-executed rank.
type rankProcess struct {
	cmd  *exec.Cmd
	done chan error
	mu   sync.Mutex
	out  bytes.Buffer
}

func (p *rankProcess) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *rankProcess) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// wait returns the process's exit error, giving up after d.
func (p *rankProcess) wait(d time.Duration) error {
	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(d):
		return errors.New("rank process did not exit in time")
	}
}

// joining waits until the process has started to join its group, so a
// short rendezvous timeout does not count its start-up.
func (p *rankProcess) joining(t testing.TB) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Contains(p.output(), distJoiningMark) }, time.Minute, 10*time.Millisecond,
		"rank process never started to join")
}

func startRank(t testing.TB, job distJob) *rankProcess {
	t.Helper()
	spec, err := json.Marshal(job)
	require.NoError(t, err)
	p := &rankProcess{done: make(chan error, 1)}
	p.cmd = exec.Command(os.Args[0], "-test.run=^TestDistRankProcess$", "-test.count=1", "-test.v")
	p.cmd.Env = append(os.Environ(), distChildEnv+"="+string(spec))
	p.cmd.Stdout, p.cmd.Stderr = p, p
	require.NoError(t, p.cmd.Start())
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		_ = p.wait(time.Minute)
		if t.Failed() {
			t.Logf("rank %d output:\n%s", job.Rank, p.output())
		}
	})
	return p
}

// freePort returns a TCP port that was free on 127.0.0.1 a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// floats decodes little-endian F32, F64 or BF16 tensor bytes.
func floats(t *testing.T, dtype model.DType, b []byte) []float64 {
	t.Helper()
	switch dtype {
	case model.F32:
		out := make([]float64, len(b)/4)
		for i := range out {
			out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
		}
		return out
	case model.F64:
		out := make([]float64, len(b)/8)
		for i := range out {
			out[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
		}
		return out
	case model.BF16: // the upper half of a float32
		out := make([]float64, len(b)/2)
		for i := range out {
			out[i] = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16))
		}
		return out
	}
	t.Fatalf("dtype %s", dtype)
	return nil
}

// maxAbsDiff is the largest element difference between two models' tensors
// of a kind, which must list the same names.
func maxAbsDiff(t *testing.T, a, b *Model, kind TensorKind) float64 {
	t.Helper()
	ta, err := a.Tensors(kind)
	require.NoError(t, err)
	tb, err := b.Tensors(kind)
	require.NoError(t, err)
	require.Equal(t, ta, tb)
	require.NotEmpty(t, ta)
	var d float64
	for _, ti := range ta {
		xa, err := a.ReadTensor(kind, ti)
		require.NoError(t, err)
		xb, err := b.ReadTensor(kind, ti)
		require.NoError(t, err)
		fa, fb := floats(t, ti.DType, xa), floats(t, ti.DType, xb)
		for i := range fa {
			d = max(d, math.Abs(fa[i]-fb[i]))
		}
	}
	return d
}

func trainableBytes(t *testing.T, m *Model) int64 {
	t.Helper()
	ts, err := m.Tensors(KindGrad)
	require.NoError(t, err)
	return TensorBytes(ts)
}

// TestDataParallelMatchesOneProcess trains 2 ranks x 4 rows against 1
// process x 8 rows from the same weights: after 3 optimizer steps (2
// micro-batches per rank per step) rank 0's trainable tensors and the
// per-step losses must equal the single process's. In float64 only the
// summation order differs, so the bound is far below the 1e-5 a float32
// run meets. Rank 1 starts from other weights (full) or another LoRA
// initialisation, so the broadcast is tested too.
func TestDataParallelMatchesOneProcess(t *testing.T) {
	requireGloo(t)
	for _, tc := range []struct {
		name      string
		loss      grpo.LossType
		lora      bool
		dtype     string
		tolerance float64 // max abs difference of the trained tensors
	}{
		{"dapo_full", grpo.LossDAPO, false, "float64", 1e-9},
		{"grpo_full", grpo.LossGRPO, false, "float64", 1e-9},
		{"dr_grpo_full", grpo.LossDrGRPO, false, "float64", 1e-9},
		{"dapo_lora", grpo.LossDAPO, true, "float64", 1e-9},
		{"grpo_lora", grpo.LossGRPO, true, "float64", 1e-9},
		{"dr_grpo_lora", grpo.LossDrGRPO, true, "float64", 1e-9},
		{"dapo_full_float32", grpo.LossDAPO, false, "float32", 1e-5},
		{"grpo_lora_float32", grpo.LossGRPO, true, "float32", 1e-5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			opts := distModel{Dir: tinyDir(t, 1), DType: tc.dtype, Seed: 1, LoRA: tc.lora}
			other := opts
			if tc.lora {
				other.Seed = 2 // another adapter initialisation over the same base
			} else {
				other.Dir = tinyDir(t, 2) // other weights altogether
			}
			port := freePort(t)
			peer := startRank(t, distJob{Role: "train", Opts: other, Port: port, Rank: 1, World: 2, TimeoutMS: 60000, Loss: tc.loss})

			single := loadTiny(t, opts.options())
			wantLoss, _, err := trainRanks(ctx, single, nil, tc.loss, distBeta, 0, 1)
			require.NoError(t, err)

			m := loadTiny(t, opts.options())
			g, err := m.JoinGroup(ctx, DistOptions{Addr: "127.0.0.1", Port: port, Rank: 0, WorldSize: 2, Timeout: time.Minute})
			require.NoError(t, err)
			t.Cleanup(func() { g.Close() })
			require.Equal(t, "gloo", g.Backend())
			require.NoError(t, g.BroadcastTrainable(ctx))
			gotLoss, syncs, err := trainRanks(ctx, m, g, tc.loss, distBeta, 0, 2)
			require.NoError(t, err)
			lo, hi, err := rankExtremes(ctx, g)
			require.NoError(t, err)
			assert.Equal(t, []float64{0.5, -1}, lo)
			assert.Equal(t, []float64{1.5, 0}, hi)
			parts, err := g.AllGather(ctx, rankGreeting(0))
			require.NoError(t, err)
			assert.Equal(t, [][]byte{rankGreeting(0), rankGreeting(1)}, parts, "bytes of every rank, in rank order")
			parts, err = g.AllGather(ctx, nil)
			require.NoError(t, err)
			assert.Equal(t, [][]byte{{}, {}}, parts)
			require.NoError(t, peer.wait(time.Minute), "rank 1")

			kind := KindWeight
			if tc.lora {
				kind = KindLoRA
			}
			diff := maxAbsDiff(t, single, m, kind)
			start := loadTiny(t, opts.options())
			moved := maxAbsDiff(t, single, start, kind)
			t.Logf("max |2 ranks - 1 process| = %.3g, max |trained - initial| = %.3g, losses %v vs %v", diff, moved, gotLoss, wantLoss)
			assert.LessOrEqual(t, diff, tc.tolerance)
			assert.Greater(t, moved, 1e-4, "training must move the weights for the comparison to mean something")
			require.Len(t, gotLoss, distSteps)
			for i := range wantLoss {
				assert.InDelta(t, wantLoss[i], gotLoss[i], 1e-6, "step %d loss", i)
			}
			assert.NotEqual(t, wantLoss[0], wantLoss[distSteps-1], "off-policy rows: the loss follows the weights")
			// Exactly the trainable tensors travel: every weight (full) or
			// the adapters and the saved norm (LoRA), in one 25 MiB bucket.
			for _, s := range syncs {
				assert.Equal(t, GradSyncStats{Bytes: trainableBytes(t, m), Buckets: 1}, s)
			}
		})
	}
}

// TestSingleRankGroup: a group of one averages over one rank, so sums and
// gradients come back unchanged (bfloat16 ones too, which Gloo carries as
// float32), and the trainable tensors are all sent.
func TestSingleRankGroup(t *testing.T) {
	requireGloo(t)
	for _, dtype := range []string{"float32", "bfloat16"} {
		t.Run(dtype, func(t *testing.T) { testSingleRankGroup(t, dtype) })
	}
}

func testSingleRankGroup(t *testing.T, dtype string) {
	ctx := context.Background()
	m := loadTiny(t, ModelOptions{Threads: 1, DType: dtype, LoRA: &LoRAOptions{Rank: 4, Alpha: 8}})
	// 1-byte buckets: every tensor travels alone.
	g, err := m.JoinGroup(ctx, DistOptions{Addr: "127.0.0.1", Port: freePort(t), WorldSize: 1, BucketBytes: 1})
	require.NoError(t, err)
	defer g.Close()
	assert.Equal(t, 0, g.Rank())
	assert.Equal(t, 1, g.WorldSize())

	in := []float64{1.5, -2, 1e300}
	out, err := g.AllReduceSum(ctx, in)
	require.NoError(t, err)
	assert.Equal(t, in, out)
	empty, err := g.AllReduceSum(ctx, nil)
	require.NoError(t, err)
	assert.Empty(t, empty)
	_, err = g.AllReduce(ctx, Reduction(7), in)
	require.ErrorContains(t, err, "unknown reduction 7")

	cfg := grpo.DefaultLossConfig()
	cfg.ISCorrection = grpo.ISCorrectionOff
	_, err = m.ForwardBackward(ctx, nllBatch(), cfg)
	require.NoError(t, err)
	grads, err := m.Tensors(KindGrad)
	require.NoError(t, err)
	before := map[string][]byte{}
	for _, ti := range grads {
		b, err := m.ReadTensor(KindGrad, ti)
		require.NoError(t, err)
		before[ti.Name] = b
	}
	st, err := g.ReduceGrads(ctx)
	require.NoError(t, err)
	wire := trainableBytes(t, m)
	if dtype == "bfloat16" {
		wire *= 2 // Gloo carries bfloat16 as float32
	}
	assert.Equal(t, GradSyncStats{Bytes: wire, Buckets: len(grads)}, st)
	for _, ti := range grads {
		b, err := m.ReadTensor(KindGrad, ti)
		require.NoError(t, err)
		assert.Equal(t, before[ti.Name], b, ti.Name)
	}
	require.NoError(t, g.BroadcastTrainable(ctx))
}

func TestDistOptionsResolve(t *testing.T) {
	ok := DistOptions{Addr: "10.0.0.1", Port: 29500, Rank: 1, WorldSize: 2}
	got, err := ok.resolve()
	require.NoError(t, err)
	assert.Equal(t, DefaultDistTimeout, got.Timeout)
	assert.Equal(t, int64(DefaultBucketBytes), got.BucketBytes)
	for _, tc := range []struct {
		name string
		edit func(*DistOptions)
		want string
	}{
		{"no_addr", func(o *DistOptions) { o.Addr = "" }, "master address"},
		{"port_zero", func(o *DistOptions) { o.Port = 0 }, "master port 0"},
		{"port_too_big", func(o *DistOptions) { o.Port = 70000 }, "master port 70000"},
		{"world_zero", func(o *DistOptions) { o.WorldSize, o.Rank = 0, 0 }, "world size 0"},
		{"rank_too_big", func(o *DistOptions) { o.Rank = 2 }, "rank 2 is not in [0, 2)"},
		{"rank_negative", func(o *DistOptions) { o.Rank = -1 }, "rank -1"},
		{"timeout_negative", func(o *DistOptions) { o.Timeout = -time.Second }, "timeout"},
		{"bucket_negative", func(o *DistOptions) { o.BucketBytes = -1 }, "bucket bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ok
			tc.edit(&o)
			_, err := o.resolve()
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// benchRank is the peer of BenchmarkReduceGrads: after one backward pass
// it joins a gradient all-reduce for every 1 rank 0 sends, until a 0.
func benchRank(ctx context.Context, m *Model, g *Group) error {
	cfg := grpo.DefaultLossConfig()
	cfg.ISCorrection = grpo.ISCorrectionOff
	if _, err := m.ForwardBackward(ctx, nllBatch(), cfg); err != nil {
		return err
	}
	for {
		more, err := g.AllReduceSum(ctx, []float64{0})
		if err != nil || more[0] == 0 {
			return err
		}
		if _, err := g.ReduceGrads(ctx); err != nil {
			return err
		}
	}
}

// BenchmarkReduceGrads times the gradient all-reduce of the tiny preset
// (full fine-tuning, float32) between two ranks over loopback Gloo; ns/op
// counts only ReduceGrads, not the scalar all-reduce that paces the peer.
// scripts/bench-worker's benchworker --world-size does the same for any
// model inside a training step.
func BenchmarkReduceGrads(b *testing.B) {
	requireGloo(b)
	opts := distModel{Dir: tinyDir(b, 1)}
	port := freePort(b)
	peer := startRank(b, distJob{Role: "bench", Opts: opts, Port: port, Rank: 1, World: 2, TimeoutMS: 60000})
	m := loadTiny(b, opts.options())
	ctx := context.Background()
	g, err := m.JoinGroup(ctx, DistOptions{Addr: "127.0.0.1", Port: port, Rank: 0, WorldSize: 2, Timeout: time.Minute})
	require.NoError(b, err)
	defer g.Close()
	cfg := grpo.DefaultLossConfig()
	cfg.ISCorrection = grpo.ISCorrectionOff
	_, err = m.ForwardBackward(ctx, nllBatch(), cfg)
	require.NoError(b, err)
	var sent int64
	var reducing time.Duration
	for b.Loop() {
		_, err := g.AllReduceSum(ctx, []float64{1})
		require.NoError(b, err)
		start := time.Now()
		st, err := g.ReduceGrads(ctx)
		reducing += time.Since(start)
		require.NoError(b, err)
		sent = st.Bytes
	}
	_, err = g.AllReduceSum(ctx, []float64{0})
	require.NoError(b, err)
	require.NoError(b, peer.wait(time.Minute), "rank 1")
	b.ReportMetric(float64(reducing.Nanoseconds())/float64(b.N), "allreduce-ns/op")
	b.ReportMetric(float64(sent)/(1<<20)/(reducing.Seconds()/float64(b.N)), "MiB/s")
}
