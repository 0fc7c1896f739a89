package envs

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

// sleepCtx waits d, or until ctx ends (then it returns ctx's error).
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// withToolLatency returns a copy of env whose every tool call (shared and
// task-scoped) first sleeps d: a built-in env that answers as slowly as a
// real sandbox does, so env-bound training can be measured on a laptop.
func withToolLatency(env *orsserver.Env, d time.Duration) *orsserver.Env {
	if d <= 0 {
		return env
	}
	out := *env
	out.Tools = slowTools(env.Tools, d)
	newInst := env.New
	out.New = func(ctx context.Context, task json.RawMessage, secrets map[string]string) (orsserver.Instance, error) {
		inst, err := newInst(ctx, task, secrets)
		if err != nil {
			return nil, err
		}
		return &slowInstance{inner: inst, d: d}, nil
	}
	return &out
}

func slowTools(tools []orsserver.Tool, d time.Duration) []orsserver.Tool {
	out := make([]orsserver.Tool, len(tools))
	for i, t := range tools {
		call := t.Call
		t.Call = func(ctx context.Context, inst orsserver.Instance, input json.RawMessage) (ors.ToolOutput, error) {
			if err := sleepCtx(ctx, d); err != nil {
				return ors.ToolOutput{}, fmt.Errorf("tool %s: %w", t.Name, err)
			}
			if s, ok := inst.(*slowInstance); ok {
				inst = s.inner // the tool's own code type-asserts its instance
			}
			return call(ctx, inst, input)
		}
		out[i] = t
	}
	return out
}

// slowInstance wraps an instance so its task-scoped tools sleep too; the
// optional hooks it does not have are no-ops, as the server treats them.
type slowInstance struct {
	inner orsserver.Instance
	d     time.Duration
}

func (s *slowInstance) Prompt(ctx context.Context) ([]ors.Block, error) { return s.inner.Prompt(ctx) }

func (s *slowInstance) Setup(ctx context.Context) error {
	if i, ok := s.inner.(orsserver.SetupInstance); ok {
		return i.Setup(ctx)
	}
	return nil
}

func (s *slowInstance) Teardown(ctx context.Context) error {
	if i, ok := s.inner.(orsserver.TeardownInstance); ok {
		return i.Teardown(ctx)
	}
	return nil
}

func (s *slowInstance) TaskTools() []orsserver.Tool {
	if i, ok := s.inner.(orsserver.TaskToolsInstance); ok {
		return slowTools(i.TaskTools(), s.d)
	}
	return nil
}

// withOpenEnvLatency returns a copy of an OpenEnv-native env whose steps
// (a Gym action, or an MCP tool call) first sleep d.
func withOpenEnvLatency(env *openenvserver.Env, d time.Duration) *openenvserver.Env {
	if d <= 0 {
		return env
	}
	out := *env
	newInst := env.New
	out.New = func(ctx context.Context) (openenvserver.Instance, error) {
		inst, err := newInst(ctx)
		if err != nil {
			return nil, err
		}
		switch i := inst.(type) {
		case openenvserver.MCPInstance:
			return &slowMCP{MCPInstance: i, d: d}, nil
		case openenvserver.GymInstance:
			return &slowGym{GymInstance: i, d: d}, nil
		}
		return inst, nil
	}
	return &out
}

type slowMCP struct {
	openenvserver.MCPInstance
	d time.Duration
}

func (s *slowMCP) CallTool(ctx context.Context, name string, args json.RawMessage) (openenvserver.ToolOutput, error) {
	if err := sleepCtx(ctx, s.d); err != nil {
		return openenvserver.ToolOutput{}, fmt.Errorf("tool %s: %w", name, err)
	}
	return s.MCPInstance.CallTool(ctx, name, args)
}

func (s *slowMCP) Close(ctx context.Context) error { return closeInstance(ctx, s.MCPInstance) }

type slowGym struct {
	openenvserver.GymInstance
	d time.Duration
}

func (s *slowGym) Step(ctx context.Context, action json.RawMessage) (openenvserver.Observation, error) {
	if err := sleepCtx(ctx, s.d); err != nil {
		return openenvserver.Observation{}, fmt.Errorf("step: %w", err)
	}
	return s.GymInstance.Step(ctx, action)
}

func (s *slowGym) Close(ctx context.Context) error { return closeInstance(ctx, s.GymInstance) }

func closeInstance(ctx context.Context, inst openenvserver.Instance) error {
	if c, ok := inst.(openenvserver.ClosingInstance); ok {
		return c.Close(ctx)
	}
	return nil
}
