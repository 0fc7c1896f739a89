package reward

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/grpo"
)

func TestWeightedSum(t *testing.T) {
	specs := []Spec{
		{Name: "env", Kind: KindEnv, Weight: ptr(2.0)},
		{Name: "bonus", Kind: KindExpression, Weight: ptr(0.5), Expression: "has(task.bonus) ? task.bonus : dyn(null)"},
		{Name: "format", Kind: KindBuiltin, Function: "tool_call_format", Weight: ptr(-1.0)},
		{Name: "zero", Kind: KindExpression, Weight: ptr(0.0), Expression: "100.0"},
	}
	parsed := []Turn{{Role: "assistant", ToolCalls: []ToolCall{{Name: "x"}}}, {Role: "assistant", FormatError: true}}
	tests := []struct {
		name       string
		traj       Trajectory
		wantValues []float64
		wantTotal  float64
	}{
		// 2·0.8 + 0.5·0.4 − 1·0.5 + 0·100 = 1.6 + 0.2 − 0.5 = 1.3
		{"all values", Trajectory{EnvRewards: []*float64{ptr(0.8)}, Task: map[string]any{"bonus": 0.4}, Turns: parsed},
			[]float64{0.8, 0.4, 0.5, 100}, 1.3},
		// bonus and format decline (NaN): skipped, like TRL's nansum: 2·0.8 + 0 = 1.6
		{"NaN skipped", Trajectory{EnvRewards: []*float64{ptr(0.8)}},
			[]float64{0.8, nan(), nan(), 100}, 1.6},
		// env with no rewards is 0 (as grpo.Aggregate and TRL's env.reward)
		{"env without rewards", Trajectory{},
			[]float64{0, nan(), nan(), 100}, 0},
		{"failed is not scored", Trajectory{Failed: true, EnvRewards: []*float64{ptr(1.0)}},
			[]float64{nan(), nan(), nan(), nan()}, nan()},
	}
	set := compile(t, specs, Options{Aggregation: grpo.RewardLast})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			scores, err := set.Score(context.Background(), []Trajectory{tt.traj})
			require.NoError(t, err)
			require.NoError(t, scores[0].Err)
			assertFloats(t, tt.wantValues, scores[0].Values)
			assertFloat(t, tt.wantTotal, scores[0].Total)
		})
	}
}

func TestAllNaNIsUnscorable(t *testing.T) {
	set := compile(t, []Spec{
		{Name: "a", Kind: KindExpression, Expression: "dyn(null)"},
		{Name: "format", Kind: KindBuiltin, Function: "tool_call_format"},
	}, Options{})
	scores, err := set.Score(context.Background(), []Trajectory{{}, {}})
	require.NoError(t, err)
	for _, s := range scores {
		assert.NoError(t, s.Err)
		assertFloat(t, nan(), s.Total)
	}
}

func TestDefaultSetIsTodaysEnvReward(t *testing.T) {
	rewards := []*float64{ptr(0.2), nil, ptr(0.9), ptr(0.4)}
	for _, agg := range []grpo.RewardAggregation{grpo.RewardLast, grpo.RewardSum, grpo.RewardMax, grpo.RewardMean} {
		set := compile(t, nil, Options{Aggregation: agg})
		assert.Equal(t, []string{"env"}, set.Names())
		scores, err := set.Score(context.Background(), []Trajectory{{EnvRewards: rewards}})
		require.NoError(t, err)
		assertFloat(t, agg.Aggregate(rewards), scores[0].Total, "aggregation %d", agg)
	}
}

func TestNothingToScoreSendsNothing(t *testing.T) {
	var calls atomic.Int32
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { calls.Add(1) }))
	set := compile(t, []Spec{{Name: "env", Kind: KindEnv}, {Name: "h", Kind: KindHTTP, URL: srv.URL}}, Options{})
	scores, err := set.Score(context.Background(), nil)
	require.NoError(t, err)
	assert.Empty(t, scores)
	scores, err = set.Score(context.Background(), []Trajectory{{Failed: true}, {Failed: true}})
	require.NoError(t, err)
	require.Len(t, scores, 2)
	for _, s := range scores {
		assert.NoError(t, s.Err)
		assertFloats(t, []float64{nan(), nan()}, s.Values)
	}
	assert.Zero(t, calls.Load(), "no request for a batch with nothing to score")
}

func TestMetrics(t *testing.T) {
	set := compile(t, []Spec{
		{Name: "env", Kind: KindEnv},
		{Name: "judge", Kind: KindExpression, Expression: "has(task.v) ? task.v : dyn(null)"},
		{Name: "never", Kind: KindExpression, Expression: "dyn(null)"},
	}, Options{})
	batch := []Trajectory{
		{EnvRewards: []*float64{ptr(1.0)}, Task: map[string]any{"v": 2.0}},
		{EnvRewards: []*float64{ptr(0.0)}, Task: map[string]any{"v": 4.0}},
		{EnvRewards: []*float64{ptr(0.5)}, Task: map[string]any{}},
		{EnvRewards: []*float64{ptr(9.0)}, Failed: true},
	}
	scores, err := set.Score(context.Background(), batch)
	require.NoError(t, err)
	m := set.Metrics(scores)
	// env: values 1, 0, 0.5 → mean 0.5; sample std sqrt(((0.5)²+(0.5)²+0)/2) = 0.5
	// judge: values 2, 4 → mean 3; std sqrt((1+1)/1) = √2
	// never: no values → no metrics
	assert.Len(t, m, 4)
	assert.InDelta(t, 0.5, m["rewards/env/mean"], 1e-12)
	assert.InDelta(t, 0.5, m["rewards/env/std"], 1e-12)
	assert.InDelta(t, 3.0, m["rewards/judge/mean"], 1e-12)
	assert.InDelta(t, 1.4142135623730951, m["rewards/judge/std"], 1e-12)

	one := set.Metrics(scores[:1])
	assert.Equal(t, map[string]float64{"rewards/env/mean": 1, "rewards/judge/mean": 2}, one, "std of one value is omitted")
}

func TestScoreFromManyGoroutines(t *testing.T) {
	srv := serve(t, ExampleScorer())
	set := compile(t, []Spec{
		{Name: "env", Kind: KindEnv},
		{Name: "brevity", Kind: KindExpression, Expression: "completion_tokens < 8 ? 1.0 : 0.0"},
		{Name: "judge", Kind: KindHTTP, URL: srv.URL + "/score"},
	}, Options{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			batch := capitals()
			batch[0].CompletionTokens = g // brevity 1 for g < 8
			scores, err := set.Score(context.Background(), batch)
			if !assert.NoError(t, err) {
				return
			}
			// t0: env last(0.5, null) = 0.5, brevity 1, judge 1 → 2.5
			assert.InDelta(t, 2.5, scores[0].Total, 1e-12)
		})
	}
	wg.Wait()
}

// TestAgentReward: kind agent scores the reward the agent reported, 0 when
// it reported none, beside the env's rewards.
func TestAgentReward(t *testing.T) {
	set := compile(t, []Spec{{Name: "env", Kind: KindEnv}, {Name: "agent", Kind: KindAgent}}, Options{})
	half, one := 0.5, 1.0
	scores, err := set.Score(context.Background(), []Trajectory{
		{AgentReward: &half, EnvRewards: []*float64{&one}},
		{EnvRewards: []*float64{&one}},
	})
	require.NoError(t, err)
	require.Len(t, scores, 2)
	assert.Equal(t, []float64{1, 0.5}, scores[0].Values)
	assert.InDelta(t, 1.5, scores[0].Total, 1e-12)
	assert.Equal(t, []float64{1, 0}, scores[1].Values)
	_, err = Compile([]Spec{{Name: "a", Kind: KindAgent, Aggregation: "sum"}}, Options{})
	require.Error(t, err, "an agent reward aggregates nothing")
}
