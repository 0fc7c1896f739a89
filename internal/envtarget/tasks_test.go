package envtarget_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envtarget"
	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

func writeTasks(t *testing.T, lines ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tasks.jsonl")
	require.NoError(t, os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	return p
}

// Issue 23 item 2: a tasks file carries the reset arguments of an ORS env
// imported into OpenEnv; their shapes are checked when the file is read.
func TestTasksFileResetArguments(t *testing.T) {
	tasks, err := envtarget.ReadTasksFile(writeTasks(t,
		`{"prompt":"a","reset":{"task_spec":{"id":"x"}}}`,
		`{"prompt":"b","reset":{"split":"test","index":3,"secrets":{"KEY":"v"}}}`,
	))
	require.NoError(t, err)
	require.Len(t, tasks, 2)
	assert.Equal(t, map[string]any{"split": "test", "index": 3.0, "secrets": map[string]any{"KEY": "v"}}, tasks[1].Reset)

	for _, bad := range []struct{ line, want string }{
		{`{"reset":{"task_spec":"x"}}`, "task_spec must be an object"},
		{`{"reset":{"split":1}}`, "split must be a string"},
		{`{"reset":{"index":-1}}`, "index must be an integer >= 0"},
		{`{"reset":{"index":1.5}}`, "index must be an integer >= 0"},
		{`{"reset":{"secrets":["KEY"]}}`, "secrets must be an object of strings"},
		{`{"reset":{"secrets":{"KEY":1}}}`, "secrets.KEY must be a string"},
	} {
		_, err := envtarget.ReadTasksFile(writeTasks(t, `{"prompt":"ok","reset":{}}`, bad.line))
		require.ErrorContains(t, err, "line 2: reset: "+bad.want, bad.line)
	}
}

// secretEnv is an ORS env whose prompt names the secrets it was built with
// (names only) and the task it got.
func secretEnv() *orsserver.Env {
	return &orsserver.Env{
		Name:   "secretive",
		Splits: []ors.Split{{Name: "train", Type: "train"}},
		ListTasks: func(context.Context, string) ([]json.RawMessage, error) {
			return []json.RawMessage{json.RawMessage(`{"id":"t0"}`)}, nil
		},
		New: func(_ context.Context, task json.RawMessage, secrets map[string]string) (orsserver.Instance, error) {
			return promptInst("task " + string(task) + " keys " + secrets["A"] + "," + secrets["B"]), nil
		},
	}
}

type promptInst string

func (p promptInst) Prompt(context.Context) ([]ors.Block, error) {
	return []ors.Block{{Type: "text", Text: string(p)}}, nil
}

// An env entry's secrets reach an OpenEnv env as the reset's secrets (a
// task's own win key by key), and listings never show their values.
func TestOpenEnvSecrets(t *testing.T) {
	url, _ := serveOpenEnv(t, openenvserver.FromORS(secretEnv()), openenvserver.Options{})
	tasks := []envtarget.OpenEnvTask{
		{Reset: map[string]any{"task_spec": map[string]any{"id": "own"}, "secrets": map[string]any{"B": "row-b"}}},
	}
	e, err := resolveWith(t, url, envtarget.Options{OpenEnv: envtarget.OpenEnvOptions{Tasks: tasks, ObservationField: "prompt"}})
	require.NoError(t, err)
	ctx := context.Background()
	s, err := e.OpenSession(ctx, envtarget.TaskRef{Split: "train", Secrets: map[string]string{"A": "cfg-a", "B": "cfg-b"}})
	require.NoError(t, err)
	prompt, err := s.Prompt(ctx)
	require.NoError(t, err)
	assert.Equal(t, `task {"id":"own"} keys cfg-a,row-b`, prompt)
	require.NoError(t, s.Close(ctx))

	l, err := e.Describe(ctx, envtarget.Query{Split: "train"})
	require.NoError(t, err)
	require.Len(t, l.Tasks, 1)
	assert.JSONEq(t, `{"prompt":"","reset":{"task_spec":{"id":"own"},"secrets":{"B":"<redacted>"}}}`, string(l.Tasks[0].Spec))
	assert.Equal(t, map[string]any{"B": "row-b"}, tasks[0].Reset["secrets"], "the configured task is not changed")
}

// Issue 23 item 2: list-tasks on an OpenEnv URL without a tasks file lists
// the env itself (metadata, schemas, tools) instead of failing.
func TestOpenEnvDescribeWithoutTaskList(t *testing.T) {
	url, _ := serveOpenEnv(t, shoutEnv(), openenvserver.Options{})
	e, err := resolveWith(t, url, envtarget.Options{})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = e.NumTasks(ctx, "train")
	var nt *envtarget.NoTaskListError
	require.ErrorAs(t, err, &nt, "a run still needs tasks or num_tasks")
	l, err := e.Describe(ctx, envtarget.Query{Split: "train", Tools: true})
	require.NoError(t, err)
	assert.Empty(t, l.Tasks)
	assert.Contains(t, string(l.Metadata), "ShoutEnvironment")
	assert.Contains(t, string(l.ActionSchema), `"message"`)
	require.Len(t, l.Tools, 1)
	assert.Equal(t, "step", l.Tools[0].Name)
}
