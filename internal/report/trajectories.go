package report

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
)

// trajectory is the part of one trajectories.jsonl line the report shows
// (train.TrajectoryRecord; unknown fields are ignored so the trainer can
// add fields without breaking reports).
type trajectory struct {
	Step         int        `json:"step"`
	Env          int        `json:"env"`
	Split        string     `json:"split"`
	TaskIndex    int        `json:"task_index"`
	Prompt       string     `json:"prompt"`
	Turns        []turn     `json:"turns"`
	Rewards      []*float64 `json:"rewards"`
	Reward       float64    `json:"reward"`
	Advantage    float64    `json:"advantage"`
	Outcome      string     `json:"outcome"`
	Error        string     `json:"error"`
	ToolCalls    int        `json:"tool_calls"`
	ToolFailures int        `json:"tool_failures"`
	FormatErrors int        `json:"format_errors"`
	PromptTokens int        `json:"prompt_tokens"`
	Completion   int        `json:"completion_tokens"`
	Seconds      float64    `json:"seconds"`
}

type turn struct {
	Role      string     `json:"role"`
	Text      string     `json:"text"`
	ToolCalls []toolCall `json:"tool_calls"`
	Tool      string     `json:"tool"`
	Reward    *float64   `json:"reward"`
	Finished  bool       `json:"finished"`
	Error     string     `json:"error"`
	// FormatError: the assistant wrote a tool call that did not parse.
	FormatError bool `json:"format_error"`
}

type toolCall struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// group is the rollouts of one prompt in one step (env, task index): GRPO's
// group. Only its best and worst rollouts are kept.
type group struct {
	Env        string
	TaskIndex  int
	Split      string
	Size       int
	rewardSum  float64
	Best       *trajectory
	Worst      *trajectory
	minReward  float64
	maxReward  float64
	firstIndex int // order of appearance, for a stable layout
}

// MeanReward is the group's mean reward.
func (g *group) MeanReward() float64 { return g.rewardSum / float64(g.Size) }

// Spread is the difference between the best and worst reward.
func (g *group) Spread() float64 { return g.maxReward - g.minReward }

// stepSample is the groups shown for one step.
type stepSample struct {
	Step      int
	Rollouts  int
	Groups    []*group // shown groups, most informative first
	AllGroups int
}

// trajectorySample bounds what trajectories.jsonl contributes to the page:
// at most maxSteps steps (spread over the run, always the last), at most
// maxGroups groups per step, best and worst rollout of each.
type trajectorySample struct {
	Steps     []*stepSample
	Skipped   int // lines that did not decode
	TotalRuns int
	Outcomes  map[string]int // rollouts per outcome, over every line
}

func readTrajectories(ctx context.Context, dir string, m *manifest, maxSteps, maxGroups int) (*trajectorySample, error) {
	path := filepath.Join(dir, trajectoriesFile)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return &trajectorySample{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open trajectories: %w", err)
	}
	defer f.Close()

	// First pass: which steps exist. stepOnly decodes only the step and
	// the outcome (counted in the second pass), not the conversation.
	var stepOnly struct {
		Step    int    `json:"step"`
		Outcome string `json:"outcome"`
	}
	seen := map[int]bool{}
	if _, err := eachLine(ctx, f, maxLineBytes, func(line []byte) {
		stepOnly.Step = 0
		if json.Unmarshal(line, &stepOnly) == nil {
			seen[stepOnly.Step] = true
		}
	}); err != nil {
		return nil, fmt.Errorf("read %s: %w", trajectoriesFile, err)
	}
	all := make([]int, 0, len(seen))
	for s := range seen {
		all = append(all, s)
	}
	sort.Ints(all)
	chosen := map[int]*stepSample{}
	out := &trajectorySample{Outcomes: map[string]int{}}
	for _, s := range spread(all, maxSteps) {
		ss := &stepSample{Step: s}
		chosen[s] = ss
		out.Steps = append(out.Steps, ss)
	}

	// Second pass: keep best and worst of each group of the chosen steps.
	if _, err := f.Seek(0, 0); err != nil {
		return nil, fmt.Errorf("rewind %s: %w", trajectoriesFile, err)
	}
	groups := map[int]map[string]*group{}
	tooLong, err := eachLine(ctx, f, maxLineBytes, func(line []byte) {
		out.TotalRuns++
		stepOnly.Step, stepOnly.Outcome = 0, ""
		if json.Unmarshal(line, &stepOnly) != nil {
			out.Skipped++
			return
		}
		out.Outcomes[stepOnly.Outcome]++
		ss := chosen[stepOnly.Step]
		if ss == nil {
			return
		}
		var t trajectory
		if err := json.Unmarshal(line, &t); err != nil {
			out.Skipped++
			return
		}
		ss.Rollouts++
		key := fmt.Sprintf("%d/%s/%d", t.Env, t.Split, t.TaskIndex)
		byKey := groups[t.Step]
		if byKey == nil {
			byKey = map[string]*group{}
			groups[t.Step] = byKey
		}
		g := byKey[key]
		if g == nil {
			g = &group{Env: m.envName(t.Env), TaskIndex: t.TaskIndex, Split: t.Split,
				minReward: math.Inf(1), maxReward: math.Inf(-1), firstIndex: len(byKey)}
			byKey[key] = g
		}
		g.Size++
		g.rewardSum += t.Reward
		tt := t
		if t.Reward > g.maxReward || g.Best == nil {
			g.maxReward, g.Best = t.Reward, &tt
		}
		if t.Reward < g.minReward || g.Worst == nil {
			g.minReward, g.Worst = t.Reward, &tt
		}
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", trajectoriesFile, err)
	}
	out.Skipped += tooLong
	out.TotalRuns += tooLong
	for _, ss := range out.Steps {
		var gs []*group
		for _, g := range groups[ss.Step] {
			gs = append(gs, g)
		}
		// Groups whose rollouts differ most teach the most; ties keep the
		// order they were written in.
		sort.Slice(gs, func(i, j int) bool {
			if gs[i].Spread() != gs[j].Spread() {
				return gs[i].Spread() > gs[j].Spread()
			}
			return gs[i].firstIndex < gs[j].firstIndex
		})
		ss.AllGroups = len(gs)
		if len(gs) > maxGroups {
			gs = gs[:maxGroups]
		}
		ss.Groups = gs
	}
	return out, nil
}

// spread picks at most n of the sorted values, evenly spaced, always
// including the first and the last.
func spread(sorted []int, n int) []int {
	if len(sorted) <= n {
		return sorted
	}
	if n <= 1 {
		return sorted[len(sorted)-1:]
	}
	out := make([]int, 0, n)
	for i := range n {
		idx := int(math.Round(float64(i) * float64(len(sorted)-1) / float64(n-1)))
		if len(out) == 0 || out[len(out)-1] != sorted[idx] {
			out = append(out, sorted[idx])
		}
	}
	return out
}
