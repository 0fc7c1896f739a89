package envs

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

// LadderEnvName is the ORS name of the ladder env.
const LadderEnvName = "ladder"

// LadderLevels is the number of difficulty levels above 0.
const LadderLevels = 8

// ladderTask asks for an answer with at least Level copies of the letter
// 'a': level 0 passes with any answer, level 8 needs eight. The reward is 1 or 0, so a task the policy always
// or never solves gives uniform groups: the env that dynamic sampling and
// the curriculum are measured on (scripts/bench-curriculum).
type ladderTask struct {
	ID    string `json:"id"`
	Level int    `json:"level"`
}

// ladderTasks: train cycles through the levels (72 tasks, 8 per level),
// validation holds 2 per level.
func ladderTasks(split string) []ladderTask {
	n := map[string]int{"train": 8, "validation": 2}[split]
	var out []ladderTask
	for i := range n * (LadderLevels + 1) {
		out = append(out, ladderTask{ID: fmt.Sprintf("ladder-%s-%d", split, i), Level: i % (LadderLevels + 1)})
	}
	return out
}

// LadderPasses reports whether answer clears level: it holds at least
// level copies of 'a' (an empty answer clears nothing).
func LadderPasses(answer string, level int) bool {
	return answer != "" && strings.Count(answer, "a") >= level
}

type ladderSession struct{ task ladderTask }

func (l *ladderSession) Prompt(context.Context) ([]ors.Block, error) {
	return []ors.Block{ors.TextBlock(fmt.Sprintf("Call the `submit` tool with an answer that holds the letter 'a' at least %d times.", l.task.Level))}, nil
}

// Ladder returns the graded-difficulty env: binary rewards over tasks of
// nine levels of one skill, which a tiny model learns on a CPU.
func Ladder() *orsserver.Env {
	return &orsserver.Env{
		Name:        LadderEnvName,
		Description: "graded difficulty, binary reward: submit an answer with at least `level` copies of 'a' (levels 0-8)",
		Splits:      []ors.Split{{Name: "train", Type: "train"}, {Name: "validation", Type: "validation"}},
		ListTasks: func(_ context.Context, split string) ([]json.RawMessage, error) {
			tasks := ladderTasks(split)
			out := make([]json.RawMessage, len(tasks))
			for i, t := range tasks {
				out[i] = mustJSON(t)
			}
			return out, nil
		},
		Tools: []orsserver.Tool{orsserver.NewTool("submit", "Submit an answer. The reward is 1 when it holds the letter 'a' at least as many times as the task's level, else 0; the episode ends.",
			func(_ context.Context, l *ladderSession, p SubmitParams) (ors.ToolOutput, error) {
				reward := 0.0
				if LadderPasses(p.Answer, l.task.Level) {
					reward = 1
				}
				text := fmt.Sprintf("reward %.0f: %d of %d characters are 'a', level %d needs %d", reward,
					strings.Count(p.Answer, "a"), utf8.RuneCountInString(p.Answer), l.task.Level, l.task.Level)
				return ors.ToolOutput{Blocks: []ors.Block{ors.TextBlock(text)}, Reward: ors.Reward(reward), Finished: true}, nil
			})},
		New: func(_ context.Context, task json.RawMessage, _ map[string]string) (orsserver.Instance, error) {
			var t ladderTask
			if err := json.Unmarshal(task, &t); err != nil || t.Level < 0 || t.Level > LadderLevels {
				return nil, &orsserver.HTTPError{Status: 400, Detail: fmt.Sprintf(`ladder task spec must be {"id":..,"level":0..%d}`, LadderLevels)}
			}
			return &ladderSession{task: t}, nil
		},
	}
}
