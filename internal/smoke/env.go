package smoke

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ortrain/ortrain/internal/envtarget"
	"github.com/ortrain/ortrain/internal/train"
)

// envCallTimeout bounds each env call of the session check.
const envCallTimeout = 2 * time.Minute

// env checks envs[i] as a rollout uses it: connect, count its tasks, open a
// session on its first task, read the prompt and the session's tools
// (task-scoped ones included), call the first tool with the smallest
// input its schema accepts, and close the session. A tool that refuses
// the input (a *envtarget.ToolError, which the model would see) passes;
// a call that breaks the session does not.
func (s *suite) env(i int) {
	ec := s.cfg.Envs[i]
	name := fmt.Sprintf("envs[%d] %s: session and tools", i, ec.Target)
	s.check(name, "connects, has tasks in its split, opens a session, gives a prompt and tools, answers a tool call, closes", func() (string, bool) {
		conn, indices, err := train.ConnectEnv(s.ctx, ec, s.o.Getenv, s.o.Logger)
		if err != nil {
			return err.Error(), false
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), envCallTimeout)
			defer cancel()
			_ = conn.Close(cctx)
		}()
		if len(indices) == 0 {
			return fmt.Sprintf("split %q has no tasks", ec.Split), false
		}
		ctx, cancel := context.WithTimeout(s.ctx, envCallTimeout)
		defer cancel()
		sess, err := conn.OpenSession(ctx, envtarget.TaskRef{Split: ec.Split, Index: indices[0], Secrets: ec.Secrets})
		if err != nil {
			return fmt.Sprintf("open a session on task %d: %v", indices[0], err), false
		}
		observed, ok := useSession(ctx, sess)
		if err := sess.Close(ctx); err != nil {
			return fmt.Sprintf("%s; close the session: %v", observed, err), false
		}
		return fmt.Sprintf("%s %s, %d tasks: %s", conn.Protocol(), conn.Name(), len(indices), observed), ok
	})
}

func useSession(ctx context.Context, sess envtarget.Session) (string, bool) {
	if _, err := sess.Prompt(ctx); err != nil {
		return "prompt: " + err.Error(), false
	}
	tools, err := sess.Tools(ctx)
	if err != nil {
		return "tools: " + err.Error(), false
	}
	if len(tools) == 0 {
		return "no tools offered", true
	}
	names := make([]string, len(tools))
	for i, t := range tools {
		names[i] = t.Name
	}
	input, err := json.Marshal(minimalInput(tools[0].InputSchema))
	if err != nil {
		return err.Error(), false
	}
	out, err := sess.CallTool(ctx, tools[0].Name, input)
	var te *envtarget.ToolError
	switch {
	case errors.As(err, &te):
		return fmt.Sprintf("tools %s; %s(%s) refused: %v", strings.Join(names, ", "), tools[0].Name, input, te), true
	case err != nil:
		return fmt.Sprintf("tools %s; %s(%s) failed: %v", strings.Join(names, ", "), tools[0].Name, input, err), false
	}
	reward := "no reward"
	if out.Reward != nil {
		reward = fmt.Sprintf("reward %g", *out.Reward)
	}
	return fmt.Sprintf("tools %s; %s(%s) answered (%s, finished %t)", strings.Join(names, ", "), tools[0].Name, input, reward, out.Finished), true
}

// minimalInput is the smallest object a JSON schema's required properties
// accept: the first enum value, else a zero of the property's type.
func minimalInput(schema json.RawMessage) map[string]any {
	var sc struct {
		Properties map[string]struct {
			Type    any   `json:"type"`
			Enum    []any `json:"enum"`
			Minimum *float64
		} `json:"properties"`
		Required []string `json:"required"`
	}
	out := map[string]any{}
	if json.Unmarshal(schema, &sc) != nil {
		return out
	}
	for _, name := range sc.Required {
		p := sc.Properties[name]
		if len(p.Enum) > 0 {
			out[name] = p.Enum[0]
			continue
		}
		typ, _ := p.Type.(string)
		if list, ok := p.Type.([]any); ok && len(list) > 0 {
			typ, _ = list[0].(string)
		}
		switch typ {
		case "integer", "number":
			v := 0.0
			if p.Minimum != nil {
				v = *p.Minimum
			}
			out[name] = v
		case "boolean":
			out[name] = false
		case "array":
			out[name] = []any{}
		case "object":
			out[name] = map[string]any{}
		default:
			out[name] = ""
		}
	}
	return out
}
