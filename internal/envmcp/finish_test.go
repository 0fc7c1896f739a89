package envmcp_test

import (
	"context"
	"encoding/json"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envmcp"
	"github.com/ortrain/ortrain/internal/envtarget"
)

// The call that ends the episode says so in structuredContent, _meta and
// its text; what it says depends on the reward.
func TestFinishingResult(t *testing.T) {
	half, nan := 0.5, math.NaN()
	tests := []struct {
		name       string
		out        envtarget.ToolOutput
		text       string
		structured string // "" : none
		reward     string
	}{
		{"reward", envtarget.ToolOutput{Text: "won", Reward: &half, Finished: true},
			"won\n\n[episode finished: reward 0.5 — no more tool calls are needed]", `{"finished":true,"reward":0.5}`, `0.5`},
		{"no reward", envtarget.ToolOutput{Text: "bye", Finished: true},
			"bye\n\n[episode finished — no more tool calls are needed]", `{"finished":true,"reward":null}`, `null`},
		{"no text", envtarget.ToolOutput{Reward: &half, Finished: true},
			"[episode finished: reward 0.5 — no more tool calls are needed]", `{"finished":true,"reward":0.5}`, `0.5`},
		{"reward JSON cannot carry", envtarget.ToolOutput{Text: "x", Reward: &nan, Finished: true},
			"x\n\n[episode finished — no more tool calls are needed]", `{"finished":true,"reward":null}`, `null`},
		{"not finished", envtarget.ToolOutput{Text: "step", Reward: &half}, "step", "", `0.5`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sess := &stubSession{call: func(context.Context, string, json.RawMessage) (*envtarget.ToolOutput, error) {
				out := tt.out
				return &out, nil
			}}
			_, ep, c := attachStub(t, envmcp.Options{}, sess)
			res := c.callTool("echo", nil)
			assert.False(t, res.IsError)
			assert.Equal(t, tt.text, res.text(t))
			if tt.structured == "" {
				assert.Nil(t, res.StructuredContent)
			} else {
				assert.JSONEq(t, tt.structured, string(res.StructuredContent))
			}
			assert.JSONEq(t, tt.reward, string(res.Meta[envmcp.MetaReward]))
			assert.JSONEq(t, map[bool]string{true: "true", false: "false"}[tt.out.Finished], string(res.Meta[envmcp.MetaFinished]))
			assert.Equal(t, tt.out.Finished, ep.Finished())
			assert.Equal(t, tt.out.Text, ep.Calls()[0].Result, "the record keeps the env's own text")
		})
	}
}

// After the end no call reaches the env: each is an isError result naming
// the call that ended it, recorded with AfterFinish and counted; FinishedAt
// is when the finishing call returned.
func TestCallsAfterFinish(t *testing.T) {
	var forwarded atomic.Int32
	clock := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var mu sync.Mutex
	now := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		clock = clock.Add(time.Second)
		return clock
	}
	sess := &stubSession{call: func(_ context.Context, name string, _ json.RawMessage) (*envtarget.ToolOutput, error) {
		forwarded.Add(1)
		return &envtarget.ToolOutput{Text: name, Finished: name == "end"}, nil
	}}
	_, ep, c := attachStub(t, envmcp.Options{Now: now}, sess)
	_, ended := ep.FinishedAt()
	assert.False(t, ended)

	c.callTool("step", nil)
	c.callTool("end", nil)
	at, ended := ep.FinishedAt()
	require.True(t, ended)
	assert.Equal(t, ep.Calls()[1].End, at)

	for i := range 3 {
		res := c.callTool("step", nil)
		assert.True(t, res.IsError)
		assert.Equal(t, "the episode is over (it finished at tool call 2); end the episode", res.text(t))
		assert.Equal(t, i+1, ep.CallsAfterFinish())
	}
	assert.Equal(t, int32(2), forwarded.Load(), "calls after the end never reach the env")
	calls := ep.Calls()
	require.Len(t, calls, 5)
	for i, call := range calls {
		assert.Equal(t, i >= 2, call.AfterFinish, "call %d", i)
		assert.Equal(t, i >= 2, call.IsError, "call %d", i)
	}
	again, _ := ep.FinishedAt()
	assert.Equal(t, at, again, "later calls do not move the end")
}

// A call queued behind the one that ends the episode is refused too.
func TestCallQueuedBehindTheEnd(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var forwarded atomic.Int32
	sess := &stubSession{call: func(ctx context.Context, _ string, _ json.RawMessage) (*envtarget.ToolOutput, error) {
		if forwarded.Add(1) == 1 {
			close(entered)
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return &envtarget.ToolOutput{Text: "ok", Finished: true}, nil
	}}
	_, ep, c := attachStub(t, envmcp.Options{}, sess)
	first := make(chan toolResult, 1)
	go func() { first <- c.callTool("echo", nil) }()
	<-entered
	second := make(chan toolResult, 1)
	go func() { second <- c.callTool("echo", nil) }()
	// Let the second request reach the episode before the first returns.
	require.Eventually(t, func() bool { return sess.active.Load() == 1 }, 5*time.Second, time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	close(release)
	assert.False(t, (<-first).IsError)
	assert.True(t, (<-second).IsError)
	assert.Equal(t, int32(1), forwarded.Load())
	assert.Equal(t, 1, ep.CallsAfterFinish())
}

// Tools carry no annotations unless the server is told to give them; then
// tools/list shows them as given, per tool.
func TestToolAnnotations(t *testing.T) {
	closed := map[string]any{"readOnlyHint": false, "destructiveHint": false, "idempotentHint": false, "openWorldHint": false}
	tools := []envtarget.ToolSpec{{Name: "read"}, {Name: "write"}, {Name: "odd"}}
	tests := []struct {
		name     string
		annotate func(string) map[string]any
		want     map[string]string // tool → annotations JSON ("": absent)
	}{
		{"none by default", nil, map[string]string{"read": "", "write": "", "odd": ""}},
		{"every tool", envmcp.AnnotateAll(closed), map[string]string{
			"read":  `{"readOnlyHint":false,"destructiveHint":false,"idempotentHint":false,"openWorldHint":false}`,
			"write": `{"readOnlyHint":false,"destructiveHint":false,"idempotentHint":false,"openWorldHint":false}`,
			"odd":   `{"readOnlyHint":false,"destructiveHint":false,"idempotentHint":false,"openWorldHint":false}`,
		}},
		{"per tool", func(tool string) map[string]any {
			switch tool {
			case "read":
				return map[string]any{"readOnlyHint": true, "title": "Read"}
			case "odd":
				return map[string]any{"bad": make(chan int)} // does not encode: dropped
			}
			return nil
		}, map[string]string{"read": `{"readOnlyHint":true,"title":"Read"}`, "write": "", "odd": ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, base := serve(t, envmcp.Options{ToolAnnotations: tt.annotate})
			srv.Attach("r", "k", &stubSession{}, tools)
			c := newClient(t, base, "r", "k")
			c.initialize("2025-11-25")
			listed := c.listTools()
			require.Len(t, listed, len(tools))
			for _, tl := range listed {
				if want := tt.want[tl.Name]; want == "" {
					assert.Nil(t, tl.Annotations, tl.Name)
				} else {
					assert.JSONEq(t, want, string(tl.Annotations), tl.Name)
				}
			}
		})
	}

	t.Run("AnnotateAll copies its map", func(t *testing.T) {
		m := map[string]any{"readOnlyHint": true}
		f := envmcp.AnnotateAll(m)
		m["readOnlyHint"] = false
		assert.Equal(t, true, f("x")["readOnlyHint"])
		assert.Nil(t, envmcp.AnnotateAll(nil))
	})
}
