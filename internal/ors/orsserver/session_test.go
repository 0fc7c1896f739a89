package orsserver_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
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

// TestCreateSessionConformance covers §13.2 S1, S2 and the JSON form.
func TestCreateSessionConformance(t *testing.T) {
	f := startServer(t, orsserver.Options{}, envs.Echo())
	secrets := base64.StdEncoding.EncodeToString([]byte(`{"api_key":{"value":"k"}}`))
	tests := []struct {
		name string
		hdr  map[string]string
	}{
		{"S1", map[string]string{"Accept": "text/event-stream"}},
		{"S2", map[string]string{"Accept": "text/event-stream", "X-Secrets": secrets, "X-Deployment": "Owner/Env", "X-API-Key": ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := f.do(t, f.follow, "POST", "/create_session", `{}`, tt.hdr)
			require.Equal(t, 200, resp.status)
			assert.Equal(t, "text/event-stream; charset=utf-8", resp.header.Get("Content-Type"))
			assert.Equal(t, "no-cache", resp.header.Get("Cache-Control"))
			evs := events(t, resp.body)
			require.Len(t, evs, 2)
			assert.Equal(t, "task_id", evs[0].Name)
			assert.Len(t, evs[0].Data, 36)
			assert.Equal(t, ors.Event{Name: "end"}, evs[1])
			for _, line := range strings.Split(strings.TrimSuffix(resp.body, "\r\n"), "\r\n") {
				assert.True(t, line == "" || strings.Contains(line, ":"), "line %q has no colon", line)
			}
			assert.True(t, strings.HasPrefix(resp.body, "event: task_id\r\ndata: "))
		})
	}
	t.Run("JSON without Accept", func(t *testing.T) {
		resp := f.do(t, f.follow, "POST", "/create_session", `{}`, nil)
		require.Equal(t, 200, resp.status)
		var v map[string]string
		require.NoError(t, json.Unmarshal([]byte(resp.body), &v))
		assert.Len(t, v["sid"], 36)
	})
}

type step struct {
	id, method, path, body string
	hdr                    map[string]string // "S" values are replaced by the sid
	noSID                  bool
	status                 int
	exact                  string // "S" inside is replaced by the sid
	contains               string
	list422                bool
}

func runSteps(t *testing.T, f *fixture, sid string, steps []step) {
	t.Helper()
	for _, st := range steps {
		hdr := map[string]string{}
		if !st.noSID {
			hdr["X-Session-ID"] = sid
		}
		for k, v := range st.hdr {
			hdr[k] = v
		}
		resp := f.do(t, f.follow, st.method, st.path, st.body, hdr)
		require.Equal(t, st.status, resp.status, "%s: %s", st.id, resp.body)
		assert.Equal(t, "application/json", resp.header.Get("Content-Type"), st.id)
		if st.exact != "" {
			assert.Equal(t, strings.ReplaceAll(st.exact, `"S"`, `"`+sid+`"`), resp.body, st.id)
		}
		if st.contains != "" {
			assert.Contains(t, resp.body, st.contains, st.id)
		}
		if st.list422 {
			assert.IsType(t, []any{}, detailOf(t, resp.body), st.id)
		}
	}
}

// TestSessionLifecycleConformance covers §13.2 S3–S24.
func TestSessionLifecycleConformance(t *testing.T) {
	f := startServer(t, orsserver.Options{}, envs.Echo())
	const prompt = "[{\"text\":\"Call the `echo` tool with text='openreward' to win.\",\"detail\":null,\"type\":\"text\"}]"
	const hintSpec = `{"name":"hint","description":"Get a hint about how to win.","input_schema":{"properties":{},"title":"HintParams","type":"object"}}`
	steps := []step{
		{id: "S3", method: "POST", path: "/create", body: `{"split":"train","index":3}`, status: 200, exact: `{"sid":"S"}`},
		{id: "S4", method: "POST", path: "/create", body: `{"split":"train","index":3}`, status: 400, exact: `{"detail":"Session already exists"}`},
		{id: "S14", method: "POST", path: "/ping", status: 200, exact: `{"status":"ok"}`},
		{id: "S15", method: "POST", path: "/ping", hdr: map[string]string{"X-Session-ID": "unknown"}, status: 404, exact: `{"detail":"Active environment not found"}`},
		{id: "S16", method: "POST", path: "/ping", noSID: true, status: 400, exact: `{"detail":"X-Session-ID header is required"}`},
		{id: "S17", method: "GET", path: "/echoenvironment/prompt", status: 200, exact: prompt},
		{id: "S18", method: "GET", path: "/prompt", status: 200, exact: prompt},
		{id: "S19", method: "GET", path: "/echoenvironment/prompt", hdr: map[string]string{"X-Session-ID": "unknown"}, status: 404, exact: `{"detail":"Active environment not found"}`},
		{id: "S20", method: "GET", path: "/echoenvironment/task_tools", status: 200, exact: strings.TrimSuffix(echoToolsJSON, "]}") + "," + hintSpec + "]}"},
		{id: "S21", method: "POST", path: "/delete", status: 200, exact: `{"sid":"S"}`},
		{id: "S21 prompt", method: "GET", path: "/echoenvironment/prompt", status: 404, exact: `{"detail":"Active environment not found"}`},
		{id: "S21 ping", method: "POST", path: "/ping", status: 404},
		{id: "S22", method: "POST", path: "/delete", hdr: map[string]string{"X-Session-ID": "never-created"}, status: 200, exact: `{"sid":"never-created"}`},
		{id: "S23", method: "POST", path: "/delete_session", status: 200, exact: `{"sid":"S"}`},
		{id: "S24", method: "POST", path: "/create", body: `{"split":"train","index":0}`, status: 200, exact: `{"sid":"S"}`},
		{id: "S24 prompt", method: "GET", path: "/prompt", status: 200, contains: "hello"},
	}
	runSteps(t, f, "sid-lifecycle", steps)

	creates := []step{
		{id: "S5", body: `{"task_spec":{"id":"x","target":"zz"},"env_name":"echoenvironment"}`, status: 200},
		{id: "S6", body: `{}`, status: 422, list422: true},
		{id: "S7", body: `{"task_spec":{"id":"x","target":"zz"},"split":"train","index":0}`, status: 422, list422: true},
		{id: "S8", body: `{"split":"train"}`, status: 422, list422: true},
		{id: "S9", body: `{"split":"nope","index":0}`, status: 400, exact: `{"detail":"Invalid split"}`},
		{id: "S10", body: `{"split":"train","index":99}`, status: 400, exact: `{"detail":"Invalid index"}`},
		{id: "S11", body: `{"env_name":"nope","split":"train","index":0}`, status: 404, exact: `{"detail":"unknown environment 'nope'"}`},
		{id: "S12", body: `{"split":"train","index":0}`, noSID: true, status: 400, exact: `{"detail":"X-Session-ID header is required"}`},
		{id: "extra key", body: `{"split":"train","index":0,"bogus":1}`, status: 422, list422: true},
		{id: "case-insensitive env_name", body: `{"env_name":"EchoEnvironment","split":"train","index":1}`, status: 200},
	}
	for i, c := range creates {
		t.Run(c.id, func(t *testing.T) {
			c.method, c.path = "POST", "/create"
			sid := "create-" + string(rune('a'+i))
			runSteps(t, f, sid, []step{c})
			if c.id == "S5" {
				runSteps(t, f, sid, []step{{id: "S5 prompt", method: "GET", path: "/prompt", status: 200, contains: "zz"}})
			}
		})
	}
}

// secretsEnv records the secrets its constructor receives and can be told
// to sleep or fail in Setup.
type probeInstance struct {
	secrets   map[string]string
	setup     func(ctx context.Context) error
	tornDown  *atomic.Int64
	setupDone atomic.Bool
}

func (p *probeInstance) Prompt(context.Context) ([]ors.Block, error) {
	b, _ := json.Marshal(p.secrets)
	return []ors.Block{ors.TextBlock(string(b))}, nil
}

func (p *probeInstance) Setup(ctx context.Context) error {
	defer p.setupDone.Store(true)
	if p.setup != nil {
		return p.setup(ctx)
	}
	return nil
}

func (p *probeInstance) Teardown(context.Context) error { p.tornDown.Add(1); return nil }

func probeEnv(setup func(ctx context.Context) error, tornDown *atomic.Int64) *orsserver.Env {
	env := envs.Echo()
	env.Name = "probe"
	env.Tools = []orsserver.Tool{orsserver.NewToolNoInput("noop", "does nothing", func(context.Context, *probeInstance) (ors.ToolOutput, error) {
		return ors.ToolOutput{}, nil
	})}
	env.New = func(_ context.Context, _ json.RawMessage, secrets map[string]string) (orsserver.Instance, error) {
		return &probeInstance{secrets: secrets, setup: setup, tornDown: tornDown}, nil
	}
	return env
}

// TestSecrets covers S13 and the body form.
func TestSecrets(t *testing.T) {
	var torn atomic.Int64
	f := startServer(t, orsserver.Options{}, probeEnv(nil, &torn))
	hdr := base64.StdEncoding.EncodeToString([]byte(`{"api_key":{"value":"k","allowed_domains":["h"]},"both":{"value":"header"}}`))
	runSteps(t, f, "sec", []step{
		{id: "S13", method: "POST", path: "/create", body: `{"split":"train","index":0,"secrets":{"body_only":"b","both":"body"}}`,
			hdr: map[string]string{"X-Secrets": hdr}, status: 200},
		{id: "S13 prompt", method: "GET", path: "/prompt", status: 200,
			contains: `{\"api_key\":\"k\",\"body_only\":\"b\",\"both\":\"header\"}`},
		{id: "bad X-Secrets", method: "POST", path: "/create", body: `{"split":"train","index":0}`,
			hdr: map[string]string{"X-Secrets": "%%%", "X-Session-ID": "other"}, status: 400},
	})
}

// TestAsyncSetup covers S25 and S26 and the 410 for a delete during setup.
func TestAsyncSetup(t *testing.T) {
	var torn atomic.Int64
	release := make(chan struct{})
	slow := func(ctx context.Context) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f := startServer(t, orsserver.Options{}, probeEnv(slow, &torn))

	t.Run("S25 prompt waits for setup", func(t *testing.T) {
		runSteps(t, f, "slow", []step{{id: "create", method: "POST", path: "/create", body: `{"split":"train","index":0}`, status: 200}})
		done := make(chan response, 1)
		go func() { done <- f.do(t, f.follow, "GET", "/prompt", "", sidHeader("slow")) }()
		select {
		case <-done:
			t.Fatal("prompt returned before setup finished")
		case <-time.After(200 * time.Millisecond):
		}
		runSteps(t, f, "slow", []step{{id: "ping while setting up", method: "POST", path: "/ping", status: 200}})
		close(release)
		resp := <-done
		assert.Equal(t, 200, resp.status)
	})

	t.Run("delete during setup gives 410", func(t *testing.T) {
		blocked := probeEnv(func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }, &torn)
		f2 := startServer(t, orsserver.Options{}, blocked)
		runSteps(t, f2, "blk", []step{{id: "create", method: "POST", path: "/create", body: `{"split":"train","index":0}`, status: 200}})
		done := make(chan response, 1)
		go func() { done <- f2.do(t, f2.follow, "GET", "/prompt", "", sidHeader("blk")) }()
		time.Sleep(100 * time.Millisecond)
		runSteps(t, f2, "blk", []step{{id: "delete", method: "POST", path: "/delete", status: 200}})
		resp := <-done
		assert.Equal(t, http.StatusGone, resp.status)
		assert.Equal(t, `{"detail":"Session deleted"}`, resp.body)
	})

	t.Run("S26 setup error re-raised", func(t *testing.T) {
		failing := probeEnv(func(context.Context) error { return errors.New("RuntimeError: boom") }, &torn)
		f3 := startServer(t, orsserver.Options{}, failing)
		runSteps(t, f3, "fail", []step{
			{id: "create", method: "POST", path: "/create", body: `{"split":"train","index":0}`, status: 200},
			{id: "prompt", method: "GET", path: "/prompt", status: 500, exact: `{"detail":"RuntimeError: boom"}`},
			{id: "task_tools", method: "GET", path: "/probe/task_tools", status: 500},
			{id: "call", method: "POST", path: "/probe/call", body: `{"name":"noop","input":{}}`, status: 500},
			{id: "ping", method: "POST", path: "/ping", status: 200},
		})
	})
}

// TestIdleReaping covers S27 and S28 with shortened timers.
func TestIdleReaping(t *testing.T) {
	var torn atomic.Int64
	f := startServer(t, orsserver.Options{IdleTimeout: 300 * time.Millisecond, ReapInterval: 20 * time.Millisecond}, probeEnv(nil, &torn))
	runSteps(t, f, "idle", []step{{id: "create idle", method: "POST", path: "/create", body: `{"split":"train","index":0}`, status: 200}})
	runSteps(t, f, "pinged", []step{{id: "create pinged", method: "POST", path: "/create", body: `{"split":"train","index":0}`, status: 200}})
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		runSteps(t, f, "pinged", []step{{id: "S28 ping", method: "POST", path: "/ping", status: 200}})
		time.Sleep(50 * time.Millisecond)
	}
	runSteps(t, f, "idle", []step{{id: "S27 prompt after reap", method: "GET", path: "/prompt", status: 404}})
	runSteps(t, f, "pinged", []step{{id: "S28 alive", method: "GET", path: "/prompt", status: 200}})
	assert.Equal(t, int64(1), torn.Load(), "the reaped session was torn down")
	st := f.srv.Stats()
	assert.Equal(t, orsserver.Stats{Live: 1, Created: 2, Deleted: 1, Reaped: 1}, st)
}

// TestShutdownTearsDownSessions checks that Shutdown deletes every live session.
func TestShutdownTearsDownSessions(t *testing.T) {
	var torn atomic.Int64
	f := startServer(t, orsserver.Options{}, probeEnv(nil, &torn))
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := f.do(t, f.follow, "POST", "/create", `{"split":"train","index":0}`, sidHeader("s"+string(rune('A'+i))))
			assert.Equal(t, 200, resp.status)
			resp = f.do(t, f.follow, "GET", "/prompt", "", sidHeader("s"+string(rune('A'+i))))
			assert.Equal(t, 200, resp.status)
		}()
	}
	wg.Wait()
	assert.Equal(t, int64(20), f.srv.Stats().Live)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, f.srv.Shutdown(ctx))
	assert.Equal(t, int64(20), torn.Load())
	assert.Equal(t, orsserver.Stats{Live: 0, Created: 20, Deleted: 20}, f.srv.Stats())
}
