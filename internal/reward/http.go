package reward

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/backoff"
	"github.com/ortrain/ortrain/internal/grpo"
)

// Request is the JSON body POSTed to an http scorer: one batch.
//
//	{"reward": "judge", "trajectories": [{"env": "letters", "task": {...},
//	  "prompt": "...", "messages": [{"role": "user", "content": "..."},
//	  {"role": "assistant", "content": "...", "tool_calls": [{"name": "...",
//	  "arguments": {...}}]}, {"role": "tool", "name": "...", "content": "..."}],
//	  "completion": "final assistant text", "env_rewards": [0.5, null],
//	  "env_reward": 0.5, "finished": true, "outcome": "done", "truncated": false,
//	  "num_turns": 2, "num_tool_calls": 1, "tool_failures": 0,
//	  "completion_tokens": 37, "metadata": {...}}]}
type Request struct {
	Reward       string        `json:"reward"`
	Trajectories []RequestItem `json:"trajectories"`
}

// RequestItem is one trajectory as a scorer sees it.
type RequestItem struct {
	Env              string         `json:"env,omitempty"`
	Task             map[string]any `json:"task"`
	Prompt           string         `json:"prompt"`
	Messages         []Message      `json:"messages"`
	Completion       string         `json:"completion"`
	EnvRewards       []*float64     `json:"env_rewards"`
	EnvReward        float64        `json:"env_reward"`
	Finished         bool           `json:"finished"`
	Outcome          string         `json:"outcome"`
	Truncated        bool           `json:"truncated"`
	NumTurns         int            `json:"num_turns"`
	NumToolCalls     int            `json:"num_tool_calls"`
	ToolFailures     int            `json:"tool_failures"`
	CompletionTokens int            `json:"completion_tokens"`
	Metadata         map[string]any `json:"metadata"`
}

// Message is one chat message, OpenAI-style.
type Message struct {
	Role      string     `json:"role"`
	Content   string     `json:"content"`
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	Name      string     `json:"name,omitempty"`
}

// Response is what a scorer answers: one reward per trajectory, in order;
// null declines (NaN, left out of the weighted sum). Other keys are
// ignored.
type Response struct {
	Rewards []*float64 `json:"rewards"`
}

// NewRequestItem is t as an http scorer receives it; agg makes env_reward.
func NewRequestItem(t *Trajectory, agg grpo.RewardAggregation) RequestItem {
	msgs := make([]Message, 0, len(t.Turns)+1)
	msgs = append(msgs, Message{Role: "user", Content: t.Prompt})
	for _, turn := range t.Turns {
		m := Message{Role: turn.Role, Content: turn.Text, ToolCalls: turn.ToolCalls}
		if turn.Role == "tool" {
			m.Name = turn.Tool
		}
		msgs = append(msgs, m)
	}
	envRewards, task, meta := t.EnvRewards, t.Task, t.Metadata
	if envRewards == nil { // JSON [] and {}, never null: scorers index them
		envRewards = []*float64{}
	}
	if task == nil {
		task = map[string]any{}
	}
	if meta == nil {
		meta = map[string]any{}
	}
	return RequestItem{
		Env: t.Env, Task: task, Prompt: t.Prompt, Messages: msgs, Completion: t.Text(),
		EnvRewards: envRewards, EnvReward: agg.Aggregate(t.EnvRewards), Finished: t.Finished,
		Outcome: t.Outcome, Truncated: t.Truncated, NumTurns: t.NumTurns(), NumToolCalls: t.NumToolCalls,
		ToolFailures: t.ToolFailures, CompletionTokens: t.CompletionTokens, Metadata: meta,
	}
}

// ScorerError is an http scorer that failed a batch: every trajectory of
// the batch carries it in Scores.Err.
type ScorerError struct {
	Reward   string
	URL      string
	Attempts int
	Err      error
}

func (e *ScorerError) Error() string {
	return fmt.Sprintf("reward %q: scorer %s failed after %d attempt(s): %v", e.Reward, e.URL, e.Attempts, e.Err)
}

func (e *ScorerError) Unwrap() error { return e.Err }

// maxResponseBytes bounds a scorer's answer (a few numbers per rollout).
const maxResponseBytes = 16 << 20

type httpScorer struct {
	spec       Spec
	agg        grpo.RewardAggregation
	client     *http.Client
	newBackoff func(name string) *backoff.Backoff
}

func defaultBackoff(logger zerolog.Logger) func(string) *backoff.Backoff {
	return func(name string) *backoff.Backoff {
		b := backoff.New(250*time.Millisecond, 5*time.Second)
		b.Jitter, b.Name, b.Logger, b.LogOver = 0.2, name, logger, time.Nanosecond
		return b
	}
}

// retryable is an attempt's failure that another attempt may fix.
type retryable struct{ error }

func (r retryable) Unwrap() error { return r.error }

func (h *httpScorer) score(ctx context.Context, batch []*Trajectory) ([]float64, []error, error) {
	items := make([]RequestItem, len(batch))
	for i, t := range batch {
		items[i] = NewRequestItem(t, h.agg)
	}
	body, err := json.Marshal(Request{Reward: h.spec.Name, Trajectories: items})
	vals, attempts := []float64(nil), 0
	if err == nil {
		vals, attempts, err = h.post(ctx, body, len(batch))
	}
	if err != nil && ctx.Err() != nil {
		return nil, nil, ctx.Err()
	}
	errs := make([]error, len(batch))
	if err != nil {
		serr := &ScorerError{Reward: h.spec.Name, URL: h.spec.URL, Attempts: attempts, Err: err}
		vals = make([]float64, len(batch))
		for i := range batch {
			vals[i], errs[i] = math.NaN(), serr
		}
	}
	return vals, errs, nil
}

// post sends body until an attempt succeeds, fails for good, or the
// retries run out; it returns the values and the attempts made.
func (h *httpScorer) post(ctx context.Context, body []byte, n int) ([]float64, int, error) {
	b := h.newBackoff("reward " + h.spec.Name)
	for attempt := 1; ; attempt++ {
		vals, err := h.attempt(ctx, body, n)
		var again retryable
		if err == nil || !errors.As(err, &again) || attempt > h.spec.RetriesValue() || ctx.Err() != nil {
			return vals, attempt, err
		}
		if werr := b.Wait(ctx); werr != nil {
			return nil, attempt, werr
		}
	}
}

func (h *httpScorer) attempt(ctx context.Context, body []byte, n int) ([]float64, error) {
	timeout := h.spec.TimeoutValue()
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, h.spec.URL, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		if actx.Err() != nil && ctx.Err() == nil {
			return nil, retryable{fmt.Errorf("no answer within %s: %w", timeout, err)}
		}
		return nil, retryable{fmt.Errorf("post: %w", err)}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return nil, retryable{fmt.Errorf("read answer (HTTP %d): %w", resp.StatusCode, err)}
	}
	if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
		return nil, retryable{fmt.Errorf("HTTP %d: %s", resp.StatusCode, snippet(raw))}
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %d: %s", resp.StatusCode, snippet(raw))
	}
	if len(raw) > maxResponseBytes {
		return nil, fmt.Errorf("answer larger than %d bytes", maxResponseBytes)
	}
	return ParseResponse(raw, n)
}

// ParseResponse reads a scorer's answer for a batch of n: {"rewards":
// [...]} with exactly n numbers or nulls (null → NaN).
func ParseResponse(raw []byte, n int) ([]float64, error) {
	var resp struct {
		Rewards *[]*float64 `json:"rewards"`
	}
	if err := json.Unmarshal(raw, &resp); err != nil {
		return nil, fmt.Errorf("malformed answer (want {\"rewards\": [...]}): %w: %s", err, snippet(raw))
	}
	if resp.Rewards == nil {
		return nil, fmt.Errorf("answer has no \"rewards\" list: %s", snippet(raw))
	}
	if len(*resp.Rewards) != n {
		return nil, fmt.Errorf("answer has %d rewards for %d trajectories", len(*resp.Rewards), n)
	}
	vals := make([]float64, n)
	for i, r := range *resp.Rewards {
		vals[i] = math.NaN()
		if r != nil {
			vals[i] = *r
		}
	}
	return vals, nil
}

// snippet is the start of a body, for error messages.
func snippet(raw []byte) string {
	const max = 200
	if len(raw) > max {
		return fmt.Sprintf("%q...", raw[:max])
	}
	return fmt.Sprintf("%q", raw)
}
