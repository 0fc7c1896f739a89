package openenvserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/ortrain/ortrain/internal/openenv"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

// FromORS serves an orsserver env over OpenEnv as an MCP env. Reset picks
// the task with the reset arguments OpenEnv's ORS import uses: task_spec (a
// task object, used as is), else split (default: the first split) and
// index (default: seed modulo the split's size, else 0); secrets (an object
// of strings) reach the env's constructor. episode_id defaults to a fresh
// uuid4. The reset observation is {"prompt": text, "split", "index"}; the
// env's shared and task-scoped tools become MCP tools; a tool's reward and
// finished become the step's reward and done. A tool call before any reset
// opens the default task's episode first, so JSON-RPC tools/call works
// without a reset as on OpenEnv's own MCP envs (tools/list stays free of
// side effects: the shared tools until an episode is open).
func FromORS(env *orsserver.Env) *Env {
	return &Env{
		Name:               env.Name,
		Description:        env.Description,
		MCP:                true,
		ConcurrentSessions: true,
		ResetKwargs:        []string{"seed", "episode_id", "split", "index", "task_spec", "secrets"},
		StateSchema:        json.RawMessage(baseStateSchema),
		New: func(context.Context) (Instance, error) {
			return &orsInstance{env: env}, nil
		},
	}
}

// orsInstance is one OpenEnv session over an ORS env: each reset builds a
// fresh ORS instance for the chosen task.
type orsInstance struct {
	env       *orsserver.Env
	inst      orsserver.Instance
	episodeID *string
	steps     int
	split     string
	index     int
}

type orsState struct {
	EpisodeID *string `json:"episode_id"`
	StepCount int     `json:"step_count"`
	Split     string  `json:"split,omitempty"`
	Index     *int    `json:"index,omitempty"`
}

func (o *orsInstance) Reset(ctx context.Context, kwargs map[string]json.RawMessage) (Observation, error) {
	task, split, index, err := o.pickTask(ctx, kwargs)
	if err != nil {
		return Observation{}, err
	}
	episodeID, err := EpisodeID(kwargs)
	if err != nil {
		return Observation{}, err
	}
	var secrets map[string]string
	if raw, ok := kwargs["secrets"]; ok && string(raw) != "null" {
		if json.Unmarshal(raw, &secrets) != nil {
			return Observation{}, errors.New("secrets must be an object of strings")
		}
	}
	if err := o.Close(ctx); err != nil {
		return Observation{}, fmt.Errorf("tear down the previous episode: %w", err)
	}
	inst, err := o.env.New(ctx, task, secrets)
	if err != nil {
		return Observation{}, fmt.Errorf("create %s instance: %w", o.env.Name, err)
	}
	if su, ok := inst.(orsserver.SetupInstance); ok {
		if err := su.Setup(ctx); err != nil {
			teardown(ctx, inst)
			return Observation{}, fmt.Errorf("set up %s instance: %w", o.env.Name, err)
		}
	}
	blocks, err := inst.Prompt(ctx)
	if err != nil {
		teardown(ctx, inst)
		return Observation{}, fmt.Errorf("%s prompt: %w", o.env.Name, err)
	}
	o.inst, o.steps, o.split, o.index, o.episodeID = inst, 0, split, index, &episodeID
	var text []string
	for _, b := range blocks {
		if b.Type == "text" {
			text = append(text, b.Text)
		}
	}
	return Observation{Fields: map[string]any{"prompt": strings.Join(text, "\n"), "split": split, "index": index}, Reward: Reward(0)}, nil
}

func (o *orsInstance) pickTask(ctx context.Context, kwargs map[string]json.RawMessage) (json.RawMessage, string, int, error) {
	if spec, ok := kwargs["task_spec"]; ok {
		if firstByte(spec) != '{' {
			return nil, "", 0, errors.New("task_spec must be a JSON object")
		}
		return spec, "", -1, nil
	}
	split := o.env.Splits[0].Name
	if raw, ok := kwargs["split"]; ok && json.Unmarshal(raw, &split) != nil {
		return nil, "", 0, errors.New("split must be a string")
	}
	known := false
	for _, s := range o.env.Splits {
		known = known || s.Name == split
	}
	if !known {
		return nil, "", 0, fmt.Errorf("unknown split %q", split)
	}
	var tasks []json.RawMessage
	n := 0
	if o.env.ListTasks != nil {
		var err error
		if tasks, err = o.env.ListTasks(ctx, split); err != nil {
			return nil, "", 0, fmt.Errorf("list tasks of split %q: %w", split, err)
		}
		n = len(tasks)
	} else {
		var err error
		if n, err = o.env.NumTasks(ctx, split); err != nil {
			return nil, "", 0, fmt.Errorf("count tasks of split %q: %w", split, err)
		}
	}
	if n == 0 {
		return nil, "", 0, fmt.Errorf("split %q has no tasks", split)
	}
	index := 0
	if raw, ok := kwargs["index"]; ok {
		if json.Unmarshal(raw, &index) != nil || index < 0 || index >= n {
			return nil, "", 0, fmt.Errorf("index must be an integer in [0, %d) for split %q", n, split)
		}
	} else if raw, ok := kwargs["seed"]; ok {
		var seed int
		if json.Unmarshal(raw, &seed) != nil {
			return nil, "", 0, errors.New("seed must be an integer")
		}
		index = ((seed % n) + n) % n
	}
	if tasks != nil {
		return tasks[index], split, index, nil
	}
	task, err := o.env.GetTask(ctx, split, index)
	if err != nil {
		return nil, "", 0, fmt.Errorf("get task %d of split %q: %w", index, split, err)
	}
	return task, split, index, nil
}

func (o *orsInstance) State(context.Context) (json.RawMessage, error) {
	st := orsState{EpisodeID: o.episodeID, StepCount: o.steps, Split: o.split}
	if o.inst != nil && o.index >= 0 {
		st.Index = &o.index
	}
	return mustMarshal(st), nil
}

func (o *orsInstance) tools() []orsserver.Tool {
	tools := append([]orsserver.Tool(nil), o.env.Tools...)
	if tt, ok := o.inst.(orsserver.TaskToolsInstance); ok && o.inst != nil {
		tools = append(tools, tt.TaskTools()...)
	}
	return tools
}

// ListTools lists the shared tools, and after reset the task's tools too.
func (o *orsInstance) ListTools(context.Context) ([]openenv.Tool, error) {
	o.steps++
	var out []openenv.Tool
	for _, t := range o.tools() {
		schema := t.InputSchema
		if schema == nil {
			schema = json.RawMessage(`{"properties":{},"type":"object"}`)
		}
		out = append(out, openenv.Tool{Name: t.Name, Description: t.Description, InputSchema: schema})
	}
	return out, nil
}

func (o *orsInstance) CallTool(ctx context.Context, name string, args json.RawMessage) (ToolOutput, error) {
	if o.inst == nil {
		// No reset yet: open the default task's episode, as a reset without
		// arguments would.
		if _, err := o.Reset(ctx, nil); err != nil {
			return ToolOutput{}, fmt.Errorf("open the default task (no reset was called): %w", err)
		}
	}
	o.steps++
	for _, t := range o.tools() {
		if t.Name != name {
			continue
		}
		out, err := t.Call(ctx, o.inst, args)
		var ie *orsserver.InputError
		if errors.As(err, &ie) {
			return ToolOutput{}, &ToolError{Type: openenv.ToolInvalidArgs, Message: ie.Error()}
		}
		if err != nil {
			return ToolOutput{}, err
		}
		return ToolOutput{Value: out.Text(), Reward: out.Reward, Done: out.Finished}, nil
	}
	return ToolOutput{}, UnknownTool(name)
}

// Close tears down the current ORS instance.
func (o *orsInstance) Close(ctx context.Context) error {
	if o.inst == nil {
		return nil
	}
	inst := o.inst
	o.inst = nil
	if td, ok := inst.(orsserver.TeardownInstance); ok {
		return td.Teardown(ctx)
	}
	return nil
}

func teardown(ctx context.Context, inst orsserver.Instance) {
	if td, ok := inst.(orsserver.TeardownInstance); ok {
		_ = td.Teardown(ctx)
	}
}
