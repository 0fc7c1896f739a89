package envs_test

import (
	"context"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/openenv"
	"github.com/ortrain/ortrain/internal/ors"
)

func TestLockboxScore(t *testing.T) {
	tests := []struct {
		name            string
		code, submitted string
		opened          bool
		want            float64
	}{
		{"open, right code", "4", "4", true, 1},
		{"open, wrong code", "4", "1", true, 0.25},
		{"no open, right code", "4", "4", false, 0.75},
		{"no open, wrong code", "4", "3", false, 0},
		{"zero", "0", "0", true, 1},
		{"padded guess earns half", "4", "44", false, 0.375},
		{"padded wrong guess", "4", "04", true, 0.25},
		{"empty", "4", "", true, 0.25},
		{"empty, no open", "4", "", false, 0},
		{"letter", "4", "a", false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.InDelta(t, tt.want, envs.LockboxScore(tt.code, tt.submitted, tt.opened), 1e-12)
		})
	}
}

type lockboxSpec struct {
	ID   string `json:"id"`
	Code string `json:"code"`
}

func TestLockboxTasks(t *testing.T) {
	ctx := context.Background()
	c, _ := serve(t, "lockbox")
	splits, err := c.Splits(ctx)
	require.NoError(t, err)
	assert.Equal(t, []ors.Split{{Name: "train", Type: "train"}, {Name: "validation", Type: "validation"}}, splits)
	digits := regexp.MustCompile(`^[0-9]$`)
	for _, tt := range []struct {
		split, prefix string
		n             int
	}{{"train", "lockbox-", 256}, {"validation", "lockbox-validation-", 64}} {
		tasks, err := c.Tasks(ctx, tt.split)
		require.NoError(t, err)
		require.Len(t, tasks, tt.n)
		firstDigits := map[byte]bool{}
		for i, task := range tasks {
			var spec lockboxSpec
			require.NoError(t, json.Unmarshal(task.Spec, &spec))
			assert.Equal(t, tt.prefix+strconv.Itoa(i), spec.ID)
			assert.Regexp(t, digits, spec.Code)
			firstDigits[spec.Code[0]] = true
		}
		assert.Len(t, firstDigits, 10, "%s: codes spread over every digit", tt.split)
	}
	// Deterministic: a fresh declaration lists the same tasks.
	again, _ := serve(t, "lockbox")
	a, err := c.Task(ctx, "validation", 3)
	require.NoError(t, err)
	b, err := again.Task(ctx, "validation", 3)
	require.NoError(t, err)
	assert.Equal(t, string(a.Spec), string(b.Spec))
	assert.Contains(t, string(a.Spec), `"id":"lockbox-validation-3"`)
}

// codeOf reads the code from open_envelope's output.
func codeOf(t *testing.T, text string) string {
	t.Helper()
	code, ok := strings.CutPrefix(text, "code: ")
	require.True(t, ok, "open_envelope said %q", text)
	require.Regexp(t, `^[0-9]$`, code)
	return code
}

func TestLockboxOverORS(t *testing.T) {
	ctx := context.Background()
	c, srv := serve(t, "lockbox")
	s, err := c.OpenSession(ctx, ors.SessionSpec{Split: "train", Index: 17})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	prompt, err := s.Prompt(ctx)
	require.NoError(t, err)
	assert.Equal(t, envs.LockboxPrompt, prompt[0].Text)
	tools, err := s.Tools(ctx)
	require.NoError(t, err)
	require.Len(t, tools, 2)
	assert.Equal(t, envs.LockboxOpenTool, tools[0].Name)
	assert.Equal(t, "null", string(tools[0].InputSchema), "open_envelope takes no parameters")
	assert.Equal(t, envs.LockboxUnlockTool, tools[1].Name)
	assert.JSONEq(t, `{"properties":{"code":{"type":"string"}},"required":["code"],"type":"object"}`, string(tools[1].InputSchema))

	out, err := s.CallTool(ctx, envs.LockboxOpenTool, json.RawMessage(`{}`))
	require.NoError(t, err)
	assert.Nil(t, out.Reward)
	assert.False(t, out.Finished)
	code := codeOf(t, out.Text())
	task, err := c.Task(ctx, "train", 17)
	require.NoError(t, err)
	assert.Contains(t, string(task.Spec), `"code":"`+code+`"`, "the envelope holds the task's code")

	// Invalid input is a tool error and does not end the episode.
	_, err = s.CallTool(ctx, envs.LockboxUnlockTool, json.RawMessage(`{}`))
	var tce *ors.ToolCallError
	require.ErrorAs(t, err, &tce)

	out, err = s.CallTool(ctx, envs.LockboxUnlockTool, json.RawMessage(`{"code":"`+code+`"}`))
	require.NoError(t, err)
	require.NotNil(t, out.Reward)
	assert.Equal(t, 1.0, *out.Reward)
	assert.True(t, out.Finished)
	assert.Equal(t, "unlocked", out.Text())

	// After the episode: a tool error, no second reward.
	for _, call := range []struct{ tool, input string }{{envs.LockboxUnlockTool, `{"code":"` + code + `"}`}, {envs.LockboxOpenTool, `{}`}} {
		_, err = s.CallTool(ctx, call.tool, json.RawMessage(call.input))
		require.ErrorAs(t, err, &tce, call.tool)
		assert.Contains(t, tce.Message, "the episode is over")
	}
	require.NoError(t, s.Close(ctx))
	assert.Equal(t, int64(0), srv.Stats().Live)
}

func TestLockboxUnlockWithoutOpening(t *testing.T) {
	ctx := context.Background()
	c, _ := serve(t, "lockbox")
	task, err := c.Task(ctx, "validation", 5)
	require.NoError(t, err)
	var spec lockboxSpec
	require.NoError(t, json.Unmarshal(task.Spec, &spec))
	wrong := string('0' + (spec.Code[0]-'0'+1)%10)
	for _, tt := range []struct {
		code, text string
		want       float64
	}{
		{spec.Code, "unlocked", 0.75},
		{wrong, "wrong code", 0},
		{spec.Code + spec.Code, "wrong code", 0.375},
		{"", "wrong code", 0},
	} {
		s, err := c.OpenSession(ctx, ors.SessionSpec{Split: "validation", Index: 5})
		require.NoError(t, err)
		out, err := s.CallTool(ctx, envs.LockboxUnlockTool, json.RawMessage(`{"code":"`+tt.code+`"}`))
		require.NoError(t, err)
		assert.Equal(t, tt.text, out.Text(), tt.code)
		assert.InDelta(t, tt.want, *out.Reward, 1e-12, tt.code)
		assert.True(t, out.Finished)
		require.NoError(t, s.Close(ctx))
	}
}

func TestLockboxOverOpenEnv(t *testing.T) {
	ctx := context.Background()
	c, _ := serveOpenEnv(t, "lockbox", envs.ProtocolOpenEnv)
	s, obs, err := c.Start(ctx, map[string]any{"split": "validation", "index": 3})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	assert.JSONEq(t, `{"prompt":"`+envs.LockboxPrompt+`","split":"validation","index":3}`, string(obs.Observation))
	tools, err := s.ListTools(ctx)
	require.NoError(t, err)
	require.Len(t, tools, 2)
	assert.Equal(t, []string{envs.LockboxOpenTool, envs.LockboxUnlockTool}, []string{tools[0].Name, tools[1].Name})
	assert.JSONEq(t, `{"properties":{},"type":"object"}`, string(tools[0].InputSchema))

	call, err := s.CallTool(ctx, envs.LockboxOpenTool, nil)
	require.NoError(t, err)
	require.Nil(t, call.Error)
	assert.False(t, call.Done)
	code := codeOf(t, call.Text())
	call, err = s.CallTool(ctx, envs.LockboxUnlockTool, json.RawMessage(`{"code":"`+code+`"}`))
	require.NoError(t, err)
	require.Nil(t, call.Error)
	require.NotNil(t, call.Reward)
	assert.Equal(t, 1.0, *call.Reward)
	assert.True(t, call.Done)
	assert.Equal(t, "unlocked", call.Text())

	call, err = s.CallTool(ctx, envs.LockboxUnlockTool, json.RawMessage(`{"code":"`+code+`"}`))
	require.NoError(t, err)
	require.NotNil(t, call.Error, "a second unlock is a tool error")
	assert.Equal(t, openenv.ToolInvalidArgs, call.Error.Type)
	assert.Nil(t, call.Reward)

	// A reset starts a fresh episode: the envelope is closed again.
	_, err = s.Reset(ctx, map[string]any{"split": "validation", "index": 3})
	require.NoError(t, err)
	call, err = s.CallTool(ctx, envs.LockboxUnlockTool, json.RawMessage(`{"code":"`+code+`"}`))
	require.NoError(t, err)
	assert.Equal(t, 0.75, *call.Reward)
}
