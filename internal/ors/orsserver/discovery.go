package orsserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/ortrain/ortrain/internal/ors"
)

// errBadSplit and errBadIndex carry the reference's 400 texts.
var (
	errBadSplit = &HTTPError{Status: http.StatusBadRequest, Detail: "Invalid split"}
	errBadIndex = &HTTPError{Status: http.StatusBadRequest, Detail: "Invalid index"}
	errNoList   = &HTTPError{Status: http.StatusBadRequest, Detail: "list_tasks is not supported for this environment. Use the index-based API (num_tasks + get_task) instead."}
)

func (e *servedEnv) splits() []ors.Split {
	out := make([]ors.Split, len(e.Splits))
	for i, sp := range e.Splits {
		typ := sp.Type
		if typ == "" {
			switch sp.Name {
			case "train", "validation", "test":
				typ = sp.Name
			default:
				typ = "validation"
			}
		}
		out[i] = ors.Split{Name: sp.Name, Type: typ}
	}
	return out
}

func (e *servedEnv) hasSplit(split string) bool {
	for _, sp := range e.Splits {
		if sp.Name == split {
			return true
		}
	}
	return false
}

func (e *servedEnv) listTasks(ctx context.Context, split string) ([]json.RawMessage, error) {
	if !e.hasSplit(split) {
		return nil, errBadSplit
	}
	if e.ListTasks == nil {
		return nil, errNoList
	}
	return e.ListTasks(ctx, split)
}

func (e *servedEnv) numTasks(ctx context.Context, split string) (int, error) {
	if !e.hasSplit(split) {
		return 0, errBadSplit
	}
	if e.NumTasks != nil {
		return e.NumTasks(ctx, split)
	}
	tasks, err := e.ListTasks(ctx, split)
	return len(tasks), err
}

// task returns task index of split with Python's negative indexing.
func (e *servedEnv) task(ctx context.Context, split string, index int) (json.RawMessage, error) {
	n, err := e.numTasks(ctx, split)
	if err != nil {
		return nil, err
	}
	if index < 0 {
		index += n
	}
	if index < 0 || index >= n {
		return nil, errBadIndex
	}
	if e.GetTask != nil {
		return e.GetTask(ctx, split, index)
	}
	tasks, err := e.ListTasks(ctx, split)
	if err != nil {
		return nil, err
	}
	if index >= len(tasks) {
		return nil, errBadIndex
	}
	return tasks[index], nil
}

// taskRange returns tasks[start:stop] with Python slice semantics.
func (e *servedEnv) taskRange(ctx context.Context, split string, start, stop *int) ([]json.RawMessage, error) {
	n, err := e.numTasks(ctx, split)
	if err != nil {
		return nil, err
	}
	clamp := func(p *int, def int) int {
		if p == nil {
			return def
		}
		v := *p
		if v < 0 {
			v += n
		}
		return max(0, min(v, n))
	}
	lo, hi := clamp(start, 0), clamp(stop, n)
	out := []json.RawMessage{}
	if lo >= hi {
		return out, nil
	}
	if e.ListTasks != nil && e.GetTask == nil {
		tasks, err := e.ListTasks(ctx, split)
		if err != nil {
			return nil, err
		}
		if hi > len(tasks) {
			return nil, &HTTPError{Status: http.StatusBadRequest, Detail: "Invalid index range"}
		}
		return append(out, tasks[lo:hi]...), nil
	}
	for i := lo; i < hi; i++ {
		t, err := e.GetTask(ctx, split, i)
		if err != nil {
			return nil, fmt.Errorf("task %d: %w", i, err)
		}
		out = append(out, t)
	}
	return out, nil
}

// handleDiscovery serves tasks, num_tasks, task and task_range.
func (s *Server) handleDiscovery(w http.ResponseWriter, r *http.Request, env *servedEnv, segment, endpoint string) {
	fields := []bodyField{{name: "split", kind: kindString, required: true}}
	switch endpoint {
	case "task":
		fields = append(fields, bodyField{name: "index", kind: kindInt, required: true})
	case "task_range":
		fields = append(fields, bodyField{name: "start", kind: kindInt}, bodyField{name: "stop", kind: kindInt})
	}
	body, ok := decodeBody(w, r, fields)
	if !ok {
		return
	}
	split, _ := bodyString(body, "split")
	ctx := r.Context()
	var resp any
	var err error
	switch endpoint {
	case "tasks":
		var tasks []json.RawMessage
		if tasks, err = env.listTasks(ctx, split); err == nil {
			resp = tasksResponse{Tasks: nonNil(tasks), EnvName: segment}
		}
	case "num_tasks":
		var n int
		if n, err = env.numTasks(ctx, split); err == nil {
			resp = map[string]any{"num_tasks": n}
		}
	case "task":
		idx, _ := bodyInt(body, "index")
		var t json.RawMessage
		if t, err = env.task(ctx, split, idx); err == nil {
			resp = taskResponse{Task: t, EnvName: segment}
		}
	case "task_range":
		var start, stop *int
		if v, ok := bodyInt(body, "start"); ok {
			start = &v
		}
		if v, ok := bodyInt(body, "stop"); ok {
			stop = &v
		}
		var tasks []json.RawMessage
		if tasks, err = env.taskRange(ctx, split, start, stop); err == nil {
			resp = tasksResponse{Tasks: tasks, EnvName: segment}
		}
	}
	if err != nil {
		status, detail := errStatus(err)
		writeDetail(w, status, detail)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

type tasksResponse struct {
	Tasks   []json.RawMessage `json:"tasks"`
	EnvName string            `json:"env_name"`
}

type taskResponse struct {
	Task    json.RawMessage `json:"task"`
	EnvName string          `json:"env_name"`
}

// decodeSecrets reads X-Secrets: base64 of {"key": {"value": "v", ...}} (or
// {"key": "v"}), flattened to key → value.
func decodeSecrets(header string) (map[string]string, error) {
	out := map[string]string{}
	header = strings.TrimSpace(header)
	if header == "" {
		return out, nil
	}
	raw, err := decodeBase64(header)
	if err != nil {
		return nil, fmt.Errorf("X-Secrets is not base64: %w", err)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, fmt.Errorf("X-Secrets is not a JSON object: %w", err)
	}
	for k, v := range obj {
		var plain string
		if json.Unmarshal(v, &plain) == nil {
			out[k] = plain
			continue
		}
		var wrapped struct {
			Value *string `json:"value"`
		}
		if err := json.Unmarshal(v, &wrapped); err != nil || wrapped.Value == nil {
			return nil, errors.New("X-Secrets entry " + k + " has no string value")
		}
		out[k] = *wrapped.Value
	}
	return out, nil
}
