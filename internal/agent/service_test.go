package agent

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// answer is a URL agent that replies with status and body.
func answer(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

// stall is a URL agent that answers only when the client gives up.
func stall(w http.ResponseWriter, r *http.Request) {
	// The server notices a client that gave up only once the body is read.
	_, _ = io.Copy(io.Discard, r.Body)
	select {
	case <-r.Context().Done():
	case <-time.After(30 * time.Second):
	}
}

// refusedURL is a 127.0.0.1 address nothing listens on.
func refusedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return "http://" + addr + "/run"
}

func TestServiceRequest(t *testing.T) {
	t.Parallel()
	got := make(chan map[string]any, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		assert.Equal(t, http.MethodPost, r.Method)
		assert.Equal(t, "application/json", r.Header.Get("Content-Type"))
		var body map[string]any
		assert.NoError(t, json.NewDecoder(r.Body).Decode(&body))
		got <- body
		_, _ = io.WriteString(w, `{"reward": 0.5, "turns": 3}`)
	}))
	t.Cleanup(srv.Close)
	facts := testFacts()
	res := Run(context.Background(), Spec{URL: srv.URL + "/run", Timeout: 2 * time.Second}, facts)
	require.Equal(t, OutcomeOK, res.Outcome, "err: %v", res.Err)
	require.NotNil(t, res.Reward)
	assert.Equal(t, 0.5, *res.Reward)
	assert.Equal(t, 0, res.ExitCode)
	body := <-got
	assert.Equal(t, map[string]any{
		"rollout_id": facts.RolloutID,
		"base_url":   facts.BaseURL,
		// Anthropic's clients append /v1/messages themselves.
		"anthropic_base_url": "http://127.0.0.1:1",
		"api_key":            facts.APIKey,
		"model":              facts.Model,
		"mcp_url":            facts.MCPURL,
		"task":               map[string]any{"question": "2+2?", "id": 7.0},
	}, body)
}

func TestServiceOutcomes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		handler http.HandlerFunc
		url     func(t *testing.T) string // instead of a server
		timeout time.Duration
		ctx     func(t *testing.T) context.Context
		client  *http.Client
		outcome Outcome
		reward  *float64
	}{
		{name: "reward", handler: answer(200, `{"reward": -0.75}`), outcome: OutcomeOK, reward: ptr(-0.75)},
		{name: "null reward", handler: answer(200, `{"reward": null}`), outcome: OutcomeOK},
		{name: "no reward field", handler: answer(200, `{"done": true}`), outcome: OutcomeOK},
		{name: "201 counts as success", handler: answer(201, `{"reward": 1}`), outcome: OutcomeOK, reward: ptr(1)},
		{name: "server error", handler: answer(500, `{"error": "boom", "key": "`+testKey+`"}`), outcome: OutcomeAgentError},
		{name: "redirect is not followed", handler: func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://127.0.0.1:1/elsewhere", http.StatusTemporaryRedirect)
		}, outcome: OutcomeAgentError},
		{name: "connection refused", url: refusedURL, outcome: OutcomeAgentError},
		{name: "not JSON", handler: answer(200, `reward=1`), outcome: OutcomeBadOutput},
		{name: "empty body", handler: answer(200, ``), outcome: OutcomeBadOutput},
		{name: "JSON null", handler: answer(200, `null`), outcome: OutcomeBadOutput},
		{name: "JSON array", handler: answer(200, `[1]`), outcome: OutcomeBadOutput},
		{name: "reward is a string", handler: answer(200, `{"reward": "1"}`), outcome: OutcomeBadOutput},
		{name: "invalid UTF-8", handler: answer(200, "{\"reward\": 1, \"note\": \"\xff\"}"), outcome: OutcomeBadOutput},
		{name: "slow server", handler: stall, timeout: 300 * time.Millisecond, outcome: OutcomeTimeout},
		{name: "stalls mid-body", handler: func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			_, _ = io.WriteString(w, `{"rew`)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}, timeout: 300 * time.Millisecond, outcome: OutcomeTimeout},
		{name: "client's own timeout", handler: stall, client: &http.Client{Timeout: 300 * time.Millisecond}, outcome: OutcomeTimeout},
		{
			name: "caller cancels", handler: stall, outcome: OutcomeCanceled,
			ctx: func(t *testing.T) context.Context {
				ctx, cancel := context.WithCancel(context.Background())
				t.Cleanup(cancel)
				time.AfterFunc(300*time.Millisecond, cancel)
				return ctx
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var target string
			if tc.url != nil {
				target = tc.url(t)
			} else {
				srv := httptest.NewServer(tc.handler)
				t.Cleanup(srv.Close)
				target = srv.URL + "/run"
			}
			ctx := context.Background()
			if tc.ctx != nil {
				ctx = tc.ctx(t)
			}
			timeout := tc.timeout
			if timeout == 0 {
				timeout = 2 * time.Second
			}
			start := time.Now()
			res := Run(ctx, Spec{URL: target, Timeout: timeout, HTTPClient: tc.client}, testFacts())
			assert.Less(t, time.Since(start), timeout+slack)
			assert.Equal(t, tc.outcome, res.Outcome, "err: %v", res.Err)
			assert.Equal(t, tc.outcome.Failed(), res.Err != nil, "Err is set exactly for failures: %v", res.Err)
			if tc.reward == nil {
				assert.Nil(t, res.Reward)
			} else if assert.NotNil(t, res.Reward) {
				assert.Equal(t, *tc.reward, *res.Reward)
			}
			assert.NotContains(t, res.StdoutTail, testKey)
			if res.Err != nil {
				assert.NotContains(t, res.Err.Error(), testKey)
			}
		})
	}
}
