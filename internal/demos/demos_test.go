package demos_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/demos"
	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/envtarget"
)

// resolve serves a built-in on loopback over protocol ("" for its own)
// until the test ends.
func resolve(t *testing.T, target, protocol string) envtarget.Env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	env, err := envtarget.Resolve(ctx, target, envtarget.Options{Protocol: protocol})
	require.NoError(t, err)
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		require.NoError(t, env.Close(cctx))
	})
	return env
}

// write runs demos.Write and returns the file's bytes and its records.
func write(t *testing.T, env envtarget.Env, opts demos.Options) ([]byte, []demos.Record, demos.Summary) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var buf bytes.Buffer
	sum, err := demos.Write(ctx, env, opts, &buf)
	require.NoError(t, err)
	return buf.Bytes(), parse(t, buf.Bytes()), sum
}

// parse reads a demonstrations file strictly: every line one Record with
// no unknown fields.
func parse(t *testing.T, data []byte) []demos.Record {
	t.Helper()
	var out []demos.Record
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		var r demos.Record
		require.NoError(t, dec.Decode(&r), sc.Text())
		out = append(out, r)
	}
	require.NoError(t, sc.Err())
	return out
}

// sessionTools are the tools one real session of env offers, as Write
// writes them.
func sessionTools(t *testing.T, env envtarget.Env, split string) []demos.Tool {
	t.Helper()
	ctx := context.Background()
	s, err := env.OpenSession(ctx, envtarget.TaskRef{Split: split})
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close(ctx)) }()
	specs, err := s.Tools(ctx)
	require.NoError(t, err)
	out := make([]demos.Tool, len(specs))
	for i, sp := range specs {
		params := sp.InputSchema
		if len(params) == 0 || string(params) == "null" {
			params = json.RawMessage(`{"type":"object","properties":{}}`)
		}
		out[i] = demos.Tool{Type: "function", Function: demos.Function{Name: sp.Name, Description: sp.Description, Parameters: params}}
	}
	return out
}

// checkConversation checks one record's shape: user prompt, then pairs of
// an assistant turn with one call and the tool answer to it. It returns the
// names of the tools called.
func checkConversation(t *testing.T, r demos.Record) []string {
	t.Helper()
	require.GreaterOrEqual(t, len(r.Messages), 3)
	assert.Equal(t, demos.Message{Role: "user", Content: envs.LockboxPrompt}, r.Messages[0])
	var called []string
	for i := 1; i+1 < len(r.Messages); i += 2 {
		a, tool := r.Messages[i], r.Messages[i+1]
		require.Equal(t, "assistant", a.Role)
		assert.Empty(t, a.Content)
		require.Len(t, a.ToolCalls, 1)
		c := a.ToolCalls[0]
		assert.Equal(t, fmt.Sprintf("call_%d", len(called)), c.ID)
		assert.Equal(t, "function", c.Type)
		var args map[string]any
		require.NoError(t, json.Unmarshal(c.Function.Arguments, &args), "arguments are a JSON object")
		require.Equal(t, "tool", tool.Role)
		assert.Equal(t, c.ID, tool.ToolCallID, "the tool answers the call before it")
		assert.Equal(t, c.Function.Name, tool.Name)
		called = append(called, c.Function.Name)
	}
	require.Equal(t, 1+2*len(called), len(r.Messages))
	return called
}

func TestWriteSkillOne(t *testing.T) {
	for _, tt := range []struct {
		protocol string
		taskID   func(i int) string
	}{
		{"ors", func(i int) string { return fmt.Sprintf("lockbox-%d", i) }},
		// OpenEnv has no task ids: the split and index stand in.
		{"openenv", func(i int) string { return fmt.Sprintf("train/%d", i) }},
	} {
		t.Run(tt.protocol, func(t *testing.T) {
			env := resolve(t, "builtin:lockbox", tt.protocol)
			_, recs, sum := write(t, env, demos.Options{Script: "lockbox", N: 12, Skill: 1})
			require.Len(t, recs, 12)
			assert.Equal(t, demos.Summary{Episodes: 12, MeanReward: 1, MeanToolCalls: 2, ToolCalls: map[string]int{"open_envelope": 12, "unlock": 12}}, sum)
			tools := sessionTools(t, env, "train")
			for i, r := range recs {
				assert.Equal(t, []string{"open_envelope", "unlock"}, checkConversation(t, r))
				assert.Equal(t, 1.0, r.Reward)
				assert.Equal(t, tt.taskID(i), r.TaskID)
				assert.JSONEq(t, `{}`, string(r.Messages[1].ToolCalls[0].Function.Arguments))
				code, ok := strings.CutPrefix(r.Messages[2].Content, "code: ")
				require.True(t, ok, r.Messages[2].Content)
				assert.JSONEq(t, `{"code":"`+code+`"}`, string(r.Messages[3].ToolCalls[0].Function.Arguments), "the code is copied")
				assert.Equal(t, "unlocked", r.Messages[4].Content)
				assert.Equal(t, tools, r.Tools, "the session's own tools")
			}
		})
	}
}

// TestWriteExactLine pins one line byte for byte: TRL's format, argument
// objects, the session's schemas in their own key order.
func TestWriteExactLine(t *testing.T) {
	ctx := context.Background()
	env := resolve(t, "builtin:lockbox", "")
	l, err := env.Describe(ctx, envtarget.Query{Split: "validation", Indices: []int{0}})
	require.NoError(t, err)
	var spec struct{ Code string }
	require.NoError(t, json.Unmarshal(l.Tasks[0].Spec, &spec))
	data, _, _ := write(t, env, demos.Options{Script: "lockbox", N: 1, Split: "validation", Skill: 1})
	want := `{"messages":[{"role":"user","content":"Open the envelope, then unlock the box with the code inside."},` +
		`{"role":"assistant","content":"","tool_calls":[{"id":"call_0","type":"function","function":{"name":"open_envelope","arguments":{}}}]},` +
		`{"role":"tool","tool_call_id":"call_0","name":"open_envelope","content":"code: ` + spec.Code + `"},` +
		`{"role":"assistant","content":"","tool_calls":[{"id":"call_1","type":"function","function":{"name":"unlock","arguments":{"code":"` + spec.Code + `"}}}]},` +
		`{"role":"tool","tool_call_id":"call_1","name":"unlock","content":"unlocked"}],` +
		`"tools":[{"type":"function","function":{"name":"open_envelope","description":"Read the code.","parameters":{"type":"object","properties":{}}}},` +
		`{"type":"function","function":{"name":"unlock","description":"Try a code. Ends the episode.","parameters":{"properties":{"code":{"type":"string"}},"required":["code"],"type":"object"}}}],` +
		`"reward":1,"task_id":"lockbox-validation-0"}` + "\n"
	assert.Equal(t, want, string(data))
}

func TestWriteSkillZero(t *testing.T) {
	env := resolve(t, "builtin:lockbox", "")
	_, recs, sum := write(t, env, demos.Options{Script: "lockbox", N: 40, Skill: 0, Seed: 3})
	require.Len(t, recs, 40)
	assert.Zero(t, sum.ToolCalls["open_envelope"])
	assert.Equal(t, 40, sum.ToolCalls["unlock"])
	assert.Equal(t, 1.0, sum.MeanToolCalls)
	for _, r := range recs {
		assert.Equal(t, []string{"unlock"}, checkConversation(t, r))
		var args struct{ Code string }
		require.NoError(t, json.Unmarshal(r.Messages[1].ToolCalls[0].Function.Arguments, &args))
		assert.Regexp(t, `^[0-9]$`, args.Code)
		assert.Contains(t, []float64{0, 0.25, 0.5, 0.75}, r.Reward, "no 0.25 for opening")
	}
	assert.Less(t, sum.MeanReward, 0.3, "random codes are mostly wrong")
}

// TestWriteSkillHalf runs over OpenEnv: about half the episodes open the
// envelope (and score 1), the rest guess.
func TestWriteSkillHalf(t *testing.T) {
	env := resolve(t, "builtin:lockbox", "openenv")
	_, recs, sum := write(t, env, demos.Options{Script: "lockbox", N: 200, Skill: 0.5, Seed: 7})
	require.Len(t, recs, 200)
	opened := 0
	for _, r := range recs {
		called := checkConversation(t, r)
		if called[0] == "open_envelope" {
			opened++
			assert.Equal(t, 1.0, r.Reward)
		} else {
			assert.LessOrEqual(t, r.Reward, 0.75)
		}
	}
	assert.Equal(t, opened, sum.ToolCalls["open_envelope"])
	rate := float64(opened) / 200
	assert.True(t, rate > 0.35 && rate < 0.65, "open rate %.2f", rate)
	assert.InDelta(t, 1+rate, sum.MeanToolCalls, 1e-9)
}

func TestWriteDeterministic(t *testing.T) {
	env := resolve(t, "builtin:lockbox", "")
	opts := demos.Options{Script: "lockbox", N: 70, Split: "validation", Skill: 0.5, Seed: 11}
	a, recs, _ := write(t, env, opts)
	opts.Concurrency = 1
	b, _, _ := write(t, env, opts)
	assert.Equal(t, string(a), string(b), "same options, same bytes, whatever the concurrency")
	opts.Seed = 12
	c, _, _ := write(t, env, opts)
	assert.NotEqual(t, string(a), string(c), "another seed, another draw")
	// 70 episodes on 64 validation tasks: the tasks cycle.
	for i, r := range recs {
		assert.Equal(t, fmt.Sprintf("lockbox-validation-%d", i%64), r.TaskID)
	}
}

type failingWriter struct{ err error }

func (w failingWriter) Write([]byte) (int, error) { return 0, w.err }

func TestWriteErrors(t *testing.T) {
	ctx := context.Background()
	env := resolve(t, "builtin:lockbox", "")
	for _, tt := range []struct {
		opts   demos.Options
		option string
	}{
		{demos.Options{Script: "lockbox", N: 0}, "N"},
		{demos.Options{Script: "lockbox", N: 1, Skill: -0.1}, "Skill"},
		{demos.Options{Script: "lockbox", N: 1, Skill: 1.5}, "Skill"},
		{demos.Options{Script: "lockbox", N: 1, Skill: math.NaN()}, "Skill"},
		{demos.Options{Script: "lockbox", N: 1, Concurrency: -1}, "Concurrency"},
	} {
		_, err := demos.Write(ctx, env, tt.opts, &bytes.Buffer{})
		var oe *demos.OptionError
		require.ErrorAs(t, err, &oe, "%+v", tt.opts)
		assert.Equal(t, tt.option, oe.Option)
	}

	_, err := demos.Write(ctx, env, demos.Options{Script: "letters", N: 1}, &bytes.Buffer{})
	var ns *demos.NoScriptError
	require.ErrorAs(t, err, &ns)
	assert.Equal(t, demos.Scripts(), ns.Available)
	assert.Contains(t, ns.Available, "lockbox")

	_, err = demos.Write(ctx, env, demos.Options{Script: "lockbox", N: 1, Split: "nope"}, &bytes.Buffer{})
	var se *envtarget.SplitError
	require.ErrorAs(t, err, &se)

	boom := errors.New("disk full")
	_, err = demos.Write(ctx, env, demos.Options{Script: "lockbox", N: 3}, failingWriter{boom})
	require.ErrorIs(t, err, boom)

	// The lockbox policy on another env: it has no open_envelope tool.
	letters := resolve(t, "builtin:letters", "")
	_, err = demos.Write(ctx, letters, demos.Options{Script: "lockbox", N: 2}, &bytes.Buffer{})
	require.Error(t, err)
}

func TestWriteCancelled(t *testing.T) {
	env := resolve(t, "builtin:lockbox?tool_latency=1h", "")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := demos.Write(ctx, env, demos.Options{Script: "lockbox", N: 4}, &bytes.Buffer{})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 20*time.Second, "every blocking call ends with the context")
}
