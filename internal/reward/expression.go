package reward

import (
	"context"
	"fmt"
	"math"
	"strings"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/ext"
)

// Variable is one name an expression can use.
type Variable struct {
	Name string
	Type string // CEL type, e.g. "double", "list(double)"
	Doc  string
}

// Variables lists what an expression sees, in a fixed order (for errors
// and documentation).
func Variables() []Variable {
	return []Variable{
		{"env_rewards", "list(double)", "the env's reward per call or step; calls without a reward are left out"},
		{"env_reward", "double", "env_rewards aggregated (the spec's aggregation, else the run's)"},
		{"finished", "bool", "the env said the episode is done"},
		{"outcome", "string", "how the rollout ended: done, stopped, iterations, truncated, budget, ..."},
		{"num_turns", "int", "assistant turns"},
		{"num_tool_calls", "int", "tool calls made"},
		{"tool_failures", "int", "tool calls that failed"},
		{"completion_tokens", "int", "completion length in tokens, tool results included"},
		{"truncated", "bool", "the completion budget ran out"},
		{"task", "map(string, dyn)", "the task spec / reset kwargs / dataset row"},
		{"metadata", "map(string, dyn)", "the env's last metadata ({} when none)"},
		{"text", "string", "the final assistant turn's text"},
	}
}

func celType(name string) *cel.Type {
	switch name {
	case "list(double)":
		return cel.ListType(cel.DoubleType)
	case "double":
		return cel.DoubleType
	case "bool":
		return cel.BoolType
	case "string":
		return cel.StringType
	case "int":
		return cel.IntType
	case "map(string, dyn)":
		return cel.MapType(cel.StringType, cel.DynType)
	}
	panic("reward: no CEL type for " + name)
}

// newCELEnv declares the variables of Variables() plus the strings and
// math extensions (text.lowerAscii(), math.greatest(...)).
func newCELEnv() (*cel.Env, error) {
	opts := []cel.EnvOption{ext.Strings(), ext.Math()}
	for _, v := range Variables() {
		opts = append(opts, cel.Variable(v.Name, celType(v.Type)))
	}
	return cel.NewEnv(opts...)
}

// ExpressionError refuses an expression at startup: it names the reward,
// the expression, the position (1-based) and the variables available.
type ExpressionError struct {
	Reward     string
	Expression string
	Line, Col  int
	Msg        string
}

func (e *ExpressionError) Error() string {
	vars := make([]string, 0, len(Variables()))
	for _, v := range Variables() {
		vars = append(vars, v.Name+" ("+v.Type+")")
	}
	return fmt.Sprintf("reward %q: expression %q at %d:%d: %s; available variables: %s",
		e.Reward, e.Expression, e.Line, e.Col, e.Msg, strings.Join(vars, ", "))
}

// costLimit bounds one evaluation (CEL's runtime cost units), so a
// comprehension over a huge list cannot stall a training step.
const costLimit = 1_000_000

// compileExpression parses and type-checks s.Expression; its result must
// be a number (double, int, uint) or dyn (checked per evaluation).
func compileExpression(env *cel.Env, s Spec) (cel.Program, error) {
	ast, iss := env.Compile(s.Expression)
	if iss != nil && iss.Err() != nil {
		first := iss.Errors()[0]
		msgs := make([]string, 0, len(iss.Errors()))
		for _, e := range iss.Errors() {
			msgs = append(msgs, e.Message)
		}
		return nil, &ExpressionError{Reward: s.Name, Expression: s.Expression,
			Line: first.Location.Line(), Col: first.Location.Column() + 1, Msg: strings.Join(msgs, "; ")}
	}
	switch out := ast.OutputType(); {
	case out.IsExactType(cel.DoubleType), out.IsExactType(cel.IntType), out.IsExactType(cel.UintType), out.IsExactType(cel.DynType):
	default:
		return nil, &ExpressionError{Reward: s.Name, Expression: s.Expression, Line: 1, Col: 1,
			Msg: fmt.Sprintf("the expression has type %s; a reward must be a number (double or int), e.g. cond ? 1.0 : 0.0", out)}
	}
	prg, err := env.Program(ast, cel.CostLimit(costLimit), cel.InterruptCheckFrequency(100))
	if err != nil {
		return nil, fmt.Errorf("reward %q: plan expression %q: %w", s.Name, s.Expression, err)
	}
	return prg, nil
}

// activation builds the variables of one trajectory.
func activation(t *Trajectory, envReward float64) map[string]any {
	task, meta := t.Task, t.Metadata
	if task == nil {
		task = map[string]any{}
	}
	if meta == nil {
		meta = map[string]any{}
	}
	return map[string]any{
		"env_rewards":       t.envRewardValues(),
		"env_reward":        envReward,
		"finished":          t.Finished,
		"outcome":           t.Outcome,
		"num_turns":         int64(t.NumTurns()),
		"num_tool_calls":    int64(t.NumToolCalls),
		"tool_failures":     int64(t.ToolFailures),
		"completion_tokens": int64(t.CompletionTokens),
		"truncated":         t.Truncated,
		"task":              task,
		"metadata":          meta,
		"text":              t.Text(),
	}
}

// evalExpression runs prg for one trajectory. null declines (NaN); any
// other non-number is an error.
func evalExpression(ctx context.Context, prg cel.Program, vars map[string]any) (float64, error) {
	val, _, err := prg.ContextEval(ctx, vars)
	if err != nil {
		return math.NaN(), err
	}
	return numberOf(val)
}

func numberOf(val ref.Val) (float64, error) {
	switch v := val.(type) {
	case types.Double:
		return float64(v), nil
	case types.Int:
		return float64(v), nil
	case types.Uint:
		return float64(v), nil
	case types.Null:
		return math.NaN(), nil
	}
	return math.NaN(), fmt.Errorf("evaluated to %s %v; want a number", val.Type(), val.Value())
}
