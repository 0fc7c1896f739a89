package worker

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/grpo"
	"github.com/ortrain/ortrain/internal/model"
)

var tinyVariantDirs sync.Map

// tinyVariantDir is the tiny preset changed by edit, written once under
// name: with its own LM head, stage 3's lm_head unit is tested as well as
// the tied embedding; with more layers, that a pass gathers a few layers
// at a time whatever the depth.
func tinyVariantDir(t testing.TB, name string, edit func(*model.Config)) string {
	t.Helper()
	if d, ok := tinyVariantDirs.Load(name); ok {
		return d.(string)
	}
	p, ok := model.PresetByName("tiny")
	require.True(t, ok)
	edit(&p.Config)
	dir := filepath.Join(fixtureRoot, "tiny-"+name)
	require.NoError(t, model.Init(dir, p, 3))
	tinyVariantDirs.Store(name, dir)
	return dir
}

func tinyUntiedDir(t testing.TB) string {
	return tinyVariantDir(t, "untied", func(c *model.Config) { c.TieWordEmbeddings = false })
}

// stage3Checks are the collectives a stage-3 rank runs after training, in
// this order on every rank: the policy's and the reference's log-probs of
// fixed rows, then every trained tensor read a unit at a time. Rank 0
// keeps what they return.
type stage3Result struct {
	logps, refLogps [][]float32
	tensors         map[string][]byte
	infos           []TensorInfo
}

func stage3Checks(ctx context.Context, m *Model, g *Group, reference bool) (stage3Result, error) {
	var r stage3Result
	rows := offPolicyRows(rand.New(rand.NewPCG(99, 1)), 4, m.Config().VocabSize)
	var err error
	if r.logps, _, err = m.Logprobs(ctx, rows, 1, false); err != nil {
		return r, err
	}
	if reference {
		if r.refLogps, _, err = m.Logprobs(ctx, rows, 1, true); err != nil {
			return r, err
		}
	}
	kind := KindWeight
	if m.opts.LoRA != nil {
		kind = KindLoRA
	}
	r.tensors = map[string][]byte{}
	err = g.ReadSharded(ctx, kind, func(t TensorInfo, b []byte) error {
		r.infos = append(r.infos, t)
		r.tensors[t.Name] = append([]byte(nil), b...)
		return nil
	})
	return r, err
}

// TestShardedParametersMatchOneProcess is ZeRO stage 3 against one process
// with the same global batch, as TestShardedMatchesOneProcess is for stages
// 1 and 2: 2 and 4 ranks, grpo and dapo, full fine-tuning (with and without
// the frozen reference copy, tied and untied LM head) and LoRA, float64 /
// float32 / bfloat16. Weights, losses, the AdamW state merged from every
// rank's slice, and the policy's and reference's log-probs after training
// match the single process's, and each rank holds 1/P of the parameters,
// gradients and optimizer state, give or take a unit's rounding.
func TestShardedParametersMatchOneProcess(t *testing.T) {
	requireGloo(t)
	type variant struct {
		name                   string
		lora, ref, untie, nokl bool
	}
	variants := []variant{
		{name: "full-beta", ref: true},                        // the frozen reference copy, sharded too
		{name: "full-nobeta-untied", untie: true, nokl: true}, // beta 0, no reference; an LM head of its own
		{name: "lora-beta", lora: true},                       // the reference is the base, adapters off
	}
	// 12 layers: the peak of gathered bytes is a few layers', not the model's.
	t.Run("2ranks/grpo/full-12layers/float32", func(t *testing.T) {
		dir := tinyVariantDir(t, "12layers", func(c *model.Config) { c.NumHiddenLayers = 12 })
		mine, full := checkStage3(t, 2, grpo.LossGRPO, distModel{Dir: dir, DType: "float32", Seed: 1})
		assert.Less(t, mine.PeakGatheredBytes, full.ParamBytes/2, "12 layers: a pass holds a few of them gathered, never the model")
	})
	for _, world := range []int{2, 4} {
		for _, loss := range []grpo.LossType{grpo.LossGRPO, grpo.LossDAPO} {
			for _, v := range variants {
				for _, dtype := range []string{"float64", "float32", "bfloat16"} {
					name := fmt.Sprintf("%dranks/%s/%s/%s", world, strings.ToLower(loss.String()), v.name, dtype)
					t.Run(name, func(t *testing.T) {
						opts := distModel{Dir: tinyDir(t, 1), DType: dtype, Seed: 1, LoRA: v.lora, Reference: v.ref, NoKL: v.nokl}
						if v.untie {
							opts.Dir = tinyUntiedDir(t)
						}
						checkStage3(t, world, loss, opts)
					})
				}
			}
		}
	}
}

func checkStage3(t *testing.T, world int, loss grpo.LossType, opts distModel) (mine, full ShardMemory) {
	ctx := context.Background()
	weightTol, lossTol := 1e-9, 1e-9
	switch opts.DType {
	case "float32":
		weightTol, lossTol = 2e-4, 1e-5
	case "bfloat16":
		weightTol, lossTol = 1e-2, 5e-3 // bfloat16's own floor, as for stages 1 and 2
	}
	dir := t.TempDir()
	files := make([]string, world)
	for r := range files {
		files[r] = filepath.Join(dir, fmt.Sprintf("rank-%d.safetensors", r))
	}
	port := freePort(t)
	var peers []*rankProcess
	for r := 1; r < world; r++ {
		other := opts
		other.Seed = int64(10 + r) // another LoRA initialisation: the broadcast must replace it
		peers = append(peers, startRank(t, distJob{Role: "train", Opts: other, Port: port, Rank: r, World: world,
			TimeoutMS: 60000, Loss: loss, Shard: ShardParameters, ShardFile: files[r]}))
	}

	single := loadTiny(t, opts.options())
	wantLoss, _, err := trainRanks(ctx, single, nil, loss, opts.beta(), 0, 1)
	require.NoError(t, err)

	m := loadTiny(t, opts.options())
	g, err := m.JoinGroup(ctx, DistOptions{Addr: "127.0.0.1", Port: port, Rank: 0, WorldSize: world, Timeout: time.Minute,
		Shard: ShardParameters})
	require.NoError(t, err)
	t.Cleanup(func() { g.Close() })
	require.NoError(t, g.BroadcastTrainable(ctx))
	gotLoss, syncs, err := trainRanks(ctx, m, g, loss, opts.beta(), 0, world)
	require.NoError(t, err)
	_, _, err = rankExtremes(ctx, g)
	require.NoError(t, err)
	_, err = g.AllGather(ctx, rankGreeting(0))
	require.NoError(t, err)
	_, err = g.AllGather(ctx, nil)
	require.NoError(t, err)
	got, err := stage3Checks(ctx, m, g, opts.LoRA || opts.Reference)
	require.NoError(t, err)
	require.NoError(t, g.SaveOptimizerShard(ctx, files[0]))
	for i, p := range peers {
		require.NoError(t, p.wait(time.Minute), "rank %d", i+1)
	}
	// The checkpoint's weights, merged from the ranks' files with no
	// collective (every rank is gone by now).
	saved := filepath.Join(dir, "checkpoint")
	if opts.LoRA {
		require.NoError(t, m.SavePEFTFromShards(ctx, saved, files))
	} else {
		require.NoError(t, m.SaveHFFromShards(ctx, saved, files))
	}

	// Weights: every tensor, read a unit at a time, against the one process.
	kind := KindWeight
	if opts.LoRA {
		kind = KindLoRA
	}
	infos, err := single.Tensors(kind)
	require.NoError(t, err)
	require.ElementsMatch(t, infos, got.infos)
	init := loadTiny(t, opts.options())
	var diff, moved float64
	for _, ti := range infos {
		want, err := single.ReadTensor(kind, ti)
		require.NoError(t, err)
		before, err := init.ReadTensor(kind, ti)
		require.NoError(t, err)
		fw, fg, fb := floats(t, ti.DType, want), floats(t, ti.DType, got.tensors[ti.Name]), floats(t, ti.DType, before)
		var td float64
		for i := range fw {
			td = max(td, math.Abs(fw[i]-fg[i]))
			moved = max(moved, math.Abs(fw[i]-fb[i]))
		}
		if td > weightTol {
			t.Logf("%s differs by %.3g", ti.Name, td)
		}
		diff = max(diff, td)
	}
	t.Logf("max |%d ranks - 1 process| = %.3g (trained moved %.3g); losses %v vs %v", world, diff, moved, gotLoss, wantLoss)
	assert.LessOrEqual(t, diff, weightTol)
	assert.Greater(t, moved, 1e-4, "training must move the weights for the comparison to mean something")
	require.Len(t, gotLoss, distSteps)
	for i := range wantLoss {
		assert.InDelta(t, wantLoss[i], gotLoss[i], lossTol, "step %d loss", i)
	}
	assert.Len(t, syncs, distSteps*distGA, "one ReduceGrads per micro-batch")
	for _, s := range syncs {
		assert.Positive(t, s.Bytes, "the backward reduce-scattered as it went")
	}

	// Log-probs of the trained policy and of the frozen reference.
	rows := offPolicyRows(rand.New(rand.NewPCG(99, 1)), 4, m.Config().VocabSize)
	wantLP, _, err := single.Logprobs(ctx, rows, 1, false)
	require.NoError(t, err)
	assert.LessOrEqual(t, maxRowDiff(wantLP, got.logps), 10*weightTol, "policy log-probs")
	if opts.LoRA || opts.Reference {
		wantRef, _, err := single.Logprobs(ctx, rows, 1, true)
		require.NoError(t, err)
		assert.LessOrEqual(t, maxRowDiff(wantRef, got.refLogps), 1e-12, "reference log-probs: the frozen weights, exactly")
	}

	// The AdamW state, gathered from every rank's slice.
	merged := filepath.Join(dir, "merged.safetensors")
	require.NoError(t, m.MergeOptimizerShards(ctx, merged, files))
	wantOpt := filepath.Join(dir, "single.safetensors")
	require.NoError(t, single.SaveOptimizer(ctx, wantOpt))
	stateDiff := maxFileDiff(t, wantOpt, merged)
	t.Logf("max |merged AdamW state - 1 process| = %.3g", stateDiff)
	assert.LessOrEqual(t, stateDiff, weightTol)

	// The checkpoint the ranks saved a unit at a time resumes unsharded:
	// three more steps from it, with the merged AdamW state, train as the
	// one process's three more steps do.
	resumed := loadTiny(t, opts.options())
	if opts.LoRA {
		require.NoError(t, resumed.LoadPEFT(ctx, saved))
	} else {
		// Written into the base model rather than loaded from the
		// directory: config.json refuses torch_dtype float64, the test's
		// exact dtype.
		_, ts, err := model.ReadSafetensors(filepath.Join(saved, model.SingleWeightsFile))
		require.NoError(t, err)
		require.Len(t, ts, len(infos))
		for _, x := range ts {
			require.NoError(t, resumed.WriteTensor(KindWeight, x))
		}
	}
	require.NoError(t, resumed.LoadOptimizer(ctx, merged))
	wantMore, _, err := trainRanks(ctx, single, nil, loss, opts.beta(), 0, 1)
	require.NoError(t, err)
	gotMore, _, err := trainRanks(ctx, resumed, nil, loss, opts.beta(), 0, 1)
	require.NoError(t, err)
	for i := range wantMore {
		assert.InDelta(t, wantMore[i], gotMore[i], lossTol, "resumed step %d loss", distSteps+i)
	}
	resumedDiff := maxAbsDiff(t, single, resumed, kind)
	t.Logf("resumed unsharded from the stage-3 checkpoint: max |weights - 1 process| = %.3g after %d more steps", resumedDiff, distSteps)
	assert.LessOrEqual(t, resumedDiff, weightTol)

	// Memory: each rank keeps 1/P of every unit, rounded up per unit.
	full, err = single.ShardMemory(ctx, false)
	require.NoError(t, err)
	mine, err = m.ShardMemory(ctx, false)
	require.NoError(t, err)
	units := m.Config().NumHiddenLayers + 3
	elem := int64(m.DType().Size())
	slack := float64(3 * int64(units) * elem) // trainable, base and reference slices of each unit
	t.Logf("rank 0 of %d: parameters %d of %d bytes, optimizer %d of %d, peak gathered %d", world, mine.ParamBytes,
		full.ParamBytes, mine.OptimBytes, full.OptimBytes, mine.PeakGatheredBytes)
	assert.InDelta(t, float64(full.ParamBytes)/float64(world), float64(mine.ParamBytes), slack)
	assert.InDelta(t, float64(full.OptimBytes)/float64(world), float64(mine.OptimBytes), 2*slack)
	assert.InDelta(t, float64(kindBytes(t, single, KindGrad))/float64(world), float64(kindBytes(t, m, KindGrad)), slack)
	assert.Zero(t, mine.GatheredBytes, "nothing stays gathered between passes")
	assert.Positive(t, mine.PeakGatheredBytes)
	wire := int64(1) // Gloo gathers 16-bit floats as float32
	if m.DType().Size() == 2 {
		wire = 2
	}
	// At most: the layer a backward recomputes, the next one prefetched and
	// two gradients awaiting their reduce-scatter, each a unit's size.
	unitBytes := map[int]int64{}
	for _, kind := range []TensorKind{KindWeight, KindLoRA} {
		ts, err := single.Tensors(kind)
		require.NoError(t, err)
		for _, ti := range ts {
			unitBytes[ShardUnitOf(ti.Name, m.Config().NumHiddenLayers, m.Config().TieWordEmbeddings)] += TensorBytes([]TensorInfo{ti})
		}
	}
	var largest int64
	for _, b := range unitBytes {
		largest = max(largest, b)
	}
	t.Logf("peak gathered %d bytes, largest unit %d bytes (wire x%d)", mine.PeakGatheredBytes, largest, wire)
	assert.LessOrEqual(t, mine.PeakGatheredBytes, wire*4*largest, "a pass holds at most four units' worth gathered")
	return mine, full
}

func maxRowDiff(a, b [][]float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	var d float64
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return math.Inf(1)
		}
		for j := range a[i] {
			d = max(d, math.Abs(float64(a[i][j])-float64(b[i][j])))
		}
	}
	return d
}
