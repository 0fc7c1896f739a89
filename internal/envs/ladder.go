package envs

import (
	"context"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

// LadderEnvName is the ORS name of the ladder env.
const LadderEnvName = "ladder"

// LadderLevels is the number of difficulty levels above 0.
const LadderLevels = 8

// ladderTask asks for an answer whose fraction of the letter 'a' is at
// least Level/LadderLevels: level 0 passes with any answer, level 8 only
// with nothing but 'a'. The reward is 1 or 0, so a task the policy always
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

// LadderPasses reports whether answer clears level: at least level/8 of
// its characters are 'a' (an empty answer clears nothing).
func LadderPasses(answer string, level int) bool {
	n := utf8.RuneCountInString(answer)
	return n > 0 && LettersScore(answer, "a")*LadderLevels >= float64(level)-1e-9
}

type ladderSession struct{ task ladderTask }

func (l *ladderSession) Prompt(context.Context) ([]ors.Block, error) {
	return []ors.Block{ors.TextBlock(fmt.Sprintf("Call the `submit` tool with an answer in which at least %d of every %d characters are the letter 'a'.", l.task.Level, LadderLevels))}, nil
}

// Ladder returns the graded-difficulty env: binary rewards over tasks of
// nine levels of one skill, which a tiny model learns on a CPU.
func Ladder() *orsserver.Env {
	return &orsserver.Env{
		Name:        LadderEnvName,
		Description: "graded difficulty, binary reward: submit an answer in which at least level/8 of the characters are 'a' (levels 0-8)",
		Splits:      []ors.Split{{Name: "train", Type: "train"}, {Name: "validation", Type: "validation"}},
		ListTasks: func(_ context.Context, split string) ([]json.RawMessage, error) {
			tasks := ladderTasks(split)
			out := make([]json.RawMessage, len(tasks))
			for i, t := range tasks {
				out[i] = mustJSON(t)
			}
			return out, nil
		},
		Tools: []orsserver.Tool{orsserver.NewTool("submit", "Submit an answer. The reward is 1 when at least level/8 of its characters are 'a', else 0; the episode ends.",
			func(_ context.Context, l *ladderSession, p SubmitParams) (ors.ToolOutput, error) {
				reward := 0.0
				if LadderPasses(p.Answer, l.task.Level) {
					reward = 1
				}
				text := fmt.Sprintf("reward %.0f: %.3f of %d characters are 'a', level %d needs %d/%d", reward,
					LettersScore(p.Answer, "a"), utf8.RuneCountInString(p.Answer), l.task.Level, l.task.Level, LadderLevels)
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
