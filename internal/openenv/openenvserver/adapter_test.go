package openenvserver_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/openenv"
	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

// keyedInst is an ORS instance that says which task and which secret
// names it was built with (never their values).
type keyedInst struct {
	task    json.RawMessage
	secrets map[string]string
}

func (k *keyedInst) Prompt(context.Context) ([]ors.Block, error) {
	var names []string
	for n := range k.secrets {
		names = append(names, n)
	}
	return []ors.Block{{Type: "text", Text: string(k.task) + " secrets:" + strings.Join(names, ",")}}, nil
}

func keyedEnv() *orsserver.Env {
	return &orsserver.Env{
		Name:   "keyed",
		Splits: []ors.Split{{Name: "train", Type: "train"}, {Name: "test", Type: "test"}},
		ListTasks: func(_ context.Context, split string) ([]json.RawMessage, error) {
			return []json.RawMessage{json.RawMessage(`{"id":"` + split + `-0"}`), json.RawMessage(`{"id":"` + split + `-1"}`)}, nil
		},
		Tools: []orsserver.Tool{orsserver.NewToolNoInput("key", "says whether the key secret is set", func(_ context.Context, k *keyedInst) (ors.ToolOutput, error) {
			_, ok := k.secrets["KEY"]
			text := "no key"
			if ok {
				text = "key set"
			}
			return ors.ToolOutput{Blocks: []ors.Block{{Type: "text", Text: text}}}, nil
		})},
		New: func(_ context.Context, task json.RawMessage, secrets map[string]string) (orsserver.Instance, error) {
			return &keyedInst{task: task, secrets: secrets}, nil
		},
	}
}

// Issue 23 item 2: an ORS env served over OpenEnv takes the reset
// arguments OpenEnv's ORS import uses — task_spec, or split + index, and
// secrets for the env's constructor.
func TestFromORSResetArguments(t *testing.T) {
	base, _ := serve(t, openenvserver.FromORS(keyedEnv()), openenvserver.Options{})
	c, err := openenv.NewClient(base, openenv.Options{ReplyTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(c.CloseIdleConnections)
	ctx := context.Background()
	s, _, err := c.Start(ctx, nil)
	require.NoError(t, err)
	defer s.Close(ctx)
	tests := []struct {
		name   string
		kwargs map[string]any
		prompt string
		key    string
	}{
		{"default task", nil, `{"id":"train-0"} secrets:`, "no key"},
		{"split and index", map[string]any{"split": "test", "index": 1}, `{"id":"test-1"} secrets:`, "no key"},
		{"task_spec", map[string]any{"task_spec": map[string]string{"id": "custom"}}, `{"id":"custom"} secrets:`, "no key"},
		{"secrets", map[string]any{"split": "train", "index": 1, "secrets": map[string]string{"KEY": "s3cret"}}, `{"id":"train-1"} secrets:KEY`, "key set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obs, err := s.Reset(ctx, tt.kwargs)
			require.NoError(t, err)
			var o struct{ Prompt string }
			require.NoError(t, json.Unmarshal(obs.Observation, &o))
			assert.Equal(t, tt.prompt, o.Prompt)
			call, err := s.CallTool(ctx, "key", nil)
			require.NoError(t, err)
			assert.Equal(t, tt.key, call.Text())
		})
	}
	_, err = s.Reset(ctx, map[string]any{"secrets": []string{"KEY"}})
	var se *openenv.ServerError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, openenv.CodeExecutionError, se.Code)
	assert.Contains(t, se.Message, "secrets must be an object of strings")
}

func TestEpisodeID(t *testing.T) {
	for _, tt := range []struct {
		name, raw, want string
		fresh           bool
		err             string
	}{
		{name: "given", raw: `"ep-1"`, want: "ep-1"},
		{name: "absent", fresh: true},
		{name: "null", raw: `null`, fresh: true},
		{name: "empty", raw: `""`, fresh: true},
		{name: "not a string", raw: `5`, err: "episode_id must be a string"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			kw := map[string]json.RawMessage{}
			if tt.raw != "" {
				kw["episode_id"] = json.RawMessage(tt.raw)
			}
			id, err := openenvserver.EpisodeID(kw)
			if tt.err != "" {
				require.EqualError(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			if !tt.fresh {
				assert.Equal(t, tt.want, id)
				return
			}
			assert.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, id)
			again, _ := openenvserver.EpisodeID(kw)
			assert.NotEqual(t, id, again)
		})
	}
}
