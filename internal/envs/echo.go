package envs

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

// EchoEnvName is the ORS name of the echo env: the TRL test fixture's
// EchoEnvironment, lowercased (ors-protocol.md §13).
const EchoEnvName = "echoenvironment"

var echoTargets = []string{"hello", "world", "trl", "openreward"}

// EchoParams are the echo tool's arguments.
type EchoParams struct {
	Text string `json:"text"`
}

// HintParams: the hint tool takes none, but declares an empty model as the
// fixture does.
type HintParams struct{}

type echoTask struct {
	ID     string `json:"id"`
	Target string `json:"target"`
}

// echoSession is one echo episode.
type echoSession struct{ task echoTask }

func (e *echoSession) Prompt(context.Context) ([]ors.Block, error) {
	return []ors.Block{ors.TextBlock(fmt.Sprintf("Call the `echo` tool with text='%s' to win.", e.task.Target))}, nil
}

// TaskTools adds hint, listed only by /task_tools (the trl#5727 regression).
func (e *echoSession) TaskTools() []orsserver.Tool { return []orsserver.Tool{hintTool} }

var hintTool = orsserver.NewTool("hint", "Get a hint about how to win.",
	func(_ context.Context, _ *echoSession, _ HintParams) (ors.ToolOutput, error) {
		return ors.ToolOutput{Blocks: []ors.Block{ors.TextBlock("try echo(text=...)")}}, nil
	})

// Echo returns the echo environment: split train with 4 tasks, shared tool
// echo(text) (reward 1.0 and finished on a match, else 0.0) and the
// task-scoped tool hint.
func Echo() *orsserver.Env {
	return &orsserver.Env{
		Name:        EchoEnvName,
		Description: "the TRL test fixture: echo the task's target word (4 tasks, tools echo and task-scoped hint)",
		Splits:      []ors.Split{{Name: "train", Type: "train"}},
		ListTasks: func(_ context.Context, _ string) ([]json.RawMessage, error) {
			out := make([]json.RawMessage, len(echoTargets))
			for i, t := range echoTargets {
				out[i] = mustJSON(echoTask{ID: fmt.Sprintf("echo-%d", i), Target: t})
			}
			return out, nil
		},
		Tools: []orsserver.Tool{orsserver.NewTool("echo", "Echo the given text back. Echoing the task's target wins.",
			func(_ context.Context, e *echoSession, p EchoParams) (ors.ToolOutput, error) {
				if p.Text == e.task.Target {
					return ors.ToolOutput{Blocks: []ors.Block{ors.TextBlock("match")}, Reward: ors.Reward(1), Finished: true}, nil
				}
				return ors.ToolOutput{Blocks: []ors.Block{ors.TextBlock(fmt.Sprintf("no match (got '%s')", p.Text))}, Reward: ors.Reward(0)}, nil
			})},
		New: func(_ context.Context, task json.RawMessage, _ map[string]string) (orsserver.Instance, error) {
			var t echoTask
			if err := json.Unmarshal(task, &t); err != nil {
				return nil, &orsserver.HTTPError{Status: 400, Detail: "echo task spec must be {\"id\":..,\"target\":..}: " + err.Error()}
			}
			return &echoSession{task: t}, nil
		},
	}
}

func mustJSON(v any) json.RawMessage {
	b, err := ors.MarshalJSON(v)
	if err != nil {
		panic(err) // only called on fixed struct types
	}
	return b
}
