package ors

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// discover runs a stateless request; on the hosted platform it is wrapped
// in an ephemeral session because the platform routes by sid.
func (c *Client) discover(ctx context.Context, req request, out any) error {
	if c.catalog {
		sid, err := c.createSession(ctx, "")
		if err != nil {
			return err
		}
		defer func() {
			// The ephemeral session is deleted even after cancellation, bounded.
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			c.deleteSession(dctx, sid)
		}()
		req.sid = sid
	}
	return c.do(ctx, req, out)
}

// ListEnvironments returns the env names a self-hosted server serves; the
// first is its default.
func (c *Client) ListEnvironments(ctx context.Context) ([]string, error) {
	var names []string
	if err := c.do(ctx, request{method: http.MethodGet, path: "/list_environments"}, &names); err != nil {
		return nil, fmt.Errorf("list environments: %w", err)
	}
	return names, nil
}

// Splits lists the env's task splits. On a self-hosted server that does not
// serve the target's env, the error is an *EnvNotFoundError listing the envs
// it does serve.
func (c *Client) Splits(ctx context.Context) ([]Split, error) {
	var out []Split
	err := c.discover(ctx, request{method: http.MethodGet, path: c.envPath + "/splits"}, &out)
	var nf *NotFoundError
	if errors.As(err, &nf) && nf.What == "route" && !c.catalog {
		if names, lerr := c.ListEnvironments(ctx); lerr == nil {
			return nil, &EnvNotFoundError{Target: c.target, Served: names, BaseURL: c.sessions, Err: err}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("list splits: %w", err)
	}
	return out, nil
}

// NumTasks counts the tasks of split.
func (c *Client) NumTasks(ctx context.Context, split string) (int, error) {
	var out struct {
		N *int `json:"num_tasks"`
	}
	if err := c.discover(ctx, request{method: http.MethodPost, path: c.envPath + "/num_tasks", body: map[string]string{"split": split}}, &out); err != nil {
		return 0, fmt.Errorf("count tasks of split %q: %w", split, err)
	}
	if out.N == nil {
		return 0, &ProtocolError{URL: c.sessions + c.envPath + "/num_tasks", Detail: "no num_tasks key"}
	}
	return *out.N, nil
}

type tasksResponse struct {
	Tasks   []json.RawMessage `json:"tasks"`
	EnvName string            `json:"env_name"`
}

// Task returns task index of split.
func (c *Client) Task(ctx context.Context, split string, index int) (Task, error) {
	var out struct {
		Task    json.RawMessage `json:"task"`
		EnvName string          `json:"env_name"`
	}
	body := map[string]any{"split": split, "index": index}
	if err := c.discover(ctx, request{method: http.MethodPost, path: c.envPath + "/task", body: body}, &out); err != nil {
		return Task{}, fmt.Errorf("get task %d of split %q: %w", index, split, err)
	}
	return Task{Index: index, Spec: out.Task, EnvName: out.EnvName}, nil
}

// TaskRange returns tasks start..stop-1 of split (0 <= start <= stop; the
// server clamps stop to the split's size).
func (c *Client) TaskRange(ctx context.Context, split string, start, stop int) ([]Task, error) {
	if start < 0 || stop < start {
		return nil, fmt.Errorf("task range [%d, %d) of split %q: need 0 <= start <= stop", start, stop, split)
	}
	var out tasksResponse
	body := map[string]any{"split": split, "start": start, "stop": stop}
	if err := c.discover(ctx, request{method: http.MethodPost, path: c.envPath + "/task_range", body: body}, &out); err != nil {
		return nil, fmt.Errorf("get tasks [%d, %d) of split %q: %w", start, stop, split, err)
	}
	return toTasks(out, start), nil
}

// Tasks returns every task of split (may be large; prefer NumTasks + Task
// or TaskRange for big splits). An env that cannot list its tasks at once
// (the server says list_tasks is not supported) is read with NumTasks and
// TaskRange instead.
func (c *Client) Tasks(ctx context.Context, split string) ([]Task, error) {
	var out tasksResponse
	err := c.discover(ctx, request{method: http.MethodPost, path: c.envPath + "/tasks", body: map[string]string{"split": split}}, &out)
	var inv *InvalidRequestError
	if errors.As(err, &inv) && strings.Contains(inv.Detail, "list_tasks is not supported") {
		n, nerr := c.NumTasks(ctx, split)
		if nerr != nil {
			return nil, nerr
		}
		return c.TaskRange(ctx, split, 0, n)
	}
	if err != nil {
		return nil, fmt.Errorf("list tasks of split %q: %w", split, err)
	}
	return toTasks(out, 0), nil
}

func toTasks(r tasksResponse, first int) []Task {
	out := make([]Task, len(r.Tasks))
	for i, spec := range r.Tasks {
		out[i] = Task{Index: first + i, Spec: spec, EnvName: r.EnvName}
	}
	return out
}

// Tools lists the env's shared tools (/tools); a session's Tools adds the
// task-scoped ones.
func (c *Client) Tools(ctx context.Context) ([]ToolSpec, error) {
	var out struct {
		Tools []ToolSpec `json:"tools"`
	}
	if err := c.discover(ctx, request{method: http.MethodGet, path: c.envPath + "/tools"}, &out); err != nil {
		return nil, fmt.Errorf("list tools: %w", err)
	}
	return out.Tools, nil
}

// RequiredSecrets asks the platform API which secrets a catalog env needs.
func (c *Client) RequiredSecrets(ctx context.Context) ([]string, error) {
	if !c.catalog {
		return nil, fmt.Errorf("required secrets: %q is not a catalog env", c.target)
	}
	var out struct {
		Secrets []string `json:"secrets"`
	}
	path := "/v1/environments/" + pathEscapeName(c.deployment) + "/required-secrets"
	if err := c.do(ctx, request{method: http.MethodGet, path: path, base: c.api, noDeployment: true}, &out); err != nil {
		return nil, fmt.Errorf("required secrets of %s: %w", c.deployment, err)
	}
	return out.Secrets, nil
}

func pathEscapeName(name string) string {
	owner, env, ok := cutSlash(name)
	if !ok {
		return url.PathEscape(name)
	}
	return url.PathEscape(owner) + "/" + url.PathEscape(env)
}

func cutSlash(s string) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}
