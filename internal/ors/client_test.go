package ors_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

var ctx = context.Background()

func TestDiscovery(t *testing.T) {
	k := startKit(t, orsserver.Options{}, nil)
	c := newClient(t, k.url, ors.Options{})

	splits, err := c.Splits(ctx)
	require.NoError(t, err)
	assert.Equal(t, []ors.Split{{Name: "train", Type: "train"}}, splits)

	n, err := c.NumTasks(ctx, "train")
	require.NoError(t, err)
	assert.Equal(t, 4, n)

	task, err := c.Task(ctx, "train", 3)
	require.NoError(t, err)
	assert.Equal(t, ors.Task{Index: 3, Spec: json.RawMessage(`{"id":"echo-3","target":"openreward"}`), EnvName: "echoenvironment"}, task)

	rng, err := c.TaskRange(ctx, "train", 1, 3)
	require.NoError(t, err)
	require.Len(t, rng, 2)
	assert.Equal(t, 1, rng[0].Index)
	assert.JSONEq(t, `{"id":"echo-2","target":"trl"}`, string(rng[1].Spec))

	all, err := c.Tasks(ctx, "train")
	require.NoError(t, err)
	require.Len(t, all, 4)
	assert.Equal(t, `{"id":"echo-0","target":"hello"}`, string(all[0].Spec), "key order kept")

	tools, err := c.Tools(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"boom", "echo"}, toolNames(tools))

	names, err := c.ListEnvironments(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"echoenvironment"}, names)

	_, err = c.Task(ctx, "nope", 0)
	var inv *ors.InvalidRequestError
	require.ErrorAs(t, err, &inv)
	assert.Equal(t, "Invalid split", inv.Detail)
	_, err = c.Task(ctx, "train", 9)
	require.ErrorAs(t, err, &inv)
	assert.Equal(t, "Invalid index", inv.Detail)
	assert.Equal(t, 1, k.count("POST /num_tasks"), "400s are not retried")
}

func toolNames(tools []ors.ToolSpec) []string {
	var out []string
	for _, t := range tools {
		out = append(out, t.Name)
	}
	return out
}

func TestSessionEndToEnd(t *testing.T) {
	k := startKit(t, orsserver.Options{}, nil)
	c := newClient(t, k.url, ors.Options{})
	s, err := c.OpenSession(ctx, ors.SessionSpec{Split: "train", Index: 3})
	require.NoError(t, err)

	prompt, err := s.Prompt(ctx)
	require.NoError(t, err)
	assert.Equal(t, []ors.Block{ors.TextBlock("Call the `echo` tool with text='openreward' to win.")}, prompt)

	tools, err := s.Tools(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"boom", "echo", "hint"}, toolNames(tools))

	out, err := s.CallTool(ctx, "echo", json.RawMessage(`{"text":"openreward"}`))
	require.NoError(t, err)
	assert.Equal(t, "match", out.Text())
	assert.Equal(t, 1.0, *out.Reward)
	assert.True(t, out.Finished)

	out, err = s.CallTool(ctx, "hint", nil)
	require.NoError(t, err)
	assert.Nil(t, out.Reward)

	_, err = s.CallTool(ctx, "nosuchtool", json.RawMessage(`{}`))
	var tce *ors.ToolCallError
	require.ErrorAs(t, err, &tce)
	assert.Equal(t, ors.ToolCallError{Tool: "nosuchtool", Reason: "not_found", Message: "'nosuchtool' is not a valid tool"}, *tce)

	_, err = s.CallTool(ctx, "echo", json.RawMessage(`{"text":5}`))
	require.ErrorAs(t, err, &tce)
	assert.Equal(t, "input_validation", tce.Reason)

	_, err = s.CallTool(ctx, "echo", json.RawMessage(`[1]`))
	require.ErrorAs(t, err, &tce)
	assert.Equal(t, "bad_input_shape", tce.Reason)

	_, err = s.CallTool(ctx, "boom", nil)
	var failed *ors.ToolFailedError
	require.ErrorAs(t, err, &failed)
	assert.Equal(t, "bad", failed.Message)

	assert.Equal(t, int64(1), k.srv.Stats().Live)
	require.NoError(t, s.Close(ctx))
	require.NoError(t, s.Close(ctx), "idempotent")
	assert.Equal(t, orsserver.Stats{Live: 0, Created: 1, Deleted: 1, ToolCalls: 5}, k.srv.Stats()) // bad_input_shape never reaches the server
	assert.Equal(t, 1, k.count("POST /delete"))
	assert.Equal(t, 1, k.count("POST /delete_session"))

	_, err = s.Prompt(ctx)
	var term *ors.SessionTerminatedError
	require.ErrorAs(t, err, &term)
	assert.Equal(t, "closed", term.Reason)
}

func TestSessionFromTaskSpecAndSecrets(t *testing.T) {
	k := startKit(t, orsserver.Options{}, nil)
	c := newClient(t, k.url, ors.Options{})
	task, err := c.Task(ctx, "train", 0)
	require.NoError(t, err)
	s := openSession(t, c, ors.SessionSpec{Task: json.RawMessage(`{"id":"x","target":"zz"}`), EnvName: task.EnvName, Secrets: map[string]string{"k": "v"}})
	prompt, err := s.Prompt(ctx)
	require.NoError(t, err)
	assert.Contains(t, prompt[0].Text, "zz")

	_, err = c.OpenSession(ctx, ors.SessionSpec{Split: "train", Index: 0, EnvName: "nope"})
	var nf *ors.NotFoundError
	require.ErrorAs(t, err, &nf)
	assert.Equal(t, "environment", nf.What)
	assert.Equal(t, int64(1), k.srv.Stats().Live, "failed create leaves nothing behind")
}

func TestPingKeepsSessionAliveAndDetectsDeath(t *testing.T) {
	k := startKit(t, orsserver.Options{IdleTimeout: 300 * time.Millisecond, ReapInterval: 20 * time.Millisecond}, nil)
	c := newClient(t, k.url, ors.Options{PingInterval: 50 * time.Millisecond})
	s := openSession(t, c, ors.SessionSpec{Split: "train", Index: 0})
	time.Sleep(700 * time.Millisecond)
	require.NoError(t, s.Err())
	_, err := s.Prompt(ctx)
	require.NoError(t, err, "pings kept the session past the idle timeout")
	assert.GreaterOrEqual(t, k.count("POST /ping"), 8)

	// Delete it behind the client's back: the next ping gets 404 and the
	// session ends; calls then fail with SessionTerminatedError.
	req, _ := http.NewRequest("POST", k.url+"/delete", nil)
	req.Header.Set("X-Session-ID", s.ID())
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Eventually(t, func() bool { return s.Err() != nil }, 2*time.Second, 10*time.Millisecond)
	_, err = s.CallTool(ctx, "echo", json.RawMessage(`{"text":"hello"}`))
	var term *ors.SessionTerminatedError
	require.ErrorAs(t, err, &term)
	assert.Equal(t, "keep-alive ping failed", term.Reason)
}

func TestUnreachableServerNamesURL(t *testing.T) {
	k := startKit(t, orsserver.Options{}, nil)
	url := k.url
	require.NoError(t, k.srv.Shutdown(ctx))
	sl := &instant{}
	c := newClient(t, url, ors.Options{Sleep: sl.sleep})
	_, err := c.NumTasks(ctx, "train")
	var ue *ors.UnreachableError
	require.ErrorAs(t, err, &ue)
	assert.Equal(t, url, ue.URL)
	assert.Len(t, sl.waits, 2, "3 attempts")
}

func TestCallCancelledByContext(t *testing.T) {
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	slow := envs.Echo()
	slow.Tools = append(slow.Tools, orsserver.NewToolNoInput("wait", "blocks", func(context.Context, orsserver.Instance) (ors.ToolOutput, error) {
		<-block
		return ors.ToolOutput{}, nil
	}))
	k := startKit(t, orsserver.Options{}, nil, slow)
	c := newClient(t, k.url, ors.Options{})
	s := openSession(t, c, ors.SessionSpec{Split: "train", Index: 0})
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.CallTool(cctx, "wait", nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 2*time.Second)
}

func TestReadTimeoutRetriesSilentStream(t *testing.T) {
	var silent atomic.Int64
	k := startKit(t, orsserver.Options{}, func(w http.ResponseWriter, r *http.Request) bool {
		if strings.HasSuffix(r.URL.Path, "/call") && silent.Add(1) == 1 {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(200)
			http.NewResponseController(w).Flush()
			<-r.Context().Done() // never send a byte
			return true
		}
		return false
	})
	c := newClient(t, k.url, ors.Options{ReadTimeout: 200 * time.Millisecond})
	s := openSession(t, c, ors.SessionSpec{Split: "train", Index: 0})
	out, err := s.CallTool(ctx, "echo", json.RawMessage(`{"text":"hello"}`))
	require.NoError(t, err)
	assert.Equal(t, "match", out.Text())
	assert.Equal(t, int64(3), silent.Load(), "silent attempt, retry to the bare path, its 308 target")
}

func TestNewClientTargets(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	tests := []struct {
		name, target string
		getenv       map[string]string
		apiKey       string
		base, deploy string
		errContains  string
	}{
		{name: "url", target: "http://127.0.0.1:8080", base: "http://127.0.0.1:8080"},
		{name: "url trailing slash", target: "http://127.0.0.1:8080/", base: "http://127.0.0.1:8080"},
		{name: "catalog default host", target: "Eigent/SETA", apiKey: "k", base: "https://sessions.openreward.ai", deploy: "Eigent/SETA"},
		{name: "catalog key from env", target: "Eigent/SETA", getenv: map[string]string{"OPENREWARD_API_KEY": "k"}, base: "https://sessions.openreward.ai", deploy: "Eigent/SETA"},
		{name: "catalog OPENREWARD_URL", target: "A/B", apiKey: "k", getenv: map[string]string{"OPENREWARD_URL": "https://example.test/"}, base: "https://sessions.example.test", deploy: "A/B"},
		{name: "catalog session override", target: "A/B", apiKey: "k", getenv: map[string]string{"OPENREWARD_SESSION_URL": "http://127.0.0.1:9/x"}, base: "http://127.0.0.1:9", deploy: "A/B"},
		{name: "catalog no namespace", target: "solo", apiKey: "k", base: "https://sessions.openreward.ai", deploy: "solo"},
		{name: "catalog without key", target: "A/B", errContains: "OPENREWARD_API_KEY"},
		{name: "builtin scheme is not ORS", target: "builtin:echo", errContains: "neither a URL"},
		{name: "bad name", target: "a/b/c", errContains: "neither a URL"},
		{name: "bad url", target: "ftp://x", errContains: "not an http(s) URL"},
		{name: "OPENREWARD_URL bare host:port", target: "A/B", apiKey: "k", getenv: map[string]string{"OPENREWARD_URL": "127.0.0.1:8080"},
			errContains: `OPENREWARD_URL "127.0.0.1:8080" is not a URL with a scheme (https://host): it names the platform whose api.<host> and sessions.<host> ortrain derives; to send every session to one server set OPENREWARD_SESSION_URL=http://host:port`},
		{name: "OPENREWARD_URL bare name", target: "A/B", apiKey: "k", getenv: map[string]string{"OPENREWARD_URL": "openreward.ai"}, errContains: "OPENREWARD_SESSION_URL"},
		{name: "OPENREWARD_URL local server", target: "A/B", apiKey: "k", getenv: map[string]string{"OPENREWARD_URL": "http://localhost:8080"},
			errContains: `set OPENREWARD_SESSION_URL=http://localhost:8080 instead`},
		{name: "OPENREWARD_URL local with session override", target: "A/B", apiKey: "k",
			getenv: map[string]string{"OPENREWARD_URL": "http://127.0.0.1:8080", "OPENREWARD_SESSION_URL": "http://127.0.0.1:8080"}, base: "http://127.0.0.1:8080", deploy: "A/B"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ors.NewClient(tt.target, ors.Options{APIKey: tt.apiKey, Getenv: env(tt.getenv)})
			if tt.errContains != "" {
				require.ErrorContains(t, err, tt.errContains)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.base, c.BaseURL())
			assert.Equal(t, tt.deploy, c.Deployment())
		})
	}
	_, err := ors.NewClient("A/B", ors.Options{})
	var ae *ors.AuthError
	require.ErrorAs(t, err, &ae)
}

func TestToolOutputJSON(t *testing.T) {
	tests := []struct {
		out  ors.ToolOutput
		want string
	}{
		{ors.ToolOutput{}, `{"blocks":[],"metadata":null,"reward":null,"finished":false}`},
		{ors.ToolOutput{Reward: ors.Reward(1)}, `{"blocks":[],"metadata":null,"reward":1.0,"finished":false}`},
		{ors.ToolOutput{Reward: ors.Reward(0.25), Finished: true, Metadata: json.RawMessage(`{"a":1}`)}, `{"blocks":[],"metadata":{"a":1},"reward":0.25,"finished":true}`},
		{ors.ToolOutput{Reward: ors.Reward(1e-7)}, `{"blocks":[],"metadata":null,"reward":1e-07,"finished":false}`},
		{ors.ToolOutput{Reward: ors.Reward(-3)}, `{"blocks":[],"metadata":null,"reward":-3.0,"finished":false}`},
		{ors.ToolOutput{Blocks: []ors.Block{{Type: "image", Data: "AA==", MimeType: "image/png"}, ors.TextBlock("<&>")}},
			`{"blocks":[{"data":"AA==","mimeType":"image/png","detail":null,"type":"image"},{"text":"<&>","detail":null,"type":"text"}],"metadata":null,"reward":null,"finished":false}`},
	}
	for i, tt := range tests {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			b, err := ors.MarshalJSON(tt.out)
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(b))
			var back ors.ToolOutput
			require.NoError(t, json.Unmarshal(b, &back))
			b2, _ := ors.MarshalJSON(back)
			assert.Equal(t, tt.want, string(b2))
		})
	}
	nan := ors.ToolOutput{Reward: ors.Reward(nanValue())}
	b, err := ors.MarshalJSON(nan)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"reward":null`)
}

func nanValue() float64 { zero := 0.0; return zero / zero }

// A server that accepts connections and never answers: every plain request
// ends at its deadline with an error naming the request (issue 14).
func TestHungServerHitsTheRequestDeadline(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // accepted, never answered
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	c, err := ors.NewClient("http://"+l.Addr().String(), ors.Options{RequestTimeout: 200 * time.Millisecond, RequestAttempts: 1})
	require.NoError(t, err)
	start := time.Now()
	_, err = c.NumTasks(context.Background(), "train")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "no answer within 200ms")
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.Greater(t, ors.NewTransport().ResponseHeaderTimeout, time.Duration(0), "the shared transport bounds silent servers too")
}
