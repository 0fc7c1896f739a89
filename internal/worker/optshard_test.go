package worker

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/ortrain/ortrain/internal/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Trainable tensors of the synthetic model: dotted names, one with '@', and
// every dtype the worker trains in.
var (
	shardA = TensorInfo{Name: "model.embed_tokens.weight", DType: model.F32, Shape: []int64{2, 5}}   // 10 elements
	shardB = TensorInfo{Name: "model.layers.0.mlp@odd.weight", DType: model.BF16, Shape: []int64{7}} // 7
	shardC = TensorInfo{Name: "lm_head.weight", DType: model.F64, Shape: []int64{3, 2}}              // 6
	shardD = TensorInfo{Name: "model.norm.weight", DType: model.F16, Shape: []int64{4}}              // 4
	shardE = TensorInfo{Name: "frozen.bias", DType: model.F32, Shape: []int64{3}}                    // never has state

	shardParams = []TensorInfo{shardA, shardB, shardC, shardD, shardE}
)

const shardTestStep = 42

// testPiece is one tensor of a synthetic shard. Left zero, kind writes both
// moments, dtype is the parameter's, shape is [n] and name is the piece
// name; data is then the slice of the full state, otherwise random bytes.
type testPiece struct {
	param  TensorInfo
	off, n int64
	kind   string
	dtype  model.DType
	shape  []int64
	name   string
}

// testShard is one synthetic rank's file. A nil meta is the correct one; a
// zero step is shardTestStep.
type testShard struct {
	pieces []testPiece
	meta   map[string]string
	step   int64
	noStep bool
}

// pieceOf is a piece holding both moments of p over elements [off, off+n).
func pieceOf(p TensorInfo, off, n int64) testPiece { return testPiece{param: p, off: off, n: n} }

func shardNumel(shape []int64) int64 { return model.TensorInfo{Shape: shape}.NumElements() }

// fullShardState is each parameter's full exp_avg and exp_avg_sq bytes,
// random but fixed, that the shards slice and the merge must reassemble.
func fullShardState() map[string][2][]byte {
	rng := rand.New(rand.NewPCG(7, 11))
	out := map[string][2][]byte{}
	for _, p := range shardParams {
		size := shardNumel(p.Shape) * int64(p.DType.Size())
		out[p.Name] = [2][]byte{shardRandomBytes(rng, size), shardRandomBytes(rng, size)}
	}
	return out
}

func shardRandomBytes(rng *rand.Rand, n int64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func shardStepBytes(step int64) []byte {
	return binary.LittleEndian.AppendUint64(nil, uint64(step))
}

// writeTestShards writes one safetensors file per rank into dir.
func writeTestShards(t *testing.T, dir string, full map[string][2][]byte, shards []testShard) []string {
	t.Helper()
	rng := rand.New(rand.NewPCG(3, 5))
	paths := make([]string, len(shards))
	for r, sh := range shards {
		var specs []model.TensorSpec
		data := map[string][]byte{}
		add := func(s model.TensorSpec, b []byte) {
			specs = append(specs, s)
			data[s.Name] = b
		}
		if !sh.noStep {
			step := sh.step
			if step == 0 {
				step = shardTestStep
			}
			add(model.TensorSpec{Name: "step", DType: model.I64, Shape: []int64{1}}, shardStepBytes(step))
		}
		for _, pc := range sh.pieces {
			kinds := optimizerKinds[:]
			if pc.kind != "" {
				kinds = []string{pc.kind}
			}
			for _, kind := range kinds {
				s := model.TensorSpec{Name: pc.name, DType: pc.dtype, Shape: pc.shape}
				if s.Name == "" {
					s.Name = optimizerShardPieceName(kind, pc.param.Name, pc.off)
				}
				if s.DType == "" {
					s.DType = pc.param.DType
				}
				if s.Shape == nil {
					s.Shape = []int64{pc.n}
				}
				st, known := full[pc.param.Name]
				if known && pc.dtype == "" && pc.shape == nil && pc.name == "" && pc.off+pc.n <= shardNumel(pc.param.Shape) {
					k := 0
					if kind == optimizerExpAvgSq {
						k = 1
					}
					es := int64(s.DType.Size())
					add(s, st[k][pc.off*es:(pc.off+pc.n)*es])
				} else {
					add(s, shardRandomBytes(rng, s.ByteLen()))
				}
			}
		}
		meta := sh.meta
		if meta == nil {
			meta = map[string]string{"format": optimizerShardFormat, "rank": strconv.Itoa(r), "world_size": strconv.Itoa(len(shards))}
		}
		paths[r] = filepath.Join(dir, fmt.Sprintf("optim.rank%d.safetensors", r))
		require.NoError(t, model.WriteSafetensorsStream(paths[r], specs, meta, func(s model.TensorSpec, w io.Writer) error {
			_, err := w.Write(data[s.Name])
			return err
		}))
	}
	return paths
}

func shardMeta(rank, world string) map[string]string {
	return map[string]string{"format": optimizerShardFormat, "rank": rank, "world_size": world}
}

// mergeTestShards writes the shards and merges them into a fresh directory,
// returning the merge's error and what that directory holds afterwards.
func mergeTestShards(t *testing.T, params []TensorInfo, shards []testShard) (string, map[string][2][]byte, []os.DirEntry, error) {
	t.Helper()
	full := fullShardState()
	paths := writeTestShards(t, t.TempDir(), full, shards)
	outDir := t.TempDir()
	dst := filepath.Join(outDir, "optimizer.safetensors")
	err := MergeOptimizerShards(dst, paths, params)
	entries, rerr := os.ReadDir(outDir)
	require.NoError(t, rerr)
	return dst, full, entries, err
}

func TestMergeOptimizerShards(t *testing.T) {
	ok := []struct {
		name   string
		shards []testShard
		want   []TensorInfo // parameters with state in the merged file
	}{
		{
			name:   "one rank holds everything",
			shards: []testShard{{pieces: []testPiece{pieceOf(shardA, 0, 10), pieceOf(shardB, 0, 7), pieceOf(shardC, 0, 6), pieceOf(shardD, 0, 4)}}},
			want:   []TensorInfo{shardA, shardB, shardC, shardD},
		},
		{
			name: "three ranks, parameters straddle rank boundaries",
			shards: []testShard{
				{pieces: []testPiece{pieceOf(shardA, 0, 8)}},
				{pieces: []testPiece{pieceOf(shardA, 8, 2), pieceOf(shardB, 0, 6)}},
				{pieces: []testPiece{pieceOf(shardB, 6, 1), pieceOf(shardC, 3, 3), pieceOf(shardC, 0, 3), pieceOf(shardD, 0, 4)}},
			},
			want: []TensorInfo{shardA, shardB, shardC, shardD},
		},
		{
			name: "empty rank and parameters without state",
			shards: []testShard{
				{pieces: []testPiece{pieceOf(shardA, 0, 10)}},
				{},
				{pieces: []testPiece{pieceOf(shardC, 0, 2), pieceOf(shardC, 2, 4)}},
			},
			want: []TensorInfo{shardA, shardC},
		},
		{name: "no state at all", shards: []testShard{{}, {}}},
		{
			name:   "empty piece is harmless",
			shards: []testShard{{pieces: []testPiece{pieceOf(shardD, 0, 4), pieceOf(shardD, 4, 0), pieceOf(shardD, 2, 0)}}},
			want:   []TensorInfo{shardD},
		},
	}
	for _, tc := range ok {
		t.Run(tc.name, func(t *testing.T) {
			dst, full, entries, err := mergeTestShards(t, shardParams, tc.shards)
			require.NoError(t, err)
			require.Len(t, entries, 1, "only the merged file, no temp files")
			checkMergedOptimizer(t, dst, full, tc.want)
		})
	}

	expAvgOnly := func(p TensorInfo, off, n int64) testPiece {
		return testPiece{param: p, off: off, n: n, kind: optimizerExpAvg}
	}
	bad := []struct {
		name    string
		shards  []testShard
		wantErr string
		errFile string // part of the shard file name the error must name
	}{
		{"zero shards", nil, "no shard files", ""},
		{"unknown parameter", []testShard{{}, {pieces: []testPiece{pieceOf(TensorInfo{Name: "nope.weight", DType: model.F32}, 0, 2)}}},
			`piece "exp_avg.nope.weight@0": unknown parameter "nope.weight"`, "optim.rank1."},
		{"piece dtype differs", []testShard{{pieces: []testPiece{{param: shardA, off: 0, n: 10, dtype: model.BF16}}}},
			`dtype BF16 differs from parameter "model.embed_tokens.weight" dtype F32`, "optim.rank0."},
		{"piece out of range", []testShard{{pieces: []testPiece{pieceOf(shardA, 0, 5)}}, {pieces: []testPiece{pieceOf(shardA, 5, 6)}}},
			"elements [5, 11) run past the 10 elements", "optim.rank1."},
		{"piece offset past the end", []testShard{{pieces: []testPiece{pieceOf(shardD, 0, 4), pieceOf(shardD, 5, 0)}}},
			"elements [5, 5) run past the 4 elements", "optim.rank0."},
		{"overlapping pieces", []testShard{{pieces: []testPiece{pieceOf(shardA, 0, 6)}}, {pieces: []testPiece{pieceOf(shardA, 5, 5)}}},
			"exp_avg pieces overlap: exp_avg.model.embed_tokens.weight@0 in", "optim.rank1."},
		{"gap in coverage", []testShard{{pieces: []testPiece{pieceOf(shardA, 0, 4)}}, {pieces: []testPiece{pieceOf(shardA, 6, 4)}}},
			`parameter "model.embed_tokens.weight": exp_avg is missing elements [4, 6) of 10`, ""},
		{"tail missing", []testShard{{pieces: []testPiece{pieceOf(shardB, 0, 3)}}, {pieces: []testPiece{pieceOf(shardB, 3, 3)}}},
			`parameter "model.layers.0.mlp@odd.weight": exp_avg is missing elements [6, 7) of 7`, ""},
		{"exp_avg without exp_avg_sq", []testShard{{pieces: []testPiece{expAvgOnly(shardC, 0, 6)}}},
			`parameter "lm_head.weight" has exp_avg pieces but no exp_avg_sq pieces`, ""},
		{"exp_avg_sq without exp_avg", []testShard{{pieces: []testPiece{{param: shardC, off: 0, n: 6, kind: optimizerExpAvgSq}}}},
			`parameter "lm_head.weight" has exp_avg_sq pieces but no exp_avg pieces`, ""},
		{"exp_avg_sq coverage differs", []testShard{{pieces: []testPiece{expAvgOnly(shardC, 0, 6), {param: shardC, off: 0, n: 5, kind: optimizerExpAvgSq}}}},
			`parameter "lm_head.weight": exp_avg_sq is missing elements [5, 6) of 6`, ""},
		{"piece not 1-D", []testShard{{pieces: []testPiece{{param: shardA, off: 0, n: 10, shape: []int64{2, 5}}}}},
			"shape [2 5] is not 1-D", "optim.rank0."},
		{"tensor that is not a piece", []testShard{{pieces: []testPiece{{param: shardA, n: 2, kind: optimizerExpAvg, name: "exp_avg.model.embed_tokens.weight"}}}},
			`tensor "exp_avg.model.embed_tokens.weight" is neither "step" nor an optimizer state piece`, "optim.rank0."},
		{"duplicate rank", []testShard{{}, {meta: shardMeta("0", "2")}}, "duplicate rank 0, also held by", "optim.rank1."},
		{"shards out of rank order", []testShard{{meta: shardMeta("1", "2")}, {meta: shardMeta("0", "2")}},
			"holds rank 1 but is shard file 0", "optim.rank0."},
		{"rank out of range", []testShard{{meta: shardMeta("2", "2")}, {}}, "metadata rank 2 is outside [0, 2)", "optim.rank0."},
		{"metadata missing", []testShard{{meta: map[string]string{}}}, `metadata format is "", want "ortrain-adamw-shard"`, "optim.rank0."},
		{"unsharded file given as a shard", []testShard{{meta: map[string]string{"format": "ortrain-adamw"}}},
			`metadata format is "ortrain-adamw", want "ortrain-adamw-shard"`, "optim.rank0."},
		{"rank missing", []testShard{{meta: map[string]string{"format": optimizerShardFormat, "world_size": "1"}}},
			`metadata rank "" is missing or not an integer`, "optim.rank0."},
		{"world size disagrees", []testShard{{}, {meta: shardMeta("1", "3")}}, "metadata world_size is 3 but 2 shard files were given", "optim.rank1."},
		{"steps differ", []testShard{{}, {}, {step: 43}}, "step 43 in", "optim.rank2."},
		{"step missing", []testShard{{}, {noStep: true}}, `no "step" tensor`, "optim.rank1."},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, _, entries, err := mergeTestShards(t, shardParams, tc.shards)
			require.ErrorContains(t, err, tc.wantErr)
			assert.ErrorContains(t, err, tc.errFile)
			assert.Empty(t, entries, "a failed merge leaves nothing behind")
		})
	}
	t.Run("repeated parameter", func(t *testing.T) {
		_, _, _, err := mergeTestShards(t, []TensorInfo{shardA, shardB, shardA}, []testShard{{}})
		require.ErrorContains(t, err, `parameter name "model.embed_tokens.weight" is empty or repeated`)
	})
}

// checkMergedOptimizer checks the merged file tensor by tensor, then byte
// for byte against the file an unsharded run would write for the same state.
func checkMergedOptimizer(t *testing.T, dst string, full map[string][2][]byte, want []TensorInfo) {
	t.Helper()
	h, tensors, err := model.ReadSafetensors(dst)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"format": "ortrain-adamw"}, h.Metadata)
	expect := []model.Tensor{{Name: "step", DType: model.I64, Shape: []int64{1}, Data: shardStepBytes(shardTestStep)}}
	for _, p := range want {
		for k, kind := range optimizerKinds {
			expect = append(expect, model.Tensor{Name: kind + "." + p.Name, DType: p.DType, Shape: p.Shape, Data: full[p.Name][k]})
		}
	}
	got := map[string]model.Tensor{}
	for _, tn := range tensors {
		got[tn.Name] = tn
	}
	require.Len(t, got, len(expect), "tensor names")
	for _, e := range expect {
		g, ok := got[e.Name]
		require.True(t, ok, "missing %q", e.Name)
		assert.Equal(t, e.DType, g.DType, e.Name)
		assert.Equal(t, e.Shape, g.Shape, e.Name)
		assert.Equal(t, e.Data, g.Data, e.Name)
	}
	assert.Equal(t, int64(shardTestStep), int64(binary.LittleEndian.Uint64(got["step"].Data)))

	ref := filepath.Join(t.TempDir(), "unsharded.safetensors")
	require.NoError(t, model.WriteSafetensors(ref, expect, map[string]string{"format": "ortrain-adamw"}))
	refBytes, err := os.ReadFile(ref)
	require.NoError(t, err)
	gotBytes, err := os.ReadFile(dst)
	require.NoError(t, err)
	assert.Equal(t, refBytes, gotBytes, "merged file differs from the unsharded format")
}

// The piece-name parser: the offset follows the last '@', and exp_avg_sq
// must not be taken for exp_avg. Only canonical names parse.
func TestMergeOptimizerShardsPieceNames(t *testing.T) {
	tests := []struct {
		name, kind, param string
		off               int64
	}{
		{"exp_avg.w@0", "exp_avg", "w", 0},
		{"exp_avg_sq.w@12", "exp_avg_sq", "w", 12},
		{"exp_avg.exp_avg_sq.w@3", "exp_avg", "exp_avg_sq.w", 3},
		{"exp_avg_sq.exp_avg.w@3", "exp_avg_sq", "exp_avg.w", 3},
		{"exp_avg.a@b@7", "exp_avg", "a@b", 7},
		{"exp_avg.@@5", "exp_avg", "@", 5},
		{"exp_avg.model.layers.0.self_attn.q_proj.weight@9223372036854775807", "exp_avg", "model.layers.0.self_attn.q_proj.weight", 1<<63 - 1},
		// Not pieces.
		{name: "exp_avg.w"}, {name: "exp_avg.w@"}, {name: "exp_avg.w@-1"}, {name: "exp_avg.w@+1"},
		{name: "exp_avg.w@01"}, {name: "exp_avg.w@1x"}, {name: "exp_avg.w@ 1"}, {name: "exp_avg.w@9223372036854775808"},
		{name: "exp_avg.@0"}, {name: "exp_avg_sq.@0"}, {name: "exp_avg@0"}, {name: "exp_avg_sq@0"},
		{name: "exp_avgw@0"}, {name: "EXP_AVG.w@0"}, {name: "step"}, {name: ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			kind, param, off, ok := optimizerShardPiece(tc.name)
			require.Equal(t, tc.kind != "", ok)
			assert.Equal(t, tc.kind, kind)
			assert.Equal(t, tc.param, param)
			assert.Equal(t, tc.off, off)
			if ok {
				assert.Equal(t, tc.name, optimizerShardPieceName(kind, param, off))
			}
		})
	}
}

func FuzzOptimizerShardName(f *testing.F) {
	for _, s := range []string{"exp_avg.w@0", "exp_avg_sq.a.b@c@12", "exp_avg.w@01", "exp_avg_sq.@3", "step", "@", ""} {
		f.Add(s, int64(5), false)
	}
	f.Add("model.norm.weight", int64(-1), true)
	f.Fuzz(func(t *testing.T, s string, off int64, sq bool) {
		// Any name: no panic, and whatever parses is a valid, canonical piece.
		if kind, param, o, ok := optimizerShardPiece(s); ok {
			require.Contains(t, optimizerKinds[:], kind)
			require.NotEmpty(t, param)
			require.GreaterOrEqual(t, o, int64(0))
			require.Equal(t, s, optimizerShardPieceName(kind, param, o))
		}
		// Any valid piece round trips, whatever the parameter name holds.
		if s == "" {
			return
		}
		if off < 0 {
			off = -(off + 1)
		}
		kind := optimizerExpAvg
		if sq {
			kind = optimizerExpAvgSq
		}
		k, p, o, ok := optimizerShardPiece(optimizerShardPieceName(kind, s, off))
		require.True(t, ok)
		require.Equal(t, kind, k)
		require.Equal(t, s, p)
		require.Equal(t, off, o)
	})
}
