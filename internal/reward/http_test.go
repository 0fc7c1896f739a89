package reward

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/grpo"
)

// capitals is a batch for the example scorer: right, wrong, no answer.
func capitals() []Trajectory {
	return []Trajectory{
		{Task: map[string]any{"answer": "Paris"}, Prompt: "Capital of France?",
			Turns: []Turn{
				{Role: "assistant", Text: "x", ToolCalls: []ToolCall{{Name: "lookup", Arguments: json.RawMessage(`{"q":"France"}`)}}},
				{Role: "tool", Tool: "lookup", Text: "Paris", Reward: ptr(0.5)},
				{Role: "assistant", Text: "It is PARIS."},
			},
			EnvRewards: []*float64{ptr(0.5), nil}, Outcome: "stopped", NumToolCalls: 1, CompletionTokens: 12,
			Metadata: map[string]any{"k": "v"}},
		{Task: map[string]any{"answer": "Rome"}, Turns: []Turn{{Role: "assistant", Text: "Milan"}}},
		{Task: map[string]any{}, Turns: []Turn{{Role: "assistant", Text: "hello"}}},
	}
}

func judgeSpec(url string, timeout time.Duration, retries int) Spec {
	return Spec{Name: "judge", Kind: KindHTTP, URL: url, Timeout: timeout, Retries: ptr(retries), Weight: ptr(2.0)}
}

func TestHTTPHappyPath(t *testing.T) {
	var got Request
	var contentType string
	example := ExampleScorer()
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		contentType = r.Header.Get("Content-Type")
		assert.NoError(t, json.Unmarshal(tee(t, r), &got))
		example.ServeHTTP(w, r)
	}))
	set := compile(t, []Spec{{Name: "env", Kind: KindEnv}, judgeSpec(srv.URL+"/score", time.Second, 0)},
		Options{Aggregation: grpo.RewardSum})
	scores, err := set.Score(context.Background(), capitals())
	require.NoError(t, err)

	// judge: "It is PARIS." contains "paris" → 1; "Milan" → 0; no answer → null.
	// totals: 0.5 + 2·1 = 2.5; 0 + 2·0 = 0; 0 + (judge skipped) = 0.
	want := [][]float64{{0.5, 1}, {0, 0}, {0, nan()}}
	totals := []float64{2.5, 0, 0}
	for i := range want {
		require.NoError(t, scores[i].Err)
		assertFloats(t, want[i], scores[i].Values, "trajectory %d", i)
		assertFloat(t, totals[i], scores[i].Total, "trajectory %d", i)
	}

	assert.Equal(t, "application/json", contentType)
	assert.Equal(t, "judge", got.Reward)
	require.Len(t, got.Trajectories, 3)
	first := got.Trajectories[0]
	assert.Equal(t, "It is PARIS.", first.Completion)
	assert.Equal(t, 0.5, first.EnvReward, "the run's aggregation (sum) of 0.5 and null")
	assert.Equal(t, []*float64{ptr(0.5), nil}, first.EnvRewards)
	assert.Equal(t, 2, first.NumTurns)
	assert.Equal(t, 12, first.CompletionTokens)
	assert.Equal(t, map[string]any{"k": "v"}, first.Metadata)
	assert.Equal(t, []Message{
		{Role: "user", Content: "Capital of France?"},
		{Role: "assistant", Content: "x", ToolCalls: []ToolCall{{Name: "lookup", Arguments: json.RawMessage(`{"q":"France"}`)}}},
		{Role: "tool", Content: "Paris", Name: "lookup"},
		{Role: "assistant", Content: "It is PARIS."},
	}, first.Messages)
	assert.Equal(t, []*float64{}, got.Trajectories[1].EnvRewards, "no env rewards is [], not null")
	assert.Equal(t, map[string]any{}, got.Trajectories[1].Metadata, "no metadata is {}, not null")
}

func TestHTTPRetriesA500(t *testing.T) {
	var calls atomic.Int32
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			http.Error(w, "warming up", http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte(`{"rewards": [0.25, null, -1]}`))
	}))
	var waits []time.Duration
	set := compile(t, []Spec{judgeSpec(srv.URL, time.Second, 2)}, Options{NewBackoff: instantBackoff(&waits)})
	scores, err := set.Score(context.Background(), capitals())
	require.NoError(t, err)
	assert.Equal(t, int32(2), calls.Load())
	assert.Equal(t, []time.Duration{100 * time.Millisecond}, waits, "one backoff wait between the attempts")
	for i, want := range []float64{0.25, nan(), -1} {
		require.NoError(t, scores[i].Err)
		assertFloat(t, want, scores[i].Values[0])
	}
	assertFloat(t, 0.5, scores[0].Total)
	assertFloat(t, nan(), scores[1].Total, "the only function declined")
}

// requireScorerError checks that every trajectory of the batch failed with
// the judge's *ScorerError (the judge is function k) and returns it.
func requireScorerError(t *testing.T, scores []Scores, k, attempts int) *ScorerError {
	t.Helper()
	var first *ScorerError
	for i, s := range scores {
		var se *ScorerError
		require.True(t, errors.As(s.Err, &se), "trajectory %d: want a *ScorerError, got %v", i, s.Err)
		assert.Equal(t, "judge", se.Reward)
		assert.Equal(t, attempts, se.Attempts)
		assertFloat(t, nan(), s.Values[k])
		assertFloat(t, nan(), s.Total, "a reward_error rollout has no reward, never 0")
		if first == nil {
			first = se
		}
	}
	assert.Contains(t, first.Error(), `reward "judge": scorer `+first.URL)
	return first
}

func TestHTTPFailures(t *testing.T) {
	tests := []struct {
		name     string
		handler  http.HandlerFunc
		retries  int
		attempts int
		msg      string
	}{
		{"malformed JSON", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"rewards": [1, 0`)) },
			2, 1, "malformed answer"},
		{"not an object", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`<html>oops</html>`)) },
			2, 1, "malformed answer"},
		{"no rewards key", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"scores": [1, 0, 1]}`)) },
			2, 1, `no "rewards" list`},
		{"too few rewards", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"rewards": [1]}`)) },
			2, 1, "answer has 1 rewards for 3 trajectories"},
		{"too many rewards", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"rewards": [1, 2, 3, 4]}`)) },
			2, 1, "answer has 4 rewards for 3 trajectories"},
		{"a string reward", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"rewards": [1, "2", 3]}`)) },
			2, 1, "malformed answer"},
		{"4xx is not retried", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "no such route", http.StatusNotFound) },
			2, 1, "HTTP 404"},
		{"5xx until the retries run out", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "down", http.StatusBadGateway) },
			2, 3, "HTTP 502"},
		{"429 is retried", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "slow down", http.StatusTooManyRequests) },
			1, 2, "HTTP 429"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var calls atomic.Int32
			srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				tt.handler(w, r)
			}))
			set := compile(t, []Spec{judgeSpec(srv.URL, time.Second, tt.retries)}, Options{NewBackoff: instantBackoff(nil)})
			scores, err := set.Score(context.Background(), capitals())
			require.NoError(t, err, "a scorer failure fails the rollouts, not the step")
			se := requireScorerError(t, scores, 0, tt.attempts)
			assert.Contains(t, se.Error(), tt.msg)
			assert.Equal(t, int32(tt.attempts), calls.Load())
		})
	}
}

func TestHTTPServerNeverAnswers(t *testing.T) {
	var calls atomic.Int32
	release := make(chan struct{})
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(func() { close(release) }) // runs before srv.Close
	set := compile(t, []Spec{{Name: "env", Kind: KindEnv}, judgeSpec(srv.URL, 50*time.Millisecond, 1)},
		Options{NewBackoff: instantBackoff(nil)})
	batch := capitals()
	batch = append(batch, Trajectory{Failed: true})
	scores, err := set.Score(context.Background(), batch)
	require.NoError(t, err)
	se := requireScorerError(t, scores[:3], 1, 2)
	assert.Contains(t, se.Error(), "no answer within 50ms")
	assert.ErrorIs(t, se, context.DeadlineExceeded)
	assert.Equal(t, int32(2), calls.Load())
	assertFloat(t, 0.5, scores[0].Values[0], "other functions still report their values")
	assert.NoError(t, scores[3].Err, "a trajectory not sent is not failed by the scorer")
}

func TestHTTPConnectionRefusedIsRetried(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "http://" + ln.Addr().String() + "/score"
	require.NoError(t, ln.Close())
	set := compile(t, []Spec{judgeSpec(url, time.Second, 2)}, Options{NewBackoff: instantBackoff(nil)})
	scores, err := set.Score(context.Background(), capitals()[:1])
	require.NoError(t, err)
	se := requireScorerError(t, scores, 0, 3)
	assert.Contains(t, se.Error(), "connection refused")
}

func TestHTTPCanceledWhileWaiting(t *testing.T) {
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	ctx, cancel := context.WithCancel(context.Background())
	set := compile(t, []Spec{judgeSpec(srv.URL, time.Second, 5)}, Options{NewBackoff: instantBackoff(nil)})
	set.funcs[0].(*httpScorer).newBackoff = func(name string) *backoffT {
		b := instantBackoff(nil)(name)
		b.Sleep = func(ctx context.Context, _ time.Duration) error { cancel(); return ctx.Err() }
		return b
	}
	_, err := set.Score(ctx, capitals())
	assert.ErrorIs(t, err, context.Canceled, "the run is ending: no scores, the context's error")
}

func TestHTTPScorersRunConcurrently(t *testing.T) {
	// Each server waits until both have been called: sequential posts
	// would time out.
	both := make(chan struct{})
	var arrived atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if arrived.Add(1) == 2 {
			close(both)
		}
		select {
		case <-both:
		case <-r.Context().Done():
			return
		}
		_, _ = w.Write([]byte(`{"rewards": [1, 2, 3]}`))
	})
	a, b := serve(t, h), serve(t, h)
	set := compile(t, []Spec{
		{Name: "a", Kind: KindHTTP, URL: a.URL, Timeout: 10 * time.Second, Retries: ptr(0)},
		{Name: "b", Kind: KindHTTP, URL: b.URL, Timeout: 10 * time.Second, Retries: ptr(0), Weight: ptr(10.0)},
	}, Options{})
	scores, err := set.Score(context.Background(), capitals())
	require.NoError(t, err)
	for i, s := range scores {
		require.NoError(t, s.Err)
		assertFloat(t, 11*float64(i+1), s.Total)
	}
}

func TestParseResponse(t *testing.T) {
	vals, err := ParseResponse([]byte(`{"rewards": [0.5, null, -2e1], "extra": {"ignored": true}}`), 3)
	require.NoError(t, err)
	assertFloats(t, []float64{0.5, nan(), -20}, vals)
	_, err = ParseResponse([]byte(`{"rewards": null}`), 0)
	assert.ErrorContains(t, err, `no "rewards" list`)
	vals, err = ParseResponse([]byte(`{"rewards": []}`), 0)
	require.NoError(t, err)
	assert.Empty(t, vals)
}

func FuzzParseResponse(f *testing.F) {
	for _, seed := range []string{`{"rewards": [1, null]}`, `{"rewards": []}`, `{}`, `[1]`, `{"rewards": [1e999]}`, ``} {
		f.Add([]byte(seed), 2)
	}
	f.Fuzz(func(t *testing.T, raw []byte, n int) {
		if n < 0 || n > 1<<16 {
			return
		}
		vals, err := ParseResponse(raw, n)
		if err != nil {
			assert.Nil(t, vals)
			return
		}
		assert.Len(t, vals, n)
	})
}

func TestHTTPEnvRewardUsesTheSpecsAggregation(t *testing.T) {
	var got Request
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		assert.NoError(t, json.Unmarshal(tee(t, r), &got))
		_, _ = w.Write([]byte(`{"rewards": [0]}`))
	}))
	spec := judgeSpec(srv.URL, time.Second, 0)
	spec.Aggregation = "max"
	set := compile(t, []Spec{spec}, Options{Aggregation: grpo.RewardLast})
	_, err := set.Score(context.Background(), []Trajectory{{EnvRewards: []*float64{ptr(0.9), ptr(0.1), nil}}})
	require.NoError(t, err)
	require.Len(t, got.Trajectories, 1)
	assert.Equal(t, 0.9, got.Trajectories[0].EnvReward, "max, not the run's last (0.1)")
}
