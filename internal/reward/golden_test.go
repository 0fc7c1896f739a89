package reward

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/grpo"
)

type goldenFile struct {
	Specs        []Spec       `json:"specs"`
	Trajectories []Trajectory `json:"trajectories"`
	Want         []struct {
		Values []*float64 `json:"values"`
		Total  *float64   `json:"total"`
	} `json:"want"`
}

func orNaN(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

// TestGolden scores testdata/golden.json with one reward of each kind.
// Expected, by hand (weights env 1, brevity 0.5, overlong 1, judge 2;
// overlong_penalty max_length 20, cache 8, so the ramp is 12 < L <= 20):
//
//	t0: env sum(0.25, 1.0) = 1.25; 6 tokens < 8 → brevity 1; 6 <= 12 → overlong 0;
//	    "The answer is Paris." contains "paris" → judge 1;
//	    total 1.25 + 0.5·1 + 0 + 2·1 = 3.75
//	t1: env sum() = 0; brevity 0; overlong (12-16)/8 = -0.5; "Milan" ≠ "rome" → 0;
//	    total -0.5
//	t2: env 0.5; brevity 0; 25 > 20 → overlong -1; task has no answer → judge null;
//	    total 0.5 + 0 - 1 (judge skipped, TRL's nansum) = -0.5
//	t3: failed rollout: not scored, not sent to the judge; all NaN.
func TestGolden(t *testing.T) {
	raw, err := os.ReadFile("testdata/golden.json")
	require.NoError(t, err)
	var g goldenFile
	require.NoError(t, json.Unmarshal(raw, &g))
	require.Len(t, g.Want, len(g.Trajectories))

	var mu sync.Mutex
	var received []RequestItem
	judge := ExampleScorer()
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req Request
		body := tee(t, r)
		if !assert.NoError(t, json.Unmarshal(body, &req)) {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		mu.Lock()
		received = append(received, req.Trajectories...)
		mu.Unlock()
		judge.ServeHTTP(w, r)
	}))
	for i := range g.Specs {
		if g.Specs[i].Kind == KindHTTP {
			g.Specs[i].URL = srv.URL + "/score"
		}
	}
	set := compile(t, g.Specs, Options{Aggregation: grpo.RewardLast, NewBackoff: instantBackoff(nil)})
	scores, err := set.Score(context.Background(), g.Trajectories)
	require.NoError(t, err)
	require.Len(t, scores, len(g.Want))
	for i, want := range g.Want {
		vals := make([]float64, len(want.Values))
		for k, v := range want.Values {
			vals[k] = orNaN(v)
		}
		assert.NoError(t, scores[i].Err, "trajectory %d", i)
		assertFloats(t, vals, scores[i].Values, "trajectory %d", i)
		assertFloat(t, orNaN(want.Total), scores[i].Total, "trajectory %d total", i)
	}
	require.Len(t, received, 3, "the failed trajectory is not sent to the scorer")
	assert.Equal(t, "The answer is Paris.", received[0].Completion)
	assert.InDelta(t, 1.0, received[0].EnvReward, 1e-12, "env_reward uses the run's aggregation (last)")
	assert.Len(t, received[0].Messages, 8, "user prompt + 7 turns")
	assert.Equal(t, "lookup", received[0].Messages[2].Name)
}
