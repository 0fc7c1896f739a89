package orsserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

// upperSession is one episode of a toy env: shout the task's word.
type upperSession struct{ word string }

func (u *upperSession) Prompt(context.Context) ([]ors.Block, error) {
	return []ors.Block{ors.TextBlock("Say " + u.word + " in capitals.")}, nil
}

// AnswerParams become the tool's JSON Schema.
type AnswerParams struct {
	Text string `json:"text" desc:"your answer"`
}

// Declaring an environment: splits, tasks, a constructor and typed tools.
func ExampleNewTool() {
	env := &orsserver.Env{
		Name:   "Upper",
		Splits: []ors.Split{{Name: "train"}},
		ListTasks: func(context.Context, string) ([]json.RawMessage, error) {
			return []json.RawMessage{json.RawMessage(`{"word":"hello"}`)}, nil
		},
		Tools: []orsserver.Tool{orsserver.NewTool("answer", "Submit the answer.",
			func(_ context.Context, u *upperSession, p AnswerParams) (ors.ToolOutput, error) {
				ok := p.Text == strings.ToUpper(u.word)
				r := 0.0
				if ok {
					r = 1
				}
				return ors.ToolOutput{Blocks: []ors.Block{ors.TextBlock(fmt.Sprint(ok))}, Reward: ors.Reward(r), Finished: true}, nil
			})},
		New: func(_ context.Context, task json.RawMessage, _ map[string]string) (orsserver.Instance, error) {
			var t struct{ Word string }
			err := json.Unmarshal(task, &t)
			return &upperSession{word: t.Word}, err
		},
	}
	srv, err := orsserver.New(orsserver.Options{}, env)
	if err != nil {
		panic(err)
	}
	defer srv.Shutdown(context.Background())
	fmt.Println(srv.EnvNames())
	fmt.Println(string(env.Tools[0].InputSchema))
	// Output:
	// [upper]
	// {"properties":{"text":{"description":"your answer","title":"Text","type":"string"}},"required":["text"],"title":"AnswerParams","type":"object"}
}
