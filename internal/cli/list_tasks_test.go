package cli

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestListTasksFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    ListTasksOptions
		wantErr string
	}{
		{name: "defaults", args: []string{"--env", "builtin:echo"}, want: ListTasksOptions{Env: "builtin:echo", Split: "train", Format: "table"}},
		{name: "all flags", args: []string{"--env", "A/B", "--split", "test", "--num-tasks", "3", "--tools", "--format", "jsonl"},
			want: ListTasksOptions{Env: "A/B", Split: "test", NumTasks: 3, Tools: true, Format: "jsonl"}},
		{name: "indices", args: []string{"--env", "x", "--indices", "0,5,7"}, want: ListTasksOptions{Env: "x", Split: "train", Indices: []int{0, 5, 7}, Format: "table"}},
		{name: "no env", args: nil, wantErr: "--env is required"},
		{name: "both selectors", args: []string{"--env", "x", "--num-tasks", "2", "--indices", "1"}, wantErr: "specify only one of --num-tasks and --indices"},
		{name: "zero num-tasks", args: []string{"--env", "x", "--num-tasks", "0"}, wantErr: "--num-tasks 0 must be at least 1"},
		{name: "negative index", args: []string{"--env", "x", "--indices", "-1"}, wantErr: "-1 is negative"},
		{name: "bad format", args: []string{"--env", "x", "--format", "yaml"}, wantErr: `--format "yaml" is not a format (allowed: table, json, jsonl)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			deps := SystemDeps()
			deps.IO, _, _ = TestIO()
			var got *ListTasksOptions
			cmd := newListTasksCmd(deps, func(_ context.Context, o *ListTasksOptions) error { got = o; return nil })
			cmd.SetArgs(tt.args)
			cmd.SilenceErrors, cmd.SilenceUsage = true, true
			err := cmd.Execute()
			if tt.wantErr != "" {
				var usage *UsageError
				require.ErrorAs(t, err, &usage)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, ListTasksOptions{Env: got.Env, Split: got.Split, NumTasks: got.NumTasks, Indices: got.Indices, Tools: got.Tools, Format: got.Format})
		})
	}
}

func TestListTasksOutputs(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"tsv", []string{"--env", "builtin:letters", "--split", "mixed", "--num-tasks", "3"},
			"INDEX\tID\tTARGET\n0\tletters-mixed-0\ta\n1\tletters-mixed-1\tb\n2\tletters-mixed-2\tc\n"},
		{"indices", []string{"--env", "builtin:echo", "--indices", "0,2"},
			"INDEX\tID\tTARGET\n0\techo-0\thello\n2\techo-2\ttrl\n"},
		{"jsonl", []string{"--env", "builtin:echo", "--indices", "3", "--format", "jsonl", "--tools"},
			`{"index":3,"task":{"id":"echo-3","target":"openreward"}}
{"tool":{"name":"echo","description":"Echo the given text back. Echoing the task's target wins.","input_schema":{"properties":{"text":{"title":"Text","type":"string"}},"required":["text"],"title":"EchoParams","type":"object"}},"scope":"shared"}
{"tool":{"name":"hint","description":"Get a hint about how to win.","input_schema":{"properties":{},"title":"HintParams","type":"object"}},"scope":"task"}
`},
		{"json", []string{"--env", "builtin:echo", "--num-tasks", "1", "--format", "json"},
			`{"env":"builtin:echo","protocol":"ors","split":"train","tasks":[{"index":0,"task":{"id":"echo-0","target":"hello"}}]}` + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := execCLI(t, nil, append([]string{"list-tasks"}, tt.args...)...)
			require.Equal(t, ExitOK, code, errOut)
			assert.Equal(t, tt.want, out)
		})
	}
}

func TestListTasksTTYTable(t *testing.T) {
	deps := SystemDeps()
	io, out, errOut := TestIO()
	io.SetTTY(true, false)
	deps.IO = io
	code := Execute(context.Background(), deps, []string{"list-tasks", "--env", "builtin:echo", "--tools"})
	require.Equal(t, ExitOK, code, errOut.String())
	assert.Equal(t, `INDEX  ID      TARGET
0      echo-0  hello
1      echo-1  world
2      echo-2  trl
3      echo-3  openreward

TOOL  SCOPE   DESCRIPTION
echo  shared  Echo the given text back. Echoing the task's target wins.
hint  task    Get a hint about how to win.
`, out.String())
}

func TestListTasksErrors(t *testing.T) {
	unauthorized := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"detail":"Invalid API key"}`))
	}))
	t.Cleanup(unauthorized.Close)
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()

	tests := []struct {
		name     string
		args     []string
		env      map[string]string
		code     int
		contains []string
	}{
		{"unreachable", []string{"--env", deadURL}, nil, ExitError,
			[]string{"cannot reach " + deadURL, "ortrain env serve echo"}},
		{"bad split", []string{"--env", "builtin:letters", "--split", "nope"}, nil, ExitUsage,
			[]string{`--split "nope" is not a split of builtin:letters (valid splits: train, validation, mixed)`}},
		{"index out of range", []string{"--env", "builtin:echo", "--indices", "1,9"}, nil, ExitUsage,
			[]string{`--indices: 9 is out of range: split "train" has 4 tasks (0-3)`}},
		{"unknown builtin", []string{"--env", "builtin:nope"}, nil, ExitUsage,
			[]string{"available: echo, guess, ladder, letters, lockbox, mcp-echo"}},
		{"bad API key", []string{"--env", unauthorized.URL}, nil, ExitError,
			[]string{"authentication failed", "Invalid API key", "hint: set OPENREWARD_API_KEY"}},
		{"catalog without key", []string{"--env", "Owner/Env"}, nil, ExitUsage,
			[]string{"set OPENREWARD_API_KEY"}},
		{"catalog host from env", []string{"--env", "Owner/Env"}, map[string]string{"OPENREWARD_API_KEY": "k", "OPENREWARD_SESSION_URL": unauthorized.URL}, ExitError,
			[]string{"authentication failed at " + unauthorized.URL}},
		{"unknown env path", []string{"--env", "URL/nosuchenv"}, nil, ExitError,
			[]string{"environment", "not found (this server serves: echoenvironment; use http://127.0.0.1:"}},
		{"bad target", []string{"--env", "a/b/c"}, nil, ExitUsage,
			[]string{"neither a URL"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			if strings.HasPrefix(args[1], "URL/") {
				url := serveInBackground(t, "echo", "--port", "0")
				args = []string{"--env", url + strings.TrimPrefix(args[1], "URL")}
			}
			code, out, errOut := execCLI(t, tt.env, append([]string{"list-tasks"}, args...)...)
			assert.Equal(t, tt.code, code, errOut)
			assert.Empty(t, out)
			for _, c := range tt.contains {
				assert.Contains(t, errOut, c)
			}
		})
	}
}

func TestSpecKeysKeepOrder(t *testing.T) {
	assert.Equal(t, []string{"z", "a", "m"}, specKeys(json.RawMessage(`{"z":1,"a":{"x":[1,2]},"m":null}`)))
	assert.Nil(t, specKeys(json.RawMessage(`[1]`)))
	assert.Equal(t, "x", cellOf(json.RawMessage(`"x"`)))
	assert.Equal(t, `{"a":1}`, cellOf(json.RawMessage(`{ "a": 1 }`)))
}

// closedURL is a loopback URL nothing listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	u := "http://" + l.Addr().String()
	require.NoError(t, l.Close())
	return u
}

// An unreachable URL target may be a local server the user forgot to
// start; an unreachable catalog target is the platform, and serving a
// local echo env is no answer to that.
func TestListTasksUnreachableHints(t *testing.T) {
	dead := closedURL(t)
	tests := []struct {
		name     string
		env      string
		getenv   map[string]string
		want     []string
		wantNone []string
	}{
		{"url target", dead, nil, []string{"hint: is a server running there?", "ortrain env serve echo"}, nil},
		{"catalog target", "Owner/Env", map[string]string{"OPENREWARD_API_KEY": "k", "OPENREWARD_API_URL": dead, "OPENREWARD_SESSION_URL": dead},
			// The chain names /create_session once, not "create session: /create_session".
			[]string{"hint: check the network", "OPENREWARD_SESSION_URL", "list splits: /create_session: giving up"}, []string{"echo", "builtin:", "create session:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := execCLI(t, tt.getenv, "list-tasks", "--env", tt.env)
			assert.Equal(t, ExitError, code, errOut)
			assert.Equal(t, 1, strings.Count(errOut, "hint:"), errOut)
			for _, s := range tt.want {
				assert.Contains(t, errOut, s)
			}
			for _, s := range tt.wantNone {
				assert.NotContains(t, errOut, s)
			}
		})
	}
}

func TestDuplicateKeys(t *testing.T) {
	tests := []struct {
		line string
		want []string
	}{
		{`{"a":1,"b":"x"}`, nil},
		{`{"component":"a","x":[1,{"k":1}],"component":"b"}`, []string{"component"}},
		{`{"o":{"k":1,"k":2},"k":3}`, []string{"k"}},
	}
	for _, tt := range tests {
		got, err := duplicateKeys([]byte(tt.line))
		require.NoError(t, err)
		assert.Equal(t, tt.want, got, tt.line)
	}
	_, err := duplicateKeys([]byte(`[1]`))
	assert.Error(t, err)
}

// The JSON log of a real command (an in-process env server under the
// list-tasks logger, debug level) never repeats a key.
func TestListTasksJSONLogHasNoDuplicateKeys(t *testing.T) {
	code, _, errOut := execCLI(t, nil, "list-tasks", "--env", "builtin:echo", "--tools", "--log-level", "debug", "--log-format", "json")
	require.Equal(t, ExitOK, code, errOut)
	assert.Positive(t, requireNoDuplicateKeys(t, errOut), "no JSON log lines to check")
	assert.Contains(t, errOut, `"command":"list-tasks"`)
}

// Issue 10: list-tasks on an OpenEnv target prints its metadata, its action
// and observation schemas, the tasks of a --tasks file and the tools.
func TestListTasksOpenEnv(t *testing.T) {
	tasks := filepath.Join(t.TempDir(), "tasks.jsonl")
	require.NoError(t, os.WriteFile(tasks, []byte(`{"prompt":"Guess 42","reset":{"target":42}}
{"prompt":[{"role":"user","content":"Guess 7"}],"reset":{"target":7},"split":"validation"}
`), 0o644))
	code, out, errOut := execCLI(t, nil, "list-tasks", "--env", "builtin:guess", "--tasks", tasks, "--tools")
	require.Equal(t, ExitOK, code, errOut)
	assert.Contains(t, out, "ENV\tGuessEnvironment 1.0.0 (OpenEnv; Gym-style: the action is offered as one tool)")
	assert.Contains(t, out, `ACTION	{"additionalProperties":false`)
	assert.Contains(t, out, "OBSERVATION\t{")
	assert.Contains(t, out, "0\tGuess 42\t{\"target\":42}")
	assert.NotContains(t, out, "Guess 7", "a validation row is not a train task")
	assert.Contains(t, out, "step\tshared")

	code, out, errOut = execCLI(t, nil, "list-tasks", "--env", "builtin:mcp-echo", "--num-tasks", "1", "--tools", "--format", "json")
	require.Equal(t, ExitOK, code, errOut)
	var doc struct {
		Protocol string `json:"protocol"`
		Tools    []struct {
			Name string `json:"name"`
		} `json:"tools"`
		Metadata map[string]any `json:"metadata"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	assert.Equal(t, "openenv", doc.Protocol)
	assert.Equal(t, "EchoEnvironment", doc.Metadata["name"])
	require.Len(t, doc.Tools, 2)

	code, _, errOut = execCLI(t, nil, "list-tasks", "--env", "builtin:guess", "--tasks", "/nonexistent.jsonl")
	assert.Equal(t, ExitUsage, code)
	assert.Contains(t, errOut, "--tasks: tasks file")
}

// list-tasks --run shows a run's per-task pass rates, hardest first, with
// the curriculum's band, filtered and in every format.
func TestListTasksRunPassRates(t *testing.T) {
	dir := t.TempDir()
	snap := `{"step":20,"envs":["ladder-train","letters-train"],"splits":["train","train"],
	  "config":{"enabled":true,"pass_threshold":1,"min_pass_rate":0,"max_pass_rate":1,"revisit_probability":0.1,"window":4},
	  "tasks":[{"env":0,"index":3,"recent":"1111","rollouts":12,"mean_reward":1,"last_round":19},
	           {"env":0,"index":5,"recent":"0110","rollouts":8,"mean_reward":0.5,"last_round":18},
	           {"env":1,"index":0,"recent":"0000","rollouts":4,"mean_reward":0.1,"last_round":2}]}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "task_pass_rates.json"), []byte(snap), 0o644))

	code, out, errOut := execCLI(t, nil, "list-tasks", "--run", dir)
	require.Equal(t, ExitOK, code, errOut)
	assert.Equal(t, "pass rates at step 20 (a rollout passes with reward >= 1; over each task's last 4 rollouts)\n"+
		"ENV\tSPLIT\tINDEX\tPASS_RATE\tMEAN_REWARD\tROLLOUTS\tRECENT\tBAND\n"+
		"letters-train\ttrain\t0\t0.000\t0.100\t4\t0000\ttoo_hard\n"+
		"ladder-train\ttrain\t5\t0.500\t0.500\t8\t0110\tin_band\n"+
		"ladder-train\ttrain\t3\t1.000\t1.000\t12\t1111\ttoo_easy\n", out)

	code, out, errOut = execCLI(t, nil, "list-tasks", "--run", dir, "--indices", "3,5", "--format", "jsonl")
	require.Equal(t, ExitOK, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	assert.JSONEq(t, `{"env":"ladder-train","split":"train","index":5,"pass_rate":0.5,"mean_reward":0.5,"rollouts":8,"recent":"0110","last_round":18,"band":"in_band"}`, lines[0])

	code, out, errOut = execCLI(t, nil, "list-tasks", "--run", dir, "--num-tasks", "1", "--format", "json")
	require.Equal(t, ExitOK, code, errOut)
	var doc struct {
		Step  int
		Tasks []struct{ Index int }
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	assert.Equal(t, 20, doc.Step)
	require.Len(t, doc.Tasks, 1)
	assert.Equal(t, 0, doc.Tasks[0].Index)

	for _, args := range [][]string{{"--run", t.TempDir()}, {"--run", dir, "--env", "builtin:ladder"}} {
		code, _, errOut = execCLI(t, nil, append([]string{"list-tasks"}, args...)...)
		assert.Equal(t, ExitUsage, code, "%v: %s", args, errOut)
	}
}
