package envs_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

func TestRegistry(t *testing.T) {
	assert.Equal(t, []string{"echo", "guess", "ladder", "letters", "lockbox", "mcp-echo"}, envs.Names())
	list := envs.List()
	require.Len(t, list, 6)
	assert.Equal(t, envs.Info{Key: "echo", EnvName: "echoenvironment", Description: list[0].Description, Protocol: envs.ProtocolORS}, list[0])
	want := []struct {
		name     string
		protocol envs.Protocol
	}{{"echoenvironment", envs.ProtocolORS}, {"GuessEnvironment", envs.ProtocolOpenEnv}, {"ladder", envs.ProtocolORS}, {"letters", envs.ProtocolORS}, {"lockbox", envs.ProtocolORS}, {"EchoEnvironment", envs.ProtocolOpenEnv}}
	for i, info := range list {
		assert.NotEmpty(t, info.Description, info.Key)
		assert.Equal(t, want[i].name, info.EnvName, info.Key)
		assert.Equal(t, want[i].protocol, info.Protocol, info.Key)
		p, err := envs.ProtocolOf(strings.ToUpper(info.Key))
		require.NoError(t, err)
		assert.Equal(t, want[i].protocol, p)
		// Every built-in can be served over OpenEnv.
		oe, err := envs.NewOpenEnv(info.Key)
		require.NoError(t, err)
		assert.NotEmpty(t, oe.Name)
	}
	e, err := envs.New("ECHO")
	require.NoError(t, err)
	assert.Equal(t, "echoenvironment", e.Name)
	_, err = envs.New("nope")
	require.EqualError(t, err, `unknown built-in environment "nope" (available: echo, guess, ladder, letters, lockbox, mcp-echo)`)
	_, err = envs.New("guess")
	require.EqualError(t, err, `built-in environment "guess" speaks OpenEnv only; it cannot be served over ors (use protocol openenv)`)
	_, err = envs.ProtocolOf("nope")
	require.Error(t, err)
}

func TestLettersScore(t *testing.T) {
	tests := []struct {
		answer, target string
		want           float64
	}{
		{"", "a", 0},
		{"a", "a", 1},
		{"aaaa", "a", 1},
		{"aab", "a", 2.0 / 3},
		{"bbb", "a", 0},
		{"AaA", "a", 1.0 / 3},
		{"ééa", "é", 2.0 / 3},
		{"zz", "z", 1},
	}
	for _, tt := range tests {
		t.Run(tt.answer+"/"+tt.target, func(t *testing.T) {
			assert.InDelta(t, tt.want, envs.LettersScore(tt.answer, tt.target), 1e-12)
		})
	}
}

func serve(t *testing.T, key string) (*ors.Client, *orsserver.Server) {
	t.Helper()
	url, srv, stop, err := envs.ServeLocal(context.Background(), key, orsserver.Options{})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, stop(ctx))
	})
	c, err := ors.NewClient(url, ors.Options{})
	require.NoError(t, err)
	t.Cleanup(c.CloseIdleConnections)
	return c, srv
}

func TestLettersOverHTTP(t *testing.T) {
	ctx := context.Background()
	c, srv := serve(t, "letters")
	splits, err := c.Splits(ctx)
	require.NoError(t, err)
	assert.Equal(t, []ors.Split{{Name: "train", Type: "train"}, {Name: "validation", Type: "validation"}, {Name: "mixed", Type: "validation"}}, splits)

	for split, want := range map[string]struct {
		n       int
		targets string
	}{"train": {64, "a"}, "validation": {16, "a"}, "mixed": {26, "abcdefghijklmnopqrstuvwxyz"}} {
		tasks, err := c.Tasks(ctx, split)
		require.NoError(t, err)
		require.Len(t, tasks, want.n, split)
		seen := ""
		for _, task := range tasks {
			var spec struct{ ID, Target string }
			require.NoError(t, json.Unmarshal(task.Spec, &spec))
			if len(seen) == 0 || seen[len(seen)-1:] != spec.Target {
				seen += spec.Target
			}
		}
		assert.Equal(t, want.targets, seen, split)
	}
	task, err := c.Task(ctx, "train", 5)
	require.NoError(t, err)
	assert.Equal(t, `{"id":"letters-5","target":"a"}`, string(task.Spec))

	s, err := c.OpenSession(ctx, ors.SessionSpec{Split: "train", Index: 0})
	require.NoError(t, err)
	prompt, err := s.Prompt(ctx)
	require.NoError(t, err)
	assert.Equal(t, "Call the `submit` tool with an answer made only of the letter 'a'.", prompt[0].Text)
	tools, err := s.Tools(ctx)
	require.NoError(t, err)
	require.Len(t, tools, 1)
	assert.JSONEq(t, `{"properties":{"answer":{"description":"the answer: a string of characters","title":"Answer","type":"string"}},"required":["answer"],"title":"SubmitParams","type":"object"}`, string(tools[0].InputSchema))
	out, err := s.CallTool(ctx, "submit", json.RawMessage(`{"answer":"aaab"}`))
	require.NoError(t, err)
	assert.Equal(t, 0.75, *out.Reward)
	assert.True(t, out.Finished)
	out, err = s.CallTool(ctx, "submit", json.RawMessage(`{"answer":""}`))
	require.NoError(t, err)
	assert.Equal(t, 0.0, *out.Reward)
	assert.Equal(t, int64(1), srv.Stats().Live)
	require.NoError(t, s.Close(ctx))
	assert.Equal(t, int64(0), srv.Stats().Live)
}

func TestServeLocalStopTearsDownSessions(t *testing.T) {
	ctx := context.Background()
	url, srv, stop, err := envs.ServeLocal(ctx, "echo", orsserver.Options{})
	require.NoError(t, err)
	// A pooled keep-alive connection dies with the server; the retry dials.
	c, err := ors.NewClient(url, ors.Options{Sleep: func(context.Context, time.Duration) error { return nil }})
	require.NoError(t, err)
	for i := range 3 {
		_, err := c.OpenSession(ctx, ors.SessionSpec{Split: "train", Index: i})
		require.NoError(t, err)
	}
	assert.Equal(t, int64(3), srv.Stats().Live)
	require.NoError(t, stop(ctx))
	require.NoError(t, stop(ctx), "idempotent")
	assert.Equal(t, orsserver.Stats{Created: 3, Deleted: 3}, srv.Stats())
	_, err = c.NumTasks(ctx, "train")
	var ue *ors.UnreachableError
	require.ErrorAs(t, err, &ue)
}

func TestServeLocalStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	url, _, stop, err := envs.ServeLocal(ctx, "letters", orsserver.Options{})
	require.NoError(t, err)
	cancel()
	require.NoError(t, stop(context.Background()))
	c, err := ors.NewClient(url, ors.Options{RequestAttempts: 1})
	require.NoError(t, err)
	_, err = c.Splits(context.Background())
	require.Error(t, err)
}

func TestServeLocalUnknown(t *testing.T) {
	_, _, _, err := envs.ServeLocal(context.Background(), "nope", orsserver.Options{})
	require.ErrorContains(t, err, "available: echo, guess, ladder, letters, lockbox, mcp-echo")
}

// TestToolLatency: with ServeOptions.ToolLatency every tool call, shared
// (letters' submit) and task-scoped (echo's hint), waits that long and then
// answers as before; a call whose context ends first returns at once.
func TestToolLatency(t *testing.T) {
	const latency = 150 * time.Millisecond
	tests := []struct {
		key, tool, input string
		check            func(t *testing.T, out *ors.ToolOutput)
	}{
		{"letters", "submit", `{"answer":"aaab"}`, func(t *testing.T, out *ors.ToolOutput) {
			require.NotNil(t, out.Reward)
			assert.Equal(t, 0.75, *out.Reward)
			assert.True(t, out.Finished)
		}},
		{"echo", "hint", `{}`, func(t *testing.T, out *ors.ToolOutput) {
			require.NotEmpty(t, out.Blocks)
			assert.NotEmpty(t, out.Blocks[0].Text)
		}},
		{"lockbox", "open_envelope", `{}`, func(t *testing.T, out *ors.ToolOutput) {
			require.NotEmpty(t, out.Blocks)
			assert.Regexp(t, `^code: [0-9]$`, out.Blocks[0].Text)
			assert.Nil(t, out.Reward)
			assert.False(t, out.Finished)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.key+"/"+tt.tool, func(t *testing.T) {
			ctx := context.Background()
			served, err := envs.ServeLocalProtocol(ctx, tt.key, envs.ProtocolORS, envs.ServeOptions{ToolLatency: latency})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, served.Stop(context.Background())) })
			c, err := ors.NewClient(served.URL, ors.Options{RequestAttempts: 1})
			require.NoError(t, err)
			t.Cleanup(c.CloseIdleConnections)
			s, err := c.OpenSession(ctx, ors.SessionSpec{Split: "train", Index: 0})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close(context.Background()) })
			_, err = s.Prompt(ctx)
			require.NoError(t, err)

			start := time.Now()
			out, err := s.CallTool(ctx, tt.tool, json.RawMessage(tt.input))
			require.NoError(t, err)
			assert.GreaterOrEqual(t, time.Since(start), latency)
			tt.check(t, out)
		})
	}
}

// TestToolLatencyEndsWithContext: a call waiting out its latency stops when
// the client gives up, so the server shuts down at once.
func TestToolLatencyEndsWithContext(t *testing.T) {
	ctx := context.Background()
	served, err := envs.ServeLocalProtocol(ctx, "letters", "", envs.ServeOptions{ToolLatency: time.Hour})
	require.NoError(t, err)
	c, err := ors.NewClient(served.URL, ors.Options{RequestAttempts: 1})
	require.NoError(t, err)
	t.Cleanup(c.CloseIdleConnections)
	s, err := c.OpenSession(ctx, ors.SessionSpec{Split: "train", Index: 0})
	require.NoError(t, err)
	_, err = s.Prompt(ctx)
	require.NoError(t, err)
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = s.CallTool(cctx, "submit", json.RawMessage(`{"answer":"a"}`))
	require.Error(t, err)
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	defer scancel()
	require.NoError(t, served.Stop(sctx), "no handler is left sleeping")
}
