package rollout

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/envtarget"
	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
)

var guessObs = regexp.MustCompile(`"hint":"(lower|higher|correct)","guesses_left":\d+,"last_guess":(\d+)`)

// bisect plays the guessing game from the observations the model has seen.
func bisect(seen string) int {
	lo, hi := 1, 100
	for _, m := range guessObs.FindAllStringSubmatch(seen, -1) {
		g, _ := strconv.Atoi(m[2])
		switch m[1] {
		case "lower":
			hi = g - 1
		case "higher":
			lo = g + 1
		}
	}
	return (lo + hi) / 2
}

// Issue 10: a rollout plays a whole game of guess (OpenEnv, Gym-style)
// through the `step` tool, reading each observation the env sends back.
func TestRolloutPlaysGuessThroughStepTool(t *testing.T) {
	cs := tinyChat(t)
	ctx := context.Background()
	env, err := envtarget.Resolve(ctx, "builtin:guess", envtarget.Options{Logger: zerolog.Nop(), OpenEnv: envtarget.OpenEnvOptions{
		Tasks: []envtarget.OpenEnvTask{{Prompt: "Find the number (1-100) with the step tool.", Reset: map[string]any{"target": 37, "max_guesses": 7}}},
	}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Close(ctx) })
	gen := &scriptedGenerator{tok: cs.Tokenizer, script: func(turn int, seen string) (string, engine.StopReason, time.Duration) {
		return call("step", fmt.Sprintf(`{"guess": %d}`, bisect(seen))), engine.StopToken, 0
	}}
	r := newRunner(t, env, gen, cs, func(o *Options) { o.MaxToolIterations, o.MaxCompletionTokens = 10, 8192 })
	tr := r.Run(ctx, Task{Split: "train", Index: 0}, 1)
	require.NoError(t, tr.Err)
	assert.Equal(t, OutcomeDone, tr.Outcome)
	require.NotEmpty(t, tr.Rewards)
	assert.Equal(t, 1.0, *tr.Rewards[len(tr.Rewards)-1], "the last guess wins")
	assert.Equal(t, len(tr.Rewards), tr.ToolCalls)
	assert.Zero(t, tr.ToolFailures)
	last := tr.Turns[len(tr.Turns)-1]
	assert.Equal(t, "tool", last.Role)
	assert.Contains(t, last.Text, "You got it!")
	assert.Contains(t, tr.Prompt, "Find the number")
}

// An action the env rejects reaches the model as the tool turn and the
// rollout goes on (issue 10's bad-input case).
func TestRolloutSeesRejectedAction(t *testing.T) {
	cs := tinyChat(t)
	ctx := context.Background()
	env, err := envtarget.Resolve(ctx, "builtin:guess", envtarget.Options{Logger: zerolog.Nop(), OpenEnv: envtarget.OpenEnvOptions{NumTasks: 1}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Close(ctx) })
	gen := &scriptedGenerator{tok: cs.Tokenizer, script: func(turn int, seen string) (string, engine.StopReason, time.Duration) {
		if turn == 0 {
			return call("step", `{"guess": 500, "hint": "x"}`), engine.StopToken, 0
		}
		return "I give up.", engine.StopToken, 0
	}}
	tr := newRunner(t, env, gen, cs, func(o *Options) { o.MaxCompletionTokens = 4096 }).Run(ctx, Task{Split: "train", Index: 3}, 1)
	require.NoError(t, tr.Err)
	assert.Equal(t, OutcomeStopped, tr.Outcome, "the rollout went on after the rejected action")
	assert.Equal(t, 1, tr.ToolFailures)
	assert.Contains(t, tr.Turns[1].Error, "VALIDATION_ERROR")
	assert.Contains(t, gen.seen[1], "VALIDATION_ERROR", "the model read the validation error")
}

// shoutEnv's action is one string field (TRL's Wordle pattern).
func shoutEnv() *openenvserver.Env {
	return &openenvserver.Env{
		Name: "ShoutEnvironment", ActionName: "ShoutAction",
		Action:             []openenvserver.Field{{Name: "message", Type: openenvserver.String, Required: true}},
		ConcurrentSessions: true,
		New:                func(context.Context) (openenvserver.Instance, error) { return &shout{}, nil },
	}
}

type shout struct{ tries int }

func (s *shout) Reset(context.Context, map[string]json.RawMessage) (openenvserver.Observation, error) {
	s.tries = 0
	return openenvserver.Observation{Fields: map[string]any{"message": "Shout HELLO."}, Reward: openenvserver.Reward(0)}, nil
}

func (s *shout) Step(_ context.Context, action json.RawMessage) (openenvserver.Observation, error) {
	var a struct{ Message string }
	if err := json.Unmarshal(action, &a); err != nil {
		return openenvserver.Observation{}, err
	}
	s.tries++
	if a.Message == "HELLO" {
		return openenvserver.Observation{Fields: map[string]any{"message": "Heard you."}, Reward: openenvserver.Reward(1), Done: true}, nil
	}
	return openenvserver.Observation{Fields: map[string]any{"message": "Louder!"}, Reward: openenvserver.Reward(0), Done: s.tries >= 3}, nil
}

func (s *shout) State(context.Context) (json.RawMessage, error) {
	return json.Marshal(map[string]any{"episode_id": nil, "step_count": s.tries})
}

// text_action: the model answers in plain text, the answer is the action,
// and the observation is the next user turn until the env says done.
func TestRolloutTextAction(t *testing.T) {
	cs := tinyChat(t)
	ctx := context.Background()
	srv, err := openenvserver.New(openenvserver.Options{Logger: zerolog.Nop()}, shoutEnv())
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	env, err := envtarget.Resolve(ctx, "http://"+l.Addr().String(), envtarget.Options{Logger: zerolog.Nop(), Protocol: "openenv",
		OpenEnv: envtarget.OpenEnvOptions{TextAction: true, ObservationField: "message", NumTasks: 1}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Close(ctx) })
	gen := &scriptedGenerator{tok: cs.Tokenizer, script: func(turn int, seen string) (string, engine.StopReason, time.Duration) {
		if strings.Contains(seen, "Louder!") {
			return "HELLO", engine.StopToken, 0
		}
		return "hello", engine.StopToken, 0
	}}
	tr := newRunner(t, env, gen, cs, nil).Run(ctx, Task{Split: "train", Index: 0}, 1)
	require.NoError(t, tr.Err)
	assert.Equal(t, OutcomeDone, tr.Outcome)
	require.Len(t, tr.Rewards, 2)
	assert.Equal(t, 0.0, *tr.Rewards[0])
	assert.Equal(t, 1.0, *tr.Rewards[1])
	assert.Equal(t, "Shout HELLO.", tr.Prompt)
	require.Len(t, tr.Turns, 4)
	assert.Equal(t, []string{"assistant", "user", "assistant", "user"}, []string{tr.Turns[0].Role, tr.Turns[1].Role, tr.Turns[2].Role, tr.Turns[3].Role})
	assert.Equal(t, "Louder!", tr.Turns[1].Text)
	assert.Contains(t, gen.seen[1], "<|im_start|>user\nLouder!", "the observation is a user turn")
	assert.Eventually(t, func() bool { return srv.Stats().Live == 0 }, 5*time.Second, 10*time.Millisecond, "the episode's socket is closed")
}

// Issue 11 item 5: a trajectory records the tools its session offered
// (task-scoped ones included), whether the prompt showed them and which
// definitions, and with LogPrompts the rendered prompt.
func TestTrajectoryRecordsOfferedTools(t *testing.T) {
	cs := tinyChat(t)
	opener, _, _ := serveEnv(t, envs.Echo())
	gen := &scriptedGenerator{tok: cs.Tokenizer, script: func(int, string) (string, engine.StopReason, time.Duration) {
		return "no idea", engine.StopToken, 0
	}}
	shown := newRunner(t, opener, gen, cs, func(o *Options) { o.LogPrompts = true }).Run(context.Background(), Task{Split: "train", Index: 0}, 1)
	require.NoError(t, shown.Err)
	assert.ElementsMatch(t, []string{"echo", "hint"}, shown.ToolsOffered)
	assert.True(t, shown.ToolsRendered)
	assert.Len(t, shown.ToolsSHA256, 64)
	assert.Contains(t, shown.PromptText, `"name": "hint"`, "the task-scoped tool reached the rendered prompt")

	hidden := cs
	hidden.HideTools = true
	tr := newRunner(t, opener, gen, hidden, nil).Run(context.Background(), Task{Split: "train", Index: 0}, 1)
	require.NoError(t, tr.Err)
	assert.ElementsMatch(t, []string{"echo", "hint"}, tr.ToolsOffered)
	assert.False(t, tr.ToolsRendered)
	assert.Empty(t, tr.ToolsSHA256)
	assert.Empty(t, tr.PromptText, "prompts are logged only when asked")
}
