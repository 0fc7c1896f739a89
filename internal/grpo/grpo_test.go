package grpo

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var nan = math.NaN()

// Expected values computed by hand from grpo-reference.md §3.1:
// A = (r - nanmean(group)) / (nanstd_ddof1 + 1e-4); e.g. group [1,0,0,1]:
// std = sqrt(1/3), A = ±0.5 / (0.57735 + 1e-4) = ±0.8658754297607016.
func TestGroupAdvantages(t *testing.T) {
	const a1 = 0.8658754297607016 // 0.5/(sqrt(1/3)+1e-4)
	const ab = 1.3225257481090977 // 0.5/(sqrt(1/7)+1e-4), batch std of the 8 rewards
	tests := []struct {
		name     string
		rewards  []float64
		g        int
		scale    ScaleRewards
		want     []float64
		wantZero []bool
	}{
		{"group", []float64{1, 0, 0, 1, .5, .5, .5, .5}, 4, ScaleGroup,
			[]float64{a1, -a1, -a1, a1, 0, 0, 0, 0}, []bool{false, false, false, false, true, true, true, true}},
		{"batch std keeps group mean", []float64{1, 0, 0, 1, .5, .5, .5, .5}, 4, ScaleBatch,
			[]float64{ab, -ab, -ab, ab, 0, 0, 0, 0}, []bool{false, false, false, false, false, false, false, false}},
		{"none only centres", []float64{1, 0, 0, 1, .2, .4, .9, .5}, 4, ScaleNone,
			[]float64{.5, -.5, -.5, .5, -.3, -.1, .4, 0}, []bool{false, false, false, false, false, false, false, false}},
		{"three unequal", []float64{.2, .4, .9}, 3, ScaleGroup,
			[]float64{-0.8318195890931966, -0.27727319636439884, 1.1090927854575956}, []bool{false, false, false}},
		{"NaN rows and single-value groups become 0", []float64{1, nan, 0, 0}, 2, ScaleGroup,
			[]float64{0, 0, 0, 0}, []bool{false, false, true, true}},
		{"all NaN", []float64{nan, nan}, 2, ScaleGroup, []float64{0, 0}, []bool{false, false}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			adv, err := GroupAdvantages(tc.rewards, tc.g, tc.scale)
			require.NoError(t, err)
			require.Len(t, adv.A, len(tc.want))
			for i := range tc.want {
				assert.InDelta(t, tc.want[i], adv.A[i], 1e-9, "row %d", i)
			}
			assert.Equal(t, tc.wantZero, adv.StdZero)
		})
	}
	_, err := GroupAdvantages([]float64{1, 2, 3}, 2, ScaleGroup)
	assert.Error(t, err)
}

func f(x float64) *float64 { return &x }

func TestRewardAggregation(t *testing.T) {
	calls := []*float64{nil, f(0.25), nil, f(1), f(0.5), nil}
	tests := []struct {
		agg  RewardAggregation
		in   []*float64
		want float64
	}{
		{RewardLast, calls, 0.5},
		{RewardSum, calls, 1.75},
		{RewardMax, calls, 1},
		{RewardMean, calls, 1.75 / 3},
		{RewardLast, []*float64{nil, nil}, 0},
		{RewardLast, nil, 0},
		{RewardMax, []*float64{f(-2), f(-1)}, -1},
	}
	for _, tc := range tests {
		assert.InDelta(t, tc.want, tc.agg.Aggregate(tc.in), 1e-12)
	}
	for _, s := range []string{"last", "sum", "max", "mean"} {
		_, err := ParseRewardAggregation(s)
		assert.NoError(t, err)
	}
	_, err := ParseRewardAggregation("first")
	assert.Error(t, err)
}

func TestBuildRowsMasks(t *testing.T) {
	samples := []Sample{
		{PromptIDs: []int32{1, 2}, CompletionIDs: []int32{3, 4, 5}, ToolMask: []uint8{1, 0, 1}, Reward: 1},
		{PromptIDs: []int32{1, 2}, CompletionIDs: []int32{6, 7}, ToolMask: []uint8{1, 1}, Reward: 0, Truncated: true},
		{PromptIDs: []int32{1}, CompletionIDs: []int32{8}, ToolMask: []uint8{1}, Reward: nan},
	}
	adv := Advantages{A: []float64{0.5, -0.5, 0}}
	rows, err := BuildRows(samples, adv, true)
	require.NoError(t, err)
	assert.Equal(t, []int32{1, 2, 3, 4, 5}, rows[0].Tokens)
	assert.Equal(t, 2, rows[0].PromptLen)
	assert.Equal(t, []uint8{1, 0, 1}, rows[0].LossMask)
	assert.Equal(t, []uint8{0, 0}, rows[1].LossMask, "truncated row masked")
	assert.Equal(t, []uint8{0}, rows[2].LossMask, "unscorable row masked")
	assert.Equal(t, float32(-0.5), rows[1].Advantage)
	assert.Equal(t, 2, ActiveTokens(rows))

	rows, err = BuildRows(samples, adv, false)
	require.NoError(t, err)
	assert.Equal(t, []uint8{1, 1}, rows[1].LossMask, "truncated row kept without mask_truncated_completions")

	_, err = BuildRows([]Sample{{CompletionIDs: []int32{1}, ToolMask: []uint8{}}}, Advantages{A: []float64{0}}, false)
	assert.Error(t, err)
}

// The worked example of grpo-reference.md §1.3 with P = 1: B=4, GA=2 ⇒ S=2,
// N_gen=8, G=4: two prompts per round, each micro-batch holds 4 rows, both
// micro-batches share the round normaliser N and every row is used once.
func TestSplitRound(t *testing.T) {
	rows := make([]Row, 8)
	for i := range rows {
		rows[i] = Row{Tokens: []int32{int32(i), 0}, PromptLen: 1, LossMask: []uint8{uint8(i % 2)}}
	}
	mbs, err := SplitRound(rows, 2, 4, 2, rand.New(rand.NewPCG(1, 2)))
	require.NoError(t, err)
	require.Len(t, mbs, 2)
	seen := map[int32]bool{}
	for _, mb := range mbs {
		assert.Len(t, mb.Rows, 4)
		assert.Equal(t, 4.0, mb.RoundTokens)
		assert.Equal(t, 2, mb.GradAccumSteps)
		for _, r := range mb.Rows {
			seen[r.Tokens[0]] = true
		}
	}
	assert.Len(t, seen, 8)
	_, err = SplitRound(rows, 3, 4, 1, rand.New(rand.NewPCG(1, 2)))
	assert.Error(t, err)
}

// TestForksTrainWithTheirRolloutsAdvantage: a sample's forks become rows
// after all the samples' own rows, each with the sample's advantage and its
// masking (none for an unscorable rollout), and SplitRound deals the rows
// beyond s*b to the micro-batches in turn.
func TestForksTrainWithTheirRolloutsAdvantage(t *testing.T) {
	samples := []Sample{
		{PromptIDs: []int32{1}, CompletionIDs: []int32{2, 3}, ToolMask: []uint8{1, 1}, Reward: 1,
			Forks: []Fork{
				{PromptIDs: []int32{9, 9}, CompletionIDs: []int32{4}, ToolMask: []uint8{1}, SamplerLogprobs: []float32{-0.5}},
				{PromptIDs: []int32{8}, CompletionIDs: []int32{5, 6}, ToolMask: []uint8{0, 1}},
			}},
		{PromptIDs: []int32{1}, CompletionIDs: []int32{7}, ToolMask: []uint8{1}, Reward: nan,
			Forks: []Fork{{PromptIDs: []int32{1}, CompletionIDs: []int32{7}, ToolMask: []uint8{1}}}},
		{PromptIDs: []int32{1}, CompletionIDs: []int32{2}, ToolMask: []uint8{1}, Reward: 0},
		{PromptIDs: []int32{1}, CompletionIDs: []int32{3}, ToolMask: []uint8{1}, Reward: 0},
	}
	adv := Advantages{A: []float64{0.75, 0, -0.25, -0.5}}
	rows, err := BuildRows(samples, adv, false)
	require.NoError(t, err)
	require.Len(t, rows, 7)
	assert.Equal(t, Row{Tokens: []int32{9, 9, 4}, PromptLen: 2, LossMask: []uint8{1}, SamplerLogprobs: []float32{-0.5}, Advantage: 0.75}, rows[4])
	assert.Equal(t, Row{Tokens: []int32{8, 5, 6}, PromptLen: 1, LossMask: []uint8{0, 1}, Advantage: 0.75}, rows[5])
	assert.Equal(t, []uint8{0}, rows[6].LossMask, "an unscorable rollout's fork trains on nothing")

	mbs, err := SplitRound(rows, 2, 2, 1, rand.New(rand.NewPCG(1, 2)))
	require.NoError(t, err)
	seen := 0
	for _, mb := range mbs {
		assert.GreaterOrEqual(t, len(mb.Rows), 3)
		seen += len(mb.Rows)
	}
	assert.Equal(t, 7, seen)

	bad := []Sample{{PromptIDs: []int32{1}, CompletionIDs: []int32{2}, ToolMask: []uint8{1}, Reward: 1,
		Forks: []Fork{{PromptIDs: []int32{1}, CompletionIDs: []int32{2, 3}, ToolMask: []uint8{1}}}}}
	_, err = BuildRows(bad, Advantages{A: []float64{1}}, false)
	require.Error(t, err, "a fork's mask must cover its completion")
}

func TestRoundMetrics(t *testing.T) {
	samples := []Sample{
		{PromptIDs: []int32{1, 2}, CompletionIDs: []int32{3, 4, 5}, ToolMask: []uint8{1, 0, 1}, Reward: 1, Env: "echo", ToolCalls: 2, ToolFailures: 1},
		{PromptIDs: []int32{1, 2}, CompletionIDs: []int32{6, 7}, ToolMask: []uint8{1, 1}, Reward: 0, Truncated: true, Env: "echo", ToolCalls: 1},
		{PromptIDs: []int32{1}, CompletionIDs: []int32{8, 9, 9, 9}, ToolMask: []uint8{1, 1, 1, 1}, Reward: nan, Env: "letters"},
		{PromptIDs: []int32{1}, CompletionIDs: []int32{8}, ToolMask: []uint8{1}, Reward: 0.5, Env: "letters"},
	}
	m := ComputeRoundMetrics(samples, Advantages{StdZero: []bool{true, true, false, false}})
	assert.InDelta(t, 0.5, m.Reward, 1e-12)
	assert.InDelta(t, 0.5, m.RewardStd, 1e-12) // ddof=1 over {1,0,0.5}
	assert.InDelta(t, 0.5, m.FracRewardZeroStd, 1e-12)
	assert.InDelta(t, 2.25, m.MeanLength, 1e-12) // (2+2+4+1)/4
	assert.Equal(t, 1.0, m.MinLength)
	assert.Equal(t, 4.0, m.MaxLength)
	assert.InDelta(t, 0.25, m.ClippedRatio, 1e-12)
	assert.InDelta(t, 7.0/3, m.MeanTerminatedLength, 1e-12)
	assert.InDelta(t, 0.75, m.ToolCallFrequency, 1e-12)
	assert.InDelta(t, 1.0/3, m.ToolFailureFrequency, 1e-12)
	assert.Equal(t, 1, m.Unscorable)
	mp := m.Map()
	assert.InDelta(t, 0.5, mp["env/echo/reward_mean"], 1e-12)
	assert.InDelta(t, 0.5, mp["env/letters/reward_mean"], 1e-12)
	_, hasStd := mp["env/letters/reward_std"]
	assert.False(t, hasStd, "NaN std (one scorable value) is left out")
}
