package envtarget_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envtarget"
	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
)

func resolveWith(t *testing.T, target string, opts envtarget.Options) (envtarget.Env, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opts.Logger = zerolog.Nop()
	e, err := envtarget.Resolve(ctx, target, opts)
	if err == nil {
		t.Cleanup(func() { require.NoError(t, e.Close(context.Background())) })
	}
	return e, err
}

// shoutEnv is a Gym-style env whose action is one string field (TRL's
// Wordle pattern): it wins when the message is the reset's word in capitals.
func shoutEnv() *openenvserver.Env {
	return &openenvserver.Env{
		Name: "ShoutEnvironment", ActionName: "ShoutAction",
		Action:             []openenvserver.Field{{Name: "message", Type: openenvserver.String, Required: true}},
		ConcurrentSessions: true,
		New:                func(context.Context) (openenvserver.Instance, error) { return &shout{}, nil },
	}
}

type shout struct {
	word  string
	tries int
	said  string
}

func (s *shout) Reset(_ context.Context, kw map[string]json.RawMessage) (openenvserver.Observation, error) {
	s.word, s.tries, s.said = "hello", 0, ""
	if raw, ok := kw["word"]; ok {
		_ = json.Unmarshal(raw, &s.word)
	}
	s.said = "Shout the word " + s.word + "."
	return openenvserver.Observation{Fields: map[string]any{"transcript": s.said}, Reward: openenvserver.Reward(0)}, nil
}

func (s *shout) Step(_ context.Context, action json.RawMessage) (openenvserver.Observation, error) {
	var a struct {
		Message string `json:"message"`
	}
	if err := json.Unmarshal(action, &a); err != nil {
		return openenvserver.Observation{}, err
	}
	s.tries++
	won := a.Message == strings.ToUpper(s.word)
	reply := "Louder!"
	if won {
		reply = "Heard you."
	}
	s.said += "\n" + reply
	r := 0.0
	if won {
		r = 1
	}
	return openenvserver.Observation{Fields: map[string]any{"transcript": s.said}, Reward: &r, Done: won || s.tries >= 3}, nil
}

func (s *shout) State(context.Context) (json.RawMessage, error) {
	return json.Marshal(map[string]any{"episode_id": nil, "step_count": s.tries})
}

// serveOpenEnv serves env over OpenEnv on loopback.
func serveOpenEnv(t *testing.T, env *openenvserver.Env, opts openenvserver.Options) (string, *openenvserver.Server) {
	t.Helper()
	opts.Logger = zerolog.Nop()
	srv, err := openenvserver.New(opts, env)
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return "http://" + l.Addr().String(), srv
}

// A Gym-style env: the action is offered as the one `step` tool, the reset
// observation prompts the model, and binary search wins the guessing game.
func TestOpenEnvGymStyleGuess(t *testing.T) {
	e, err := resolveWith(t, "builtin:guess", envtarget.Options{})
	require.NoError(t, err)
	assert.Equal(t, envtarget.OpenEnv, e.Protocol())
	_, err = e.NumTasks(context.Background(), "train")
	var nt *envtarget.NoTaskListError
	require.ErrorAs(t, err, &nt, "OpenEnv has no task list of its own")

	ctx := context.Background()
	s, err := e.OpenSession(ctx, envtarget.TaskRef{Split: "train", Index: 5})
	require.NoError(t, err)
	defer s.Close(ctx)
	prompt, err := s.Prompt(ctx)
	require.NoError(t, err)
	assert.Contains(t, prompt, "Guess a number between 1 and 100.")
	tools, err := s.Tools(ctx)
	require.NoError(t, err)
	require.Len(t, tools, 1)
	assert.Equal(t, "step", tools[0].Name)
	assert.Contains(t, string(tools[0].InputSchema), `"guess"`)
	assert.NotContains(t, string(tools[0].InputSchema), "metadata")

	_, err = s.CallTool(ctx, "step", json.RawMessage(`{"guess": 500}`))
	var te *envtarget.ToolError
	require.ErrorAs(t, err, &te, "an action the env rejects is the model's to read")
	assert.Contains(t, err.Error(), "VALIDATION_ERROR")
	_, err = s.CallTool(ctx, "guess", json.RawMessage(`{"guess": 5}`))
	require.ErrorAs(t, err, &te)
	assert.Contains(t, err.Error(), `through the "step" tool`)

	lo, hi := 1, 100
	for range 7 {
		g := (lo + hi) / 2
		out, err := s.CallTool(ctx, "step", json.RawMessage(fmt.Sprintf(`{"guess": %d}`, g)))
		require.NoError(t, err)
		if out.Finished {
			require.NotNil(t, out.Reward)
			assert.Equal(t, 1.0, *out.Reward)
			assert.Contains(t, out.Text, "You got it!")
			return
		}
		assert.Equal(t, 0.0, *out.Reward)
		if strings.Contains(out.Text, `"lower"`) {
			hi = g - 1
		} else {
			lo = g + 1
		}
	}
	t.Fatal("binary search did not win in 7 guesses")
}

// Tasks from a file: each row's reset kwargs and prompt, by split.
func TestOpenEnvTasksFile(t *testing.T) {
	tasks := []envtarget.OpenEnvTask{
		{Prompt: "Guess 42.", Reset: map[string]any{"target": 42}},
		{Split: "validation", Prompt: "Guess 7.", Reset: map[string]any{"target": 7}},
		{Prompt: "Guess 9.", Reset: map[string]any{"target": 9, "max_guesses": 1}},
	}
	e, err := resolveWith(t, "builtin:guess", envtarget.Options{OpenEnv: envtarget.OpenEnvOptions{Tasks: tasks, ObservationField: "message"}})
	require.NoError(t, err)
	ctx := context.Background()
	n, err := e.NumTasks(ctx, "train")
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	n, err = e.NumTasks(ctx, "validation")
	require.NoError(t, err)
	assert.Equal(t, 1, n)

	s, err := e.OpenSession(ctx, envtarget.TaskRef{Split: "train", Index: 1})
	require.NoError(t, err)
	defer s.Close(ctx)
	prompt, _ := s.Prompt(ctx)
	assert.Equal(t, "Guess 9.", prompt)
	out, err := s.CallTool(ctx, "step", json.RawMessage(`{"guess": 50}`))
	require.NoError(t, err)
	assert.Equal(t, "Go lower. Out of guesses; the number was 9.", out.Text, "observation_field renders one field")
	assert.True(t, out.Finished)

	_, err = e.OpenSession(ctx, envtarget.TaskRef{Split: "train", Index: 2})
	var ie *envtarget.IndexError
	require.ErrorAs(t, err, &ie)

	l, err := e.Describe(ctx, envtarget.Query{Split: "train", Tools: true})
	require.NoError(t, err)
	require.Len(t, l.Tasks, 2)
	assert.JSONEq(t, `{"prompt":"Guess 42.","reset":{"target":42}}`, string(l.Tasks[0].Spec))
	require.Len(t, l.Tools, 1)
	assert.Equal(t, "step", l.Tools[0].Name)
}

// An MCP env: tools from list_tools, calls through call_tool, a tool error
// observation becomes the tool turn's text.
func TestOpenEnvMCP(t *testing.T) {
	e, err := resolveWith(t, "builtin:mcp-echo", envtarget.Options{OpenEnv: envtarget.OpenEnvOptions{NumTasks: 2}})
	require.NoError(t, err)
	ctx := context.Background()
	s, err := e.OpenSession(ctx, envtarget.TaskRef{Split: "train", Index: 0})
	require.NoError(t, err)
	defer s.Close(ctx)
	tools, err := s.Tools(ctx)
	require.NoError(t, err)
	var names []string
	for _, tl := range tools {
		names = append(names, tl.Name)
	}
	assert.ElementsMatch(t, []string{"echo_message", "echo_with_length"}, names)
	out, err := s.CallTool(ctx, "echo_message", json.RawMessage(`{"message":"hi there"}`))
	require.NoError(t, err)
	assert.Equal(t, "hi there", out.Text)
	_, err = s.CallTool(ctx, "nope", json.RawMessage(`{}`))
	var te *envtarget.ToolError
	require.ErrorAs(t, err, &te)
	assert.Contains(t, err.Error(), "tool_not_found")
}

// An ORS env served over OpenEnv (as an MCP env) keeps its tasks' rewards.
func TestORSEnvOverOpenEnv(t *testing.T) {
	e, err := resolveWith(t, "builtin:echo", envtarget.Options{Protocol: "openenv", OpenEnv: envtarget.OpenEnvOptions{NumTasks: 4, ObservationField: "prompt"}})
	require.NoError(t, err)
	assert.Equal(t, envtarget.OpenEnv, e.Protocol())
	ctx := context.Background()
	s, err := e.OpenSession(ctx, envtarget.TaskRef{Split: "train", Index: 2})
	require.NoError(t, err)
	defer s.Close(ctx)
	prompt, err := s.Prompt(ctx)
	require.NoError(t, err)
	assert.Equal(t, "Call the `echo` tool with text='trl' to win.", prompt)
	out, err := s.CallTool(ctx, "echo", json.RawMessage(`{"text":"trl"}`))
	require.NoError(t, err)
	assert.True(t, out.Finished)
	assert.Equal(t, 1.0, *out.Reward)
}

// text_action: the plain answer is the action's one string field, and only
// what is new in a cumulative observation comes back.
func TestOpenEnvTextAction(t *testing.T) {
	url, _ := serveOpenEnv(t, shoutEnv(), openenvserver.Options{})
	e, err := resolveWith(t, url, envtarget.Options{Protocol: "openenv", OpenEnv: envtarget.OpenEnvOptions{
		TextAction: true, ObservationField: "transcript", ObservationDiff: true, NumTasks: 1,
	}})
	require.NoError(t, err)
	ctx := context.Background()
	s, err := e.OpenSession(ctx, envtarget.TaskRef{Split: "train"})
	require.NoError(t, err)
	defer s.Close(ctx)
	prompt, _ := s.Prompt(ctx)
	assert.Equal(t, "Shout the word hello.", prompt)
	tools, err := s.Tools(ctx)
	require.NoError(t, err)
	assert.Empty(t, tools, "with text_action the answer itself is the action")
	actor, ok := s.(envtarget.TextActor)
	require.True(t, ok)
	out, err := actor.TextAction(ctx, "hello")
	require.NoError(t, err)
	assert.Equal(t, "Louder!", out.Text, "only the new line of the transcript")
	out, err = actor.TextAction(ctx, "HELLO")
	require.NoError(t, err)
	assert.Equal(t, "Heard you.", out.Text)
	assert.True(t, out.Finished)
	assert.Equal(t, 1.0, *out.Reward)

	// text_action needs one string field.
	_, err = resolveWith(t, "builtin:guess", envtarget.Options{OpenEnv: envtarget.OpenEnvOptions{TextAction: true}})
	var targetErr *envtarget.TargetError
	require.ErrorAs(t, err, &targetErr)
	assert.Contains(t, err.Error(), "exactly one string field")
}

// Capacity 1 and eight concurrent episodes: they wait their turn, none lost.
func TestOpenEnvCapacityQueues(t *testing.T) {
	url, srv := serveOpenEnv(t, shoutEnv(), openenvserver.Options{MaxSessions: 1})
	e, err := resolveWith(t, url, envtarget.Options{Protocol: "openenv", OpenEnv: envtarget.OpenEnvOptions{NumTasks: 1}})
	require.NoError(t, err)
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			s, err := e.OpenSession(ctx, envtarget.TaskRef{Split: "train"})
			if err != nil {
				errs <- err
				return
			}
			_, err = s.CallTool(ctx, "step", json.RawMessage(`{"message":"HELLO"}`))
			errs <- errorsJoin(err, s.Close(ctx))
		}()
	}
	for range 8 {
		require.NoError(t, <-errs)
	}
	assert.Positive(t, srv.Stats().Refused, "some sessions were refused for capacity and retried")
	assert.Equal(t, int64(8), srv.Stats().Created)
	cw, ok := e.(envtarget.CapacityWaiter)
	require.True(t, ok)
	assert.Equal(t, srv.Stats().Refused, cw.CapacityWaits(), "every refusal waited out is counted on the Env")
}

func errorsJoin(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
