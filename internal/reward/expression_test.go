package reward

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/grpo"
)

// sample is a trajectory with every variable set to something distinct.
func sample() Trajectory {
	return Trajectory{
		Env:    "capitals",
		Task:   map[string]any{"answer": "Paris", "level": 3.0, "tags": []any{"geo"}},
		Prompt: "Capital of France?",
		Turns: []Turn{
			{Role: "assistant", Text: "Looking.", ToolCalls: []ToolCall{{Name: "lookup"}}},
			{Role: "tool", Tool: "lookup", Text: "Paris", Reward: ptr(0.25)},
			{Role: "assistant", Text: "<tool_call>{", FormatError: true},
			{Role: "assistant", Text: "It is Paris."},
		},
		EnvRewards:       []*float64{ptr(0.25), nil, ptr(1.0), ptr(-0.5)},
		Finished:         true,
		Outcome:          "done",
		NumToolCalls:     1,
		ToolFailures:     2,
		CompletionTokens: 42,
		Metadata:         map[string]any{"score": 0.7, "judge": "ok"},
	}
}

func TestExpressionValues(t *testing.T) {
	tests := []struct {
		expr string
		agg  string
		want float64
	}{
		{"completion_tokens < 8 ? 1.0 : 0.0", "", 0},
		{"completion_tokens < 50 ? 1.0 : 0.0", "", 1},
		{"completion_tokens", "", 42},           // int → double
		{"env_reward", "", -0.5},                // run default: last non-null
		{"env_reward", "sum", 0.75},             // 0.25 + 1.0 - 0.5
		{"env_reward", "max", 1.0},              //
		{"env_reward", "mean", 0.25},            // 0.75 / 3
		{"size(env_rewards)", "", 3},            // the null is left out
		{"env_rewards[1] * 2.0", "", 2.0},       // second non-null
		{"math.greatest(env_rewards)", "", 1.0}, // ext.Math
		{"finished && outcome == 'done' ? 1.0 : 0.0", "", 1},
		{"truncated ? -1.0 : 0.0", "", 0},
		{"double(num_turns)", "", 3}, // assistant turns
		{"double(num_tool_calls * 10 + tool_failures)", "", 12},
		{"text == 'It is Paris.' ? 1.0 : 0.0", "", 1}, // final assistant text
		{"text.lowerAscii().contains(task.answer.lowerAscii()) ? 1.0 : 0.0", "", 1},
		{"task.level / 10.0", "", 0.3},                     // dyn from the task map
		{"metadata.score", "", 0.7},                        // dyn result, checked at run time
		{"has(task.missing) ? 1.0 : dyn(null)", "", nan()}, // declines
		{"'geo' in task.tags ? 0.5 : 0.0", "", 0.5},
	}
	for _, tt := range tests {
		t.Run(tt.expr+"/"+tt.agg, func(t *testing.T) {
			set := compile(t, []Spec{{Name: "e", Kind: KindExpression, Expression: tt.expr, Aggregation: tt.agg}},
				Options{Aggregation: grpo.RewardLast})
			scores, err := set.Score(context.Background(), []Trajectory{sample()})
			require.NoError(t, err)
			require.NoError(t, scores[0].Err)
			assertFloat(t, tt.want, scores[0].Values[0])
		})
	}
}

func TestExpressionEmptyMapsAndTurns(t *testing.T) {
	set := compile(t, []Spec{{Name: "e", Kind: KindExpression,
		Expression: "size(task) + size(metadata) + size(env_rewards) + size(text) + num_turns"}}, Options{})
	scores, err := set.Score(context.Background(), []Trajectory{{}})
	require.NoError(t, err)
	require.NoError(t, scores[0].Err)
	assert.Equal(t, 0.0, scores[0].Values[0])
}

func TestExpressionRefusedAtCompile(t *testing.T) {
	tests := []struct {
		name, expr string
		line, col  int
		msg        string
	}{
		{"syntax", "completion_tokens < ", 1, 21, "Syntax error"},
		{"unknown variable", "1.0 + lenght", 1, 7, "undeclared reference to 'lenght'"},
		{"unknown variable line 2", "1.0 +\n  2.0 * tokens", 2, 9, "undeclared reference to 'tokens'"},
		{"bool result", "completion_tokens < 8", 1, 1, "has type bool"},
		{"string result", "text", 1, 1, "has type string"},
		{"list result", "env_rewards", 1, 1, "has type list(double)"},
		{"wrong operand types", "text + 1.0", 1, 6, "no matching overload"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Compile([]Spec{{Name: "env", Kind: KindEnv}, {Name: "bonus", Kind: KindExpression, Expression: tt.expr}}, Options{})
			var ee *ExpressionError
			require.True(t, errors.As(err, &ee), "want an *ExpressionError, got %v", err)
			assert.Equal(t, "bonus", ee.Reward)
			assert.Equal(t, tt.expr, ee.Expression)
			assert.Equal(t, [2]int{tt.line, tt.col}, [2]int{ee.Line, ee.Col})
			msg := err.Error()
			assert.Contains(t, msg, tt.msg)
			assert.Contains(t, msg, `reward "bonus"`)
			assert.Contains(t, msg, "at "+strings.Join([]string{itoa(tt.line), itoa(tt.col)}, ":"))
			for _, v := range Variables() {
				assert.Contains(t, msg, v.Name+" ("+v.Type+")", "the error lists the variables")
			}
		})
	}
}

func TestExpressionRuntimeErrorFailsThatTrajectory(t *testing.T) {
	set := compile(t, []Spec{
		{Name: "env", Kind: KindEnv},
		{Name: "level", Kind: KindExpression, Expression: "task.level * 1.0"},
		{Name: "judge", Kind: KindExpression, Expression: "task.answer"},
	}, Options{})
	ok := Trajectory{Task: map[string]any{"level": 2.0}, EnvRewards: []*float64{ptr(1.0)}}
	missing := Trajectory{Task: map[string]any{}, EnvRewards: []*float64{ptr(1.0)}}
	scores, err := set.Score(context.Background(), []Trajectory{ok, missing})
	require.NoError(t, err)

	var ee *EvalError
	require.True(t, errors.As(scores[0].Err, &ee), "task.answer is missing in both: %v", scores[0].Err)
	assert.Equal(t, "judge", ee.Reward)
	assertFloats(t, []float64{1, 2, nan()}, scores[0].Values)
	assertFloat(t, nan(), scores[0].Total, "a failed trajectory has no total")

	require.Error(t, scores[1].Err)
	assert.Contains(t, scores[1].Err.Error(), `reward "level": evaluate "task.level * 1.0"`)
	assert.Contains(t, scores[1].Err.Error(), "no such key")
	assertFloats(t, []float64{1, nan(), nan()}, scores[1].Values)

	wrong := Trajectory{Task: map[string]any{"level": 1.0, "answer": "Paris"}}
	scores, err = set.Score(context.Background(), []Trajectory{wrong})
	require.NoError(t, err)
	require.Error(t, scores[0].Err)
	assert.Contains(t, scores[0].Err.Error(), "evaluated to string Paris; want a number")
}

func TestExpressionCostLimit(t *testing.T) {
	set := compile(t, []Spec{{Name: "slow", Kind: KindExpression,
		Expression: "double(size(task.xs.map(a, task.xs.map(b, task.xs.map(c, a)))))"}}, Options{})
	xs := make([]any, 200)
	for i := range xs {
		xs[i] = float64(i)
	}
	scores, err := set.Score(context.Background(), []Trajectory{{Task: map[string]any{"xs": xs}}})
	require.NoError(t, err)
	require.Error(t, scores[0].Err)
	assert.Contains(t, scores[0].Err.Error(), "cost limit")
}

func TestScoreCanceled(t *testing.T) {
	set := compile(t, []Spec{{Name: "e", Kind: KindExpression, Expression: "1.0"}}, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := set.Score(ctx, []Trajectory{{}})
	assert.ErrorIs(t, err, context.Canceled)
}

func TestEveryBadExpressionIsReported(t *testing.T) {
	_, err := Compile([]Spec{
		{Name: "a", Kind: KindExpression, Expression: "nope"},
		{Name: "b", Kind: KindExpression, Expression: "1.0"},
		{Name: "c", Kind: KindExpression, Expression: "finished"},
	}, Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `reward "a": expression "nope" at 1:1: undeclared reference to 'nope'`)
	assert.Contains(t, err.Error(), `reward "c": expression "finished" at 1:1: the expression has type bool`)
	assert.NotContains(t, err.Error(), `reward "b"`)
}
