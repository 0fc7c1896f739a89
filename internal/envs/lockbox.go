package envs

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

// LockboxEnvName is the ORS name of the lockbox env.
const LockboxEnvName = "lockbox"

// Lockbox tool names.
const (
	LockboxOpenTool   = "open_envelope"
	LockboxUnlockTool = "unlock"
)

// LockboxPrompt is every lockbox task's prompt.
const LockboxPrompt = "Open the envelope, then unlock the box with the code inside."

// lockboxCodeLen is the number of digits of a code: one, so a 2-layer
// byte-level model learns to copy it from the tool's answer within the
// CPU demo's minutes (three digits needed many times the SFT steps). The
// prompt is the same for every task, so no code can be memorised: the
// policy must read it.
const lockboxCodeLen = 1

// The split sizes and the seeds of the splits' code draws.
const (
	lockboxTrainTasks      = 256
	lockboxValidationTasks = 64
	lockboxSeed1           = 0x10cb0c
	lockboxSeed2           = 17
)

// unlockSchema is the unlock tool's input schema, hand-written without the
// titles the kit derives: the schema is rendered into a byte-level model's
// prompt.
const unlockSchema = `{"properties":{"code":{"type":"string"}},"required":["code"],"type":"object"}`

type unlockParams struct {
	Code string `json:"code"`
}

type lockboxTask struct {
	ID   string `json:"id"`
	Code string `json:"code"`
}

// lockboxTasks are the tasks of split (nil for an unknown split): 256
// train and 64 validation tasks, each with a code drawn from the split's
// own fixed stream.
func lockboxTasks(split string) []lockboxTask {
	var n int
	var prefix string
	var stream uint64
	switch split {
	case "train":
		n, prefix, stream = lockboxTrainTasks, "lockbox-", lockboxSeed2
	case "validation":
		n, prefix, stream = lockboxValidationTasks, "lockbox-validation-", lockboxSeed2+1
	default:
		return nil
	}
	r := rand.New(rand.NewPCG(lockboxSeed1, stream))
	out := make([]lockboxTask, n)
	for i := range out {
		code := make([]byte, lockboxCodeLen)
		for j := range code {
			code[j] = byte('0' + r.IntN(10))
		}
		out[i] = lockboxTask{ID: fmt.Sprintf("%s%d", prefix, i), Code: string(code)}
	}
	return out
}

// LockboxScore is the reward of unlocking the box whose code is code with
// submitted: 0.25 when the envelope was opened first, plus 0.75 times the
// positions where submitted has the code's character, over the longer of
// the two lengths (so padding a guess with more digits earns nothing).
func LockboxScore(code, submitted string, opened bool) float64 {
	score := 0.0
	if opened {
		score = 0.25
	}
	return score + 0.75*float64(lockboxHits(code, submitted))/float64(max(lockboxCodeLen, len(submitted)))
}

// lockboxHits counts the positions i < lockboxCodeLen where code and
// submitted agree.
func lockboxHits(code, submitted string) int {
	hits := 0
	for i := range min(lockboxCodeLen, len(code), len(submitted)) {
		if code[i] == submitted[i] {
			hits++
		}
	}
	return hits
}

// lockboxSession is one episode: whether the envelope was opened, and
// whether the box was tried (which ends the episode).
type lockboxSession struct {
	task lockboxTask

	mu       sync.Mutex
	opened   bool
	finished bool
}

func (l *lockboxSession) Prompt(context.Context) ([]ors.Block, error) {
	return []ors.Block{ors.TextBlock(LockboxPrompt)}, nil
}

// errEpisodeOver answers a call after unlock: a tool error, no reward.
func errEpisodeOver() error { return &orsserver.InputError{Detail: "the episode is over"} }

func (l *lockboxSession) open() (ors.ToolOutput, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.finished {
		return ors.ToolOutput{}, errEpisodeOver()
	}
	l.opened = true
	return ors.ToolOutput{Blocks: []ors.Block{ors.TextBlock("code: " + l.task.Code)}}, nil
}

func (l *lockboxSession) unlock(code string) (ors.ToolOutput, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.finished {
		return ors.ToolOutput{}, errEpisodeOver()
	}
	l.finished = true
	text := "unlocked"
	if code != l.task.Code {
		text = "wrong code"
	}
	score := LockboxScore(l.task.Code, code, l.opened)
	return ors.ToolOutput{Blocks: []ors.Block{ors.TextBlock(text)}, Reward: ors.Reward(score), Finished: true}, nil
}

// Lockbox returns the two-turn tool env: open_envelope reads the task's
// one-digit code, unlock(code) scores it (partial credit) and ends the
// episode.
func Lockbox() *orsserver.Env {
	unlock := orsserver.NewTool(LockboxUnlockTool, "Try a code. Ends the episode.",
		func(_ context.Context, l *lockboxSession, p unlockParams) (ors.ToolOutput, error) {
			return l.unlock(p.Code)
		})
	unlock.InputSchema = json.RawMessage(unlockSchema)
	return &orsserver.Env{
		Name:        LockboxEnvName,
		Description: "two-turn tool use a tiny model learns on a CPU: open_envelope reads a one-digit code, unlock(code) scores it",
		Splits:      []ors.Split{{Name: "train", Type: "train"}, {Name: "validation", Type: "validation"}},
		ListTasks: func(_ context.Context, split string) ([]json.RawMessage, error) {
			tasks := lockboxTasks(split)
			out := make([]json.RawMessage, len(tasks))
			for i, t := range tasks {
				out[i] = mustJSON(t)
			}
			return out, nil
		},
		Tools: []orsserver.Tool{
			orsserver.NewToolNoInput(LockboxOpenTool, "Read the code.",
				func(_ context.Context, l *lockboxSession) (ors.ToolOutput, error) { return l.open() }),
			unlock,
		},
		New: func(_ context.Context, task json.RawMessage, _ map[string]string) (orsserver.Instance, error) {
			var t lockboxTask
			if err := json.Unmarshal(task, &t); err != nil || !isCode(t.Code) {
				return nil, &orsserver.HTTPError{Status: 400, Detail: `lockbox task spec must be {"id":..,"code":"<digit>"}`}
			}
			return &lockboxSession{task: t}, nil
		},
	}
}

func isCode(s string) bool {
	if len(s) != lockboxCodeLen {
		return false
	}
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
