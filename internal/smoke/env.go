package smoke

import (
	"github.com/ortrain/ortrain/internal/jsonschema"

	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/ortrain/ortrain/internal/envtarget"
	"github.com/ortrain/ortrain/internal/train"
)

// env checks envs[i] as a rollout uses it: connect, count its tasks, open a
// session on its first task, read the prompt and the session's tools
// (task-scoped ones included), call each tool once in the listed order with
// the smallest input its schema accepts until one ends the episode, and
// close the session. A tool refusing that input (the model would read why)
// passes; a tool that raises, an episode that ends without a reward, and a
// session that does not close within the deadline do not.
func (s *suite) env(i int) {
	ec := s.cfg.Envs[i]
	name := fmt.Sprintf("envs[%d] %s: session and tools", i, ec.Target)
	s.check(name, "connects, has tasks, opens a session, gives a prompt and tools; each tool answers; an episode that ends carries a reward; the session closes", func() (string, bool) {
		conn, indices, err := train.ConnectEnv(s.ctx, ec, s.o.Getenv, s.o.Logger)
		if err != nil {
			return err.Error(), false
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), s.o.EnvTimeout)
			defer cancel()
			_ = conn.Close(cctx)
		}()
		if len(indices) == 0 {
			return fmt.Sprintf("split %q has no tasks", ec.Split), false
		}
		ctx, cancel := context.WithTimeout(s.ctx, s.o.EnvTimeout)
		defer cancel()
		sess, err := conn.OpenSession(ctx, envtarget.TaskRef{Split: ec.Split, Index: indices[0], Secrets: ec.Secrets})
		if err != nil {
			return fmt.Sprintf("open a session on task %d: %v", indices[0], err), false
		}
		observed, ok := playTools(ctx, sess)
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(s.ctx), s.o.EnvTimeout)
		defer ccancel()
		if err := sess.Close(cctx); err != nil {
			return fmt.Sprintf("%s; the session did not close: %v", observed, err), false
		}
		return fmt.Sprintf("%s %s, %d tasks: %s", conn.Protocol(), conn.Name(), len(indices), observed), ok
	})
}

// playTools calls each tool once, in order, until one ends the episode.
func playTools(ctx context.Context, sess envtarget.Session) (string, bool) {
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
	calls := []string{}
	say := func(format string, args ...any) string {
		calls = append(calls, fmt.Sprintf(format, args...))
		return fmt.Sprintf("tools %s; %s", strings.Join(names, ", "), strings.Join(calls, "; "))
	}
	for _, t := range tools {
		input, err := json.Marshal(jsonschema.MinimalInput(t.InputSchema))
		if err != nil {
			return err.Error(), false
		}
		out, err := sess.CallTool(ctx, t.Name, input)
		var te *envtarget.ToolError
		switch {
		case errors.As(err, &te) && te.Raised:
			return say("%s(%s) raised: %v (the tool fails instead of answering)", t.Name, input, te), false
		case errors.As(err, &te):
			say("%s(%s) refused: %v", t.Name, input, te)
			continue
		case err != nil:
			return say("%s(%s) failed: %v", t.Name, input, err), false
		}
		reward := "no reward"
		if out.Reward != nil {
			reward = fmt.Sprintf("reward %g", *out.Reward)
		}
		if out.Finished {
			if out.Reward == nil {
				return say("%s(%s) ended the episode without a reward: the env never sends one, so every rollout would score nothing", t.Name, input), false
			}
			return say("%s(%s) ended the episode with %s", t.Name, input, reward), true
		}
		say("%s(%s) answered (%s)", t.Name, input, reward)
	}
	return say("no tool ended the episode with minimal inputs"), true
}
