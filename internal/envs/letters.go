package envs

import (
	"context"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

// LettersEnvName is the ORS name of the letters env.
const LettersEnvName = "letters"

// SubmitParams are the submit tool's arguments.
type SubmitParams struct {
	Answer string `json:"answer" desc:"the answer: a string of characters"`
}

type lettersTask struct {
	ID     string `json:"id"`
	Target string `json:"target"`
}

// lettersSplits: train and validation all name "a", so a tiny policy learns
// without reading the prompt (design.md, last section); mixed names a..z.
func lettersTasks(split string) []lettersTask {
	var out []lettersTask
	switch split {
	case "train":
		for i := range 64 {
			out = append(out, lettersTask{ID: fmt.Sprintf("letters-%d", i), Target: "a"})
		}
	case "validation":
		for i := range 16 {
			out = append(out, lettersTask{ID: fmt.Sprintf("letters-validation-%d", i), Target: "a"})
		}
	case "mixed":
		for i := range 26 {
			out = append(out, lettersTask{ID: fmt.Sprintf("letters-mixed-%d", i), Target: string(rune('a' + i))})
		}
	}
	return out
}

type lettersSession struct{ task lettersTask }

func (l *lettersSession) Prompt(context.Context) ([]ors.Block, error) {
	return []ors.Block{ors.TextBlock(fmt.Sprintf("Call the `submit` tool with an answer made only of the letter '%s'.", l.task.Target))}, nil
}

// LettersScore is the fraction of answer's characters equal to target
// (0 for an empty answer).
func LettersScore(answer, target string) float64 {
	want, _ := utf8.DecodeRuneInString(target)
	n, hits := 0, 0
	for _, r := range answer {
		n++
		if r == want {
			hits++
		}
	}
	if n == 0 {
		return 0
	}
	return float64(hits) / float64(n)
}

// Letters returns the dense-reward letters environment.
func Letters() *orsserver.Env {
	return &orsserver.Env{
		Name:        LettersEnvName,
		Description: "dense reward a tiny model learns on a CPU: submit an answer made of the target letter",
		Splits:      []ors.Split{{Name: "train", Type: "train"}, {Name: "validation", Type: "validation"}, {Name: "mixed", Type: "validation"}},
		ListTasks: func(_ context.Context, split string) ([]json.RawMessage, error) {
			tasks := lettersTasks(split)
			out := make([]json.RawMessage, len(tasks))
			for i, t := range tasks {
				out[i] = mustJSON(t)
			}
			return out, nil
		},
		Tools: []orsserver.Tool{orsserver.NewTool("submit", "Submit an answer. The reward is the fraction of its characters equal to the target letter; the episode ends.",
			func(_ context.Context, l *lettersSession, p SubmitParams) (ors.ToolOutput, error) {
				score := LettersScore(p.Answer, l.task.Target)
				text := fmt.Sprintf("score %.3f: %d characters, target '%s'", score, utf8.RuneCountInString(p.Answer), l.task.Target)
				return ors.ToolOutput{Blocks: []ors.Block{ors.TextBlock(text)}, Reward: ors.Reward(score), Finished: true}, nil
			})},
		New: func(_ context.Context, task json.RawMessage, _ map[string]string) (orsserver.Instance, error) {
			var t lettersTask
			if err := json.Unmarshal(task, &t); err != nil || utf8.RuneCountInString(t.Target) != 1 {
				return nil, &orsserver.HTTPError{Status: 400, Detail: `letters task spec must be {"id":..,"target":"<one character>"}`}
			}
			return &lettersSession{task: t}, nil
		},
	}
}
