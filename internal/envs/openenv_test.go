package envs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/openenv"
	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
)

func kw(t *testing.T, v map[string]any) map[string]json.RawMessage {
	t.Helper()
	out := map[string]json.RawMessage{}
	for k, x := range v {
		b, err := json.Marshal(x)
		require.NoError(t, err)
		out[k] = b
	}
	return out
}

var uuid4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// assertState compares a state with want, in which "episode_id":"<fresh>"
// stands for a fresh uuid4; it returns the state's episode id.
func assertState(t *testing.T, want string, got json.RawMessage, msg ...any) string {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(got, &m))
	id, _ := m["episode_id"].(string)
	if strings.Contains(want, `"<fresh>"`) {
		assert.Regexp(t, uuid4, id, "reset without an episode_id assigns a fresh uuid4")
		want = strings.Replace(want, `"<fresh>"`, strconv.Quote(id), 1)
	}
	assert.JSONEq(t, want, string(got), msg...)
	return id
}

func newGuess(t *testing.T) openenvserver.GymInstance {
	t.Helper()
	inst, err := envs.Guess().New(context.Background())
	require.NoError(t, err)
	return inst.(openenvserver.GymInstance)
}

func step(t *testing.T, g openenvserver.GymInstance, guess int) (map[string]any, float64, bool) {
	t.Helper()
	obs, err := g.Step(context.Background(), json.RawMessage(fmt.Sprintf(`{"guess":%d}`, guess)))
	require.NoError(t, err)
	b, err := json.Marshal(obs.Fields)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	require.NotNil(t, obs.Reward)
	return m, *obs.Reward, obs.Done
}

func TestGuessGame(t *testing.T) {
	ctx := context.Background()
	type move struct {
		guess  int
		hint   string
		msg    string
		left   int
		reward float64
		done   bool
	}
	tests := []struct {
		name  string
		reset map[string]any
		moves []move
		state string
	}{
		{"solved", map[string]any{"target": 42, "episode_id": "g-1"}, []move{
			{50, "lower", "Go lower.", 5, 0, false},
			{30, "higher", "Go higher.", 4, 0, false},
			{42, "correct", "You got it!", 3, 1, true},
		}, `{"episode_id":"g-1","step_count":3,"max_guesses":6,"guesses":[50,30,42],"solved":true}`},
		{"out of guesses", map[string]any{"target": 7, "max_guesses": 2}, []move{
			{1, "higher", "Go higher.", 1, 0, false},
			{100, "lower", "Go lower. Out of guesses; the number was 7.", 0, 0, true},
		}, `{"episode_id":"<fresh>","step_count":2,"max_guesses":2,"guesses":[1,100],"solved":false}`},
		{"right on the last guess", map[string]any{"target": 1, "max_guesses": 1}, []move{
			{1, "correct", "You got it!", 0, 1, true},
		}, `{"episode_id":"<fresh>","step_count":1,"max_guesses":1,"guesses":[1],"solved":true}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newGuess(t)
			_, err := g.Step(ctx, json.RawMessage(`{"guess":5}`))
			require.EqualError(t, err, "call reset before step")
			obs, err := g.Reset(ctx, kw(t, tt.reset))
			require.NoError(t, err)
			b, _ := json.Marshal(obs.Fields)
			maxGuesses := 6
			if m, ok := tt.reset["max_guesses"]; ok {
				maxGuesses = m.(int)
			}
			assert.JSONEq(t, fmt.Sprintf(`{"hint":"start","guesses_left":%d,"last_guess":null,"message":"Guess a number between 1 and 100."}`, maxGuesses), string(b))
			assert.Equal(t, 0.0, *obs.Reward)
			assert.False(t, obs.Done)
			for _, m := range tt.moves {
				o, r, done := step(t, g, m.guess)
				assert.Equal(t, map[string]any{"hint": m.hint, "guesses_left": float64(m.left), "last_guess": float64(m.guess), "message": m.msg}, o)
				assert.Equal(t, m.reward, r)
				assert.Equal(t, m.done, done)
			}
			_, err = g.Step(ctx, json.RawMessage(`{"guess":5}`))
			require.EqualError(t, err, "episode is over; call reset")
			st, err := g.State(ctx)
			require.NoError(t, err)
			first := assertState(t, tt.state, st, "the state never holds the target")
			// Reset starts over, as a new episode.
			_, err = g.Reset(ctx, kw(t, map[string]any{"target": 3}))
			require.NoError(t, err)
			st, _ = g.State(ctx)
			again := assertState(t, `{"episode_id":"<fresh>","step_count":0,"max_guesses":6,"guesses":[],"solved":false}`, st)
			assert.NotEqual(t, first, again)
		})
	}
}

func TestGuessResetErrors(t *testing.T) {
	for _, tt := range []struct {
		kwargs map[string]any
		err    string
	}{
		{map[string]any{"target": 0}, "target must be between 1 and 100, got 0"},
		{map[string]any{"target": 101}, "target must be between 1 and 100, got 101"},
		{map[string]any{"target": "x"}, "target must be an integer"},
		{map[string]any{"max_guesses": 0}, "max_guesses must be at least 1, got 0"},
		{map[string]any{"seed": "x"}, "seed must be an integer"},
	} {
		_, err := newGuess(t).Reset(context.Background(), kw(t, tt.kwargs))
		require.EqualError(t, err, tt.err)
	}
}

// solve plays binary search and returns the number found.
func solve(t *testing.T, g openenvserver.GymInstance) int {
	t.Helper()
	lo, hi := 1, 100
	for {
		mid := (lo + hi) / 2
		o, r, done := step(t, g, mid)
		switch o["hint"] {
		case "correct":
			require.Equal(t, 1.0, r)
			return mid
		case "lower":
			hi = mid - 1
		default:
			lo = mid + 1
		}
		require.False(t, done, "binary search needs at most 7 guesses")
	}
}

func TestGuessTargets(t *testing.T) {
	ctx := context.Background()
	seen := map[int]bool{}
	for seed := int64(-3); seed < 40; seed++ {
		target := envs.GuessTarget(seed)
		require.GreaterOrEqual(t, target, 1)
		require.LessOrEqual(t, target, 100)
		assert.Equal(t, target, envs.GuessTarget(seed), "deterministic")
		seen[target] = true
		if seed < 3 {
			g := newGuess(t)
			_, err := g.Reset(ctx, kw(t, map[string]any{"seed": seed, "max_guesses": 7}))
			require.NoError(t, err)
			assert.Equal(t, target, solve(t, g), "seed %d", seed)
		}
	}
	assert.Greater(t, len(seen), 25, "seeds spread over 1..100")
	// Without a seed the target is random, and still in range.
	g := newGuess(t)
	_, err := g.Reset(ctx, kw(t, map[string]any{"max_guesses": 7}))
	require.NoError(t, err)
	n := solve(t, g)
	assert.True(t, n >= 1 && n <= 100)
}

func serveOpenEnv(t *testing.T, key string, protocol envs.Protocol) (*openenv.Client, *envs.Served) {
	t.Helper()
	served, err := envs.ServeLocalProtocol(context.Background(), key, protocol, envs.ServeOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, served.Stop(ctx))
	})
	require.Equal(t, envs.ProtocolOpenEnv, served.Protocol)
	c, err := openenv.NewClient(served.URL, openenv.Options{ReplyTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(c.CloseIdleConnections)
	return c, served
}

func TestGuessOverTheWire(t *testing.T) {
	ctx := context.Background()
	c, _ := serveOpenEnv(t, "guess", "")
	s, _, err := c.Start(ctx, map[string]any{"target": 9})
	require.NoError(t, err)
	defer s.Close(ctx)
	for _, bad := range []string{`{"guess":101}`, `{"guess":5,"hint":"x"}`, `{}`, `{"guess":"five"}`} {
		_, err := s.Step(ctx, json.RawMessage(bad))
		var se *openenv.ServerError
		require.ErrorAs(t, err, &se, bad)
		assert.Equal(t, openenv.CodeValidationError, se.Code, bad)
	}
	r, err := s.Step(ctx, json.RawMessage(`{"guess":"9","metadata":{"why":"lax ints, metadata allowed"}}`))
	require.NoError(t, err)
	assert.True(t, r.Done)
	st, err := s.State(ctx)
	require.NoError(t, err)
	assertState(t, `{"episode_id":"<fresh>","step_count":1,"max_guesses":6,"guesses":[9],"solved":true}`, st, "rejected actions are not steps")
}

func TestMCPEcho(t *testing.T) {
	ctx := context.Background()
	c, _ := serveOpenEnv(t, "mcp-echo", envs.ProtocolOpenEnv)
	s, obs, err := c.Start(ctx, map[string]any{"episode_id": "x", "ignored": true})
	require.NoError(t, err)
	defer s.Close(ctx)
	assert.JSONEq(t, `{}`, string(obs.Observation))
	assert.Equal(t, 0.0, *obs.Reward)
	assert.False(t, obs.Done)
	tools, err := s.ListTools(ctx)
	require.NoError(t, err)
	require.Len(t, tools, 2)
	assert.Equal(t, []string{"echo_message", "echo_with_length"}, []string{tools[0].Name, tools[1].Name})
	tests := []struct {
		tool, args string
		data       string
		failure    *openenv.ToolFailure
	}{
		{"echo_message", `{"message":"hi"}`, `"hi"`, nil},
		{"echo_message", `{"message":""}`, `""`, nil},
		{"echo_with_length", `{"message":"日本語"}`, `{"message":"日本語","length":3}`, nil},
		{"echo_with_length", `{}`, "", &openenv.ToolFailure{Type: "invalid_args", Message: "Invalid arguments for tool 'echo_with_length': message: Missing required argument"}},
		{"echo_message", `{"message":5}`, "", &openenv.ToolFailure{Type: "invalid_args", Message: "Invalid arguments for tool 'echo_message': message: Input should be a valid string"}},
		{"echo_message", `{"message":"a","b":1}`, "", &openenv.ToolFailure{Type: "invalid_args", Message: "Invalid arguments for tool 'echo_message': b: Unexpected keyword argument"}},
		{"reverse", `{"message":"a"}`, "", &openenv.ToolFailure{Type: "tool_not_found", Message: "Unknown tool: 'reverse'"}},
	}
	for _, tt := range tests {
		call, err := s.CallTool(ctx, tt.tool, json.RawMessage(tt.args))
		require.NoError(t, err)
		assert.Nil(t, call.Reward)
		assert.False(t, call.Done)
		if tt.failure != nil {
			assert.Equal(t, tt.failure, call.Error, tt.args)
			assert.Nil(t, call.Result)
			continue
		}
		require.Nil(t, call.Error)
		assert.JSONEq(t, tt.data, string(call.Result.Data))
	}
	st, err := s.State(ctx)
	require.NoError(t, err)
	assert.JSONEq(t, `{"episode_id":"x","step_count":8}`, string(st), "every step counts, list_tools and failures included")
	_, err = s.Reset(ctx, nil)
	require.NoError(t, err)
	st, err = s.State(ctx)
	require.NoError(t, err)
	assertState(t, `{"episode_id":"<fresh>","step_count":0}`, st)
}

// TestORSEnvsOverOpenEnv: letters and echo, written for ORS, served as
// MCP envs.
func TestORSEnvsOverOpenEnv(t *testing.T) {
	ctx := context.Background()
	c, served := serveOpenEnv(t, "letters", envs.ProtocolOpenEnv)
	info, err := openenv.Probe(ctx, served.URL, openenv.Options{})
	require.NoError(t, err)
	assert.True(t, info.MCP)

	s, obs, err := c.Start(ctx, map[string]any{"seed": 67})
	require.NoError(t, err)
	assert.JSONEq(t, `{"prompt":"Call the `+"`submit`"+` tool with an answer made only of the letter 'a'.","split":"train","index":3}`, string(obs.Observation), "seed 67 is index 67 mod 64")
	tools, err := s.ListTools(ctx)
	require.NoError(t, err)
	require.Len(t, tools, 1)
	assert.Equal(t, "submit", tools[0].Name)
	assert.JSONEq(t, `{"properties":{"answer":{"description":"the answer: a string of characters","title":"Answer","type":"string"}},"required":["answer"],"title":"SubmitParams","type":"object"}`, string(tools[0].InputSchema))
	call, err := s.CallTool(ctx, "submit", json.RawMessage(`{"answer":"aaab"}`))
	require.NoError(t, err)
	assert.Equal(t, 0.75, *call.Reward)
	assert.True(t, call.Done)
	assert.Equal(t, "score 0.750: 4 characters, target 'a'", call.Text())
	call, err = s.CallTool(ctx, "submit", json.RawMessage(`{}`))
	require.NoError(t, err)
	assert.Equal(t, openenv.ToolInvalidArgs, call.Error.Type)
	assert.Contains(t, call.Error.Message, "Field required")

	obs, err = s.Reset(ctx, map[string]any{"split": "mixed", "index": 2, "episode_id": "m"})
	require.NoError(t, err)
	assert.Contains(t, string(obs.Observation), "letter 'c'")
	st, err := s.State(ctx)
	require.NoError(t, err)
	assert.JSONEq(t, `{"episode_id":"m","step_count":0,"split":"mixed","index":2}`, string(st))
	obs, err = s.Reset(ctx, map[string]any{"task_spec": map[string]string{"id": "custom", "target": "z"}})
	require.NoError(t, err)
	assert.Contains(t, string(obs.Observation), "letter 'z'")
	for _, bad := range []map[string]any{{"split": "nope"}, {"index": 64}, {"index": -1}, {"task_spec": "x"}, {"task_spec": map[string]string{"target": "zz"}}} {
		_, err := s.Reset(ctx, bad)
		var se *openenv.ServerError
		require.ErrorAs(t, err, &se, "%v", bad)
		assert.Equal(t, openenv.CodeExecutionError, se.Code)
	}
	require.NoError(t, s.Close(ctx))

	// echo: the task-scoped hint tool appears once a task is chosen.
	c, _ = serveOpenEnv(t, "echo", envs.ProtocolOpenEnv)
	s, err = c.Open(ctx)
	require.NoError(t, err)
	defer s.Close(ctx)
	tools, err = s.ListTools(ctx)
	require.NoError(t, err)
	assert.Len(t, tools, 1, "before reset: shared tools only")
	// A tool call before any reset opens the default task (train, 0) first.
	call, err = s.CallTool(ctx, "echo", json.RawMessage(`{"text":"x"}`))
	require.NoError(t, err)
	require.Nil(t, call.Error)
	assert.Equal(t, "no match (got 'x')", call.Text())
	st, err = s.State(ctx)
	require.NoError(t, err)
	assertState(t, `{"episode_id":"<fresh>","step_count":1,"split":"train","index":0}`, st)
	_, err = s.Reset(ctx, map[string]any{"index": 1})
	require.NoError(t, err)
	tools, err = s.ListTools(ctx)
	require.NoError(t, err)
	require.Len(t, tools, 2)
	assert.Equal(t, "hint", tools[1].Name)
	call, err = s.CallTool(ctx, "echo", json.RawMessage(`{"text":"hello"}`))
	require.NoError(t, err)
	assert.Equal(t, 0.0, *call.Reward)
	assert.False(t, call.Done)
	call, err = s.CallTool(ctx, "echo", json.RawMessage(`{"text":"world"}`))
	require.NoError(t, err)
	assert.Equal(t, 1.0, *call.Reward)
	assert.True(t, call.Done)
	call, err = s.CallTool(ctx, "hint", nil)
	require.NoError(t, err)
	assert.Equal(t, "try echo(text=...)", call.Text())
	call, err = s.CallTool(ctx, "nope", nil)
	require.NoError(t, err)
	assert.Equal(t, openenv.ToolNotFound, call.Error.Type)
}

func TestServeLocalProtocol(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		key      string
		protocol envs.Protocol
		want     envs.Protocol
		err      string
	}{
		{"echo", "", envs.ProtocolORS, ""},
		{"letters", envs.ProtocolORS, envs.ProtocolORS, ""},
		{"letters", envs.ProtocolOpenEnv, envs.ProtocolOpenEnv, ""},
		{"lockbox", "", envs.ProtocolORS, ""},
		{"lockbox", envs.ProtocolOpenEnv, envs.ProtocolOpenEnv, ""},
		{"guess", "", envs.ProtocolOpenEnv, ""},
		{"mcp-echo", envs.ProtocolOpenEnv, envs.ProtocolOpenEnv, ""},
		{"guess", envs.ProtocolORS, "", "speaks OpenEnv only"},
		{"echo", "grpc", "", `unknown protocol "grpc" (want ors or openenv)`},
		{"nope", "", "", "unknown built-in environment"},
	} {
		served, err := envs.ServeLocalProtocol(ctx, tt.key, tt.protocol, envs.ServeOptions{})
		if tt.err != "" {
			require.ErrorContains(t, err, tt.err, tt.key)
			continue
		}
		require.NoError(t, err, tt.key)
		assert.Equal(t, tt.want, served.Protocol)
		assert.Equal(t, tt.want == envs.ProtocolORS, served.ORS != nil)
		assert.Equal(t, tt.want == envs.ProtocolOpenEnv, served.OpenEnv != nil)
		_, perr := openenv.Probe(ctx, served.URL, openenv.Options{})
		if tt.want == envs.ProtocolOpenEnv {
			require.NoError(t, perr)
		} else {
			var ne *openenv.NotOpenEnvError
			require.ErrorAs(t, perr, &ne)
		}
		require.NoError(t, served.Stop(ctx))
		require.NoError(t, served.Stop(ctx), "idempotent")
	}
}
