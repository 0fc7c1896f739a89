package envtarget_test

import (
	"context"
	"encoding/json"
	"net"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/envtarget"
	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

func resolve(t *testing.T, target string, env map[string]string) (envtarget.Env, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := envtarget.Resolve(ctx, target, envtarget.Options{Logger: zerolog.Nop(), Getenv: func(k string) string { return env[k] }})
	if err == nil {
		t.Cleanup(func() { require.NoError(t, e.Close(context.Background())) })
	}
	return e, err
}

// serveEcho serves the echo env on loopback and returns its URL and server.
func serveEcho(t *testing.T) (string, *orsserver.Server) {
	t.Helper()
	url, srv, stop, err := envs.ServeLocal(context.Background(), "echo", orsserver.Options{Logger: zerolog.Nop()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = stop(context.Background()) })
	return url, srv
}

func TestKindOf(t *testing.T) {
	for target, want := range map[string]envtarget.Kind{
		"http://127.0.0.1:8080":        envtarget.KindURL,
		"https://host/echoenvironment": envtarget.KindURL,
		"Eigent/SETA":                  envtarget.KindCatalog,
		"builtin:letters":              envtarget.KindBuiltin,
	} {
		assert.Equal(t, want, envtarget.KindOf(target), target)
	}
}

func TestResolveTargets(t *testing.T) {
	url, _ := serveEcho(t)
	tests := []struct {
		name, target string
		env          map[string]string
		wantName     string
		check        func(t *testing.T, err error)
	}{
		{name: "builtin", target: "builtin:echo", wantName: "echo"},
		{name: "url", target: url, wantName: url},
		{name: "catalog", target: "Owner/Env", env: map[string]string{"OPENREWARD_API_KEY": "k"}, wantName: "Owner/Env"},
		{name: "catalog without key", target: "Owner/Env", check: func(t *testing.T, err error) {
			var auth *ors.AuthError
			require.ErrorAs(t, err, &auth)
			assert.True(t, auth.MissingKey)
		}},
		{name: "unknown builtin", target: "builtin:nope", check: func(t *testing.T, err error) {
			var te *envtarget.TargetError
			require.ErrorAs(t, err, &te)
			assert.ErrorContains(t, err, "available: ")
		}},
		{name: "bad catalog name", target: "a/b/c", check: func(t *testing.T, err error) {
			var te *envtarget.TargetError
			require.ErrorAs(t, err, &te)
			assert.ErrorContains(t, err, "neither a URL")
		}},
		{name: "empty", target: "", check: func(t *testing.T, err error) {
			var te *envtarget.TargetError
			require.ErrorAs(t, err, &te)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := resolve(t, tt.target, tt.env)
			if tt.check != nil {
				require.Error(t, err)
				tt.check(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, envtarget.ORS, e.Protocol())
			assert.Equal(t, tt.wantName, e.Name())
		})
	}
}

// A builtin target's server lives until Close, not until the resolving
// context ends, and Close stops it.
func TestBuiltinServerOutlivesResolveContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	e, err := envtarget.Resolve(ctx, "builtin:echo", envtarget.Options{Logger: zerolog.Nop()})
	require.NoError(t, err)
	cancel()
	n, err := e.NumTasks(context.Background(), "train")
	require.NoError(t, err)
	assert.Equal(t, 4, n)
	require.NoError(t, e.Close(context.Background()))
	_, err = e.NumTasks(context.Background(), "train")
	var ue *envtarget.UnreachableError
	require.ErrorAs(t, err, &ue, "after Close the server is gone")
}

func TestSessionThroughTheNeutralInterface(t *testing.T) {
	url, srv := serveEcho(t)
	e, err := resolve(t, url, nil)
	require.NoError(t, err)
	ctx := context.Background()
	s, err := e.OpenSession(ctx, envtarget.TaskRef{Split: "train", Index: 1})
	require.NoError(t, err)
	prompt, err := s.Prompt(ctx)
	require.NoError(t, err)
	assert.Equal(t, "Call the `echo` tool with text='world' to win.", prompt)
	tools, err := s.Tools(ctx)
	require.NoError(t, err)
	var names []string
	for _, tl := range tools {
		names = append(names, tl.Name)
	}
	assert.ElementsMatch(t, []string{"echo", "hint"}, names, "task-scoped tools reach the session")

	out, err := s.CallTool(ctx, "echo", json.RawMessage(`{"text":"nope"}`))
	require.NoError(t, err)
	assert.Equal(t, "no match (got 'nope')", out.Text)
	require.NotNil(t, out.Reward)
	assert.Equal(t, 0.0, *out.Reward)
	assert.False(t, out.Finished)

	_, err = s.CallTool(ctx, "nosuchtool", json.RawMessage(`{}`))
	var te *envtarget.ToolError
	require.ErrorAs(t, err, &te, "a tool-level failure is for the model, not the infrastructure")
	assert.Equal(t, "nosuchtool", te.Tool)

	out, err = s.CallTool(ctx, "echo", json.RawMessage(`{"text":"world"}`))
	require.NoError(t, err)
	assert.True(t, out.Finished)
	assert.Equal(t, 1.0, *out.Reward)
	require.NoError(t, s.Close(ctx))
	st := srv.Stats()
	assert.Equal(t, int64(0), st.Live)
}

func TestUnreachableIsTyped(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	c, err := ors.NewClient("http://"+addr, ors.Options{RequestAttempts: 1, CreateRetries: 1, Sleep: func(context.Context, time.Duration) error { return nil }})
	require.NoError(t, err)
	e := envtarget.FromORSClient(c, "http://"+addr)
	_, err = e.OpenSession(context.Background(), envtarget.TaskRef{Split: "train"})
	var ue *envtarget.UnreachableError
	require.ErrorAs(t, err, &ue)
	var oue *ors.UnreachableError
	assert.ErrorAs(t, err, &oue, "the ORS cause stays in the chain")
}

func TestDescribe(t *testing.T) {
	e, err := resolve(t, "builtin:letters", nil)
	require.NoError(t, err)
	ctx := context.Background()
	tests := []struct {
		name    string
		q       envtarget.Query
		indices []int
		check   func(t *testing.T, err error)
	}{
		{name: "first n", q: envtarget.Query{Split: "train", NumTasks: 3}, indices: []int{0, 1, 2}},
		{name: "indices", q: envtarget.Query{Split: "mixed", Indices: []int{5, 0}}, indices: []int{5, 0}},
		{name: "all", q: envtarget.Query{Split: "validation"}, indices: []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}},
		{name: "bad split", q: envtarget.Query{Split: "nope"}, check: func(t *testing.T, err error) {
			var se *envtarget.SplitError
			require.ErrorAs(t, err, &se)
			assert.Equal(t, []string{"train", "validation", "mixed"}, se.Valid)
		}},
		{name: "index out of range", q: envtarget.Query{Split: "mixed", Indices: []int{26}}, check: func(t *testing.T, err error) {
			var ie *envtarget.IndexError
			require.ErrorAs(t, err, &ie)
			assert.Equal(t, envtarget.IndexError{Split: "mixed", Index: 26, N: 26}, *ie)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := e.Describe(ctx, tt.q)
			if tt.check != nil {
				tt.check(t, err)
				return
			}
			require.NoError(t, err)
			var got []int
			for _, task := range l.Tasks {
				got = append(got, task.Index)
				assert.Contains(t, string(task.Spec), `"target"`)
			}
			assert.Equal(t, tt.indices, got)
			assert.Nil(t, l.Tools)
		})
	}
}

func TestDescribeToolScopes(t *testing.T) {
	e, err := resolve(t, "builtin:echo", nil)
	require.NoError(t, err)
	l, err := e.Describe(context.Background(), envtarget.Query{Split: "train", NumTasks: 1, Tools: true})
	require.NoError(t, err)
	scopes := map[string]envtarget.ToolScope{}
	for _, tl := range l.Tools {
		scopes[tl.Name] = tl.Scope
	}
	assert.Equal(t, map[string]envtarget.ToolScope{"echo": envtarget.ScopeShared, "hint": envtarget.ScopeTask}, scopes)
}

// A URL whose env path the server does not serve names what it serves.
func TestDescribeUnknownEnvPath(t *testing.T) {
	url, _ := serveEcho(t)
	e, err := resolve(t, url+"/nosuchenv", nil)
	require.NoError(t, err)
	_, err = e.Describe(context.Background(), envtarget.Query{Split: "train"})
	var nf *ors.EnvNotFoundError
	require.ErrorAs(t, err, &nf)
	assert.Equal(t, []string{envs.EchoEnvName}, nf.Served)
}

func TestSelectIndices(t *testing.T) {
	got, err := envtarget.SelectIndices("train", 5, nil, 0)
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1, 2, 3, 4}, got)
	got, err = envtarget.SelectIndices("train", 5, nil, 2)
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, got)
	got, err = envtarget.SelectIndices("train", 5, []int{4, 1}, 0)
	require.NoError(t, err)
	assert.Equal(t, []int{4, 1}, got)
	_, err = envtarget.SelectIndices("train", 5, []int{5}, 0)
	assert.EqualError(t, err, `task index 5 is out of range: split "train" has 5 tasks (0..4)`)
	_, err = envtarget.SelectIndices("train", 0, nil, 0)
	assert.EqualError(t, err, `split "train" has no tasks`)
}

// NumTasks of a split the env does not have is a *SplitError listing the
// valid splits (the run and eval paths count tasks without Describe).
func TestNumTasksUnknownSplitIsTyped(t *testing.T) {
	url, _ := serveEcho(t)
	for _, target := range []string{"builtin:letters", url} {
		t.Run(target, func(t *testing.T) {
			e, err := resolve(t, target, nil)
			require.NoError(t, err)
			_, err = e.NumTasks(context.Background(), "bogus")
			var se *envtarget.SplitError
			require.ErrorAs(t, err, &se)
			assert.Equal(t, "bogus", se.Split)
			assert.NotEmpty(t, se.Valid)
			assert.Contains(t, se.Valid, "train")

			n, err := e.NumTasks(context.Background(), "train")
			require.NoError(t, err)
			assert.Positive(t, n)
		})
	}
}

// TestBuiltinToolLatency: builtin:NAME?tool_latency=D (or Options.ToolLatency)
// slows every tool call of the served env, over either protocol.
func TestBuiltinToolLatency(t *testing.T) {
	const latency = 120 * time.Millisecond
	tests := []struct {
		name, target, protocol, tool, input string
		configured                          time.Duration
	}{
		{"query, ors", "builtin:letters?tool_latency=120ms", "", "submit", `{"answer":"a"}`, 0},
		{"query, openenv", "builtin:letters?tool_latency=120ms", "openenv", "submit", `{"answer":"a"}`, 0},
		{"config, ors", "builtin:letters", "", "submit", `{"answer":"a"}`, latency},
		{"config, openenv-native", "builtin:mcp-echo", "", "echo_message", `{"message":"hi"}`, latency},
		{"both, equal", "builtin:letters?tool_latency=120ms", "", "submit", `{"answer":"a"}`, latency},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			e, err := envtarget.Resolve(ctx, tt.target, envtarget.Options{Logger: zerolog.Nop(), Protocol: tt.protocol, ToolLatency: tt.configured})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, e.Close(context.Background())) })
			s, err := e.OpenSession(ctx, envtarget.TaskRef{Split: "train", Index: 0})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close(context.Background()) })
			start := time.Now()
			out, err := s.CallTool(ctx, tt.tool, json.RawMessage(tt.input))
			require.NoError(t, err)
			assert.GreaterOrEqual(t, time.Since(start), latency)
			assert.NotEmpty(t, out.Text)
		})
	}
}

func TestBuiltinToolLatencyErrors(t *testing.T) {
	url, _ := serveEcho(t)
	tests := []struct {
		name, target string
		configured   time.Duration
		want         string
	}{
		{"not a duration", "builtin:letters?tool_latency=soon", 0, `tool_latency "soon" is not a duration`},
		{"negative", "builtin:letters?tool_latency=-1s", 0, "is not a duration >= 0"},
		{"unknown parameter", "builtin:letters?latency=1s", 0, `unknown parameter "latency"`},
		{"set twice", "builtin:letters?tool_latency=1s", 2 * time.Second, "set it once"},
		{"not a builtin", url, time.Second, "built-in envs only"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := envtarget.Resolve(context.Background(), tt.target, envtarget.Options{Logger: zerolog.Nop(), ToolLatency: tt.configured})
			var te *envtarget.TargetError
			require.ErrorAs(t, err, &te)
			assert.ErrorContains(t, err, tt.want)
		})
	}
}
