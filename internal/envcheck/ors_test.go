package envcheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
	"github.com/ortrain/ortrain/internal/verdict"
)

// orsCases lists every case checkORS records, in order.
func orsCases() []string {
	return []string{
		"ors/health", "ors/list_environments", "ors/tools", "ors/splits", "ors/num_tasks",
		"ors/task", "ors/task_range", "ors/tasks",
		"ors/num_tasks unknown split", "ors/task index out of range", "ors/ping without session id", "ors/ping unknown session",
		"ors/create_session", "ors/create", "ors/create twice", "ors/ping keeps the session alive",
		"ors/prompt", "ors/task_tools", "ors/call unknown tool", "ors/call first tool",
		"ors/episode ends with a reward", "ors/delete", "ors/delete_session",
	}
}

func testOptions() Options {
	return Options{Protocol: ORS, RequestTimeout: 10 * time.Second, CallTimeout: 20 * time.Second}
}

// runCheck runs the suite and logs the text verdict when the test fails.
func runCheck(t *testing.T, target string, o Options) *verdict.Verdict {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	v, err := Check(ctx, target, o)
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			var b bytes.Buffer
			_ = v.WriteText(&b)
			t.Log("\n" + b.String())
		}
	})
	return v
}

func findCheck(t *testing.T, v *verdict.Verdict, name string) verdict.Check {
	t.Helper()
	for _, c := range v.Checks {
		if c.Name == name {
			return c
		}
	}
	require.Failf(t, "no such check", "%q not in the verdict", name)
	return verdict.Check{}
}

func checkNames(v *verdict.Verdict) []string {
	var names []string
	for _, c := range v.Checks {
		if strings.HasPrefix(c.Name, "ors/") {
			names = append(names, c.Name)
		}
	}
	return names
}

// startORS serves envList with the kit's server behind wrap (nil: none) on
// 127.0.0.1 at a free port.
func startORS(t *testing.T, wrap func(http.Handler) http.Handler, envList ...*orsserver.Env) (string, *orsserver.Server) {
	t.Helper()
	srv, err := orsserver.New(orsserver.Options{}, envList...)
	require.NoError(t, err)
	var h http.Handler = srv
	if wrap != nil {
		h = wrap(srv)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(func() {
		ts.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		assert.NoError(t, srv.Shutdown(ctx))
	})
	return ts.URL, srv
}

func TestORSBuiltinEnvsPass(t *testing.T) {
	var keys []string
	for _, info := range envs.List() {
		if info.Protocol == envs.ProtocolORS {
			keys = append(keys, info.Key)
		}
	}
	require.Subset(t, keys, []string{"echo", "letters", "lockbox"})
	for _, key := range keys {
		t.Run(key, func(t *testing.T) {
			url, srv, stop, err := envs.ServeLocal(t.Context(), key, orsserver.Options{})
			require.NoError(t, err)
			t.Cleanup(func() { _ = stop(context.Background()) })
			v := runCheck(t, url, Options{}) // detect the protocol too
			assert.True(t, v.Passed())
			assert.Zero(t, v.Count(verdict.Fail))
			assert.Zero(t, v.Count(verdict.Skip))
			assert.Equal(t, "env check (ORS)", v.Suite)
			assert.Equal(t, orsCases(), checkNames(v))
			assert.Zero(t, srv.Stats().Live, "the check leaves no session behind")
		})
	}
}

func TestORSPicksEnvAndSplit(t *testing.T) {
	tests := []struct {
		name      string
		path      string
		o         Options
		wantEnv   string
		wantSplit string
	}{
		{name: "first listed env and first split", wantEnv: `"` + envs.EchoEnvName + `" (the first listed)`, wantSplit: `"train" (the first)`},
		{name: "env from the URL path", path: "/letters", wantEnv: `"letters" (the URL's path)`, wantSplit: `"train" (the first)`},
		{name: "env and split from options, case-insensitive env", o: Options{Env: "LockBox", Split: "validation"},
			wantEnv: `"LockBox" (--env)`, wantSplit: `"validation" (--split)`},
	}
	url, _ := startORS(t, nil, envs.Echo(), envs.Letters(), envs.Lockbox())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := testOptions()
			o.Env, o.Split = tt.o.Env, tt.o.Split
			v := runCheck(t, url+tt.path, o)
			assert.True(t, v.Passed())
			assert.Contains(t, findCheck(t, v, "ors/list_environments").Observed, "checking env "+tt.wantEnv)
			assert.Contains(t, findCheck(t, v, "ors/splits").Observed, "checking split "+tt.wantSplit)
		})
	}
}

// Middleware that breaks one thing of a conforming server.

// on reports whether r is a request to endpoint (its last path segment).
func on(r *http.Request, endpoint string) bool {
	return strings.HasSuffix(r.URL.Path, "/"+endpoint)
}

// isProbeCall: r is the checker's /call of a tool that does not exist.
func isProbeCall(r *http.Request) bool {
	b, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(b))
	return bytes.Contains(b, []byte(noSuchTool))
}

// answer replaces the server's answer to matching requests.
func answer(match func(*http.Request) bool, h http.HandlerFunc) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if match(r) {
				h(w, r)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// rewrite passes matching requests on and edits the body of the answer.
func rewrite(match func(*http.Request) bool, edit func([]byte) []byte) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !match(r) {
				next.ServeHTTP(w, r)
				return
			}
			rec := httptest.NewRecorder()
			next.ServeHTTP(rec, r)
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.Header().Del("Content-Length")
			w.WriteHeader(rec.Code)
			_, _ = w.Write(edit(rec.Body.Bytes()))
		})
	}
}

// dropKey removes key from a JSON object answer.
func dropKey(key string) func([]byte) []byte {
	return func(b []byte) []byte {
		var obj map[string]json.RawMessage
		if json.Unmarshal(b, &obj) != nil {
			return b
		}
		delete(obj, key)
		out, _ := json.Marshal(obj)
		return out
	}
}

func writeJSONAnswer(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

func writeSSE(w http.ResponseWriter, body string) {
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, body)
}

// boomEcho is echo whose only shared tool always raises.
func boomEcho() *orsserver.Env {
	env := envs.Echo()
	env.Tools = []orsserver.Tool{orsserver.NewToolNoInput("boom", "raises", func(context.Context, orsserver.Instance) (ors.ToolOutput, error) {
		return ors.ToolOutput{}, errors.New("bad")
	})}
	return env
}

// noRewardEcho's only tool ends the episode without a reward.
func noRewardEcho() *orsserver.Env {
	env := envs.Echo()
	env.Tools = []orsserver.Tool{orsserver.NewToolNoInput("finish", "ends the episode", func(context.Context, orsserver.Instance) (ors.ToolOutput, error) {
		return ors.ToolOutput{Blocks: []ors.Block{ors.TextBlock("done")}, Finished: true}, nil
	})}
	return env
}

func TestORSNonConformingServers(t *testing.T) {
	type want struct {
		name     string
		status   verdict.Status
		observed string // a key word of Observed
	}
	tests := []struct {
		name string
		wrap func(http.Handler) http.Handler
		env  func() *orsserver.Env
		want []want
	}{
		{name: "task and task_range without env_name",
			wrap: rewrite(func(r *http.Request) bool { return on(r, "task") || on(r, "task_range") }, dropKey("env_name")),
			want: []want{{"ors/task", verdict.Fail, `no "env_name" key`}, {"ors/task_range", verdict.Fail, "env_name"}, {"ors/tasks", verdict.Pass, ""}}},
		{name: "health answered as text/plain",
			wrap: answer(func(r *http.Request) bool { return on(r, "health") }, func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "text/plain")
				_, _ = io.WriteString(w, `{"status":"ok"}`)
			}),
			want: []want{{"ors/health", verdict.Fail, "Content-Type"}, {"ors/list_environments", verdict.Pass, ""}}},
		{name: "tool spec with an extra key",
			wrap: rewrite(func(r *http.Request) bool { return on(r, "tools") }, func(b []byte) []byte {
				return bytes.Replace(b, []byte(`"name":`), []byte(`"title":"x","name":`), 1)
			}),
			want: []want{{"ors/tools", verdict.Fail, "extra key"}}},
		{name: "create_session with lone CR line endings",
			wrap: rewrite(func(r *http.Request) bool { return on(r, "create_session") }, func(b []byte) []byte {
				return bytes.ReplaceAll(b, []byte("\r\n"), []byte("\r"))
			}),
			want: []want{{"ors/create_session", verdict.Fail, `lone \r`}, {"ors/create", verdict.Skip, "ors/create_session"},
				{"ors/delete", verdict.Skip, "ors/create_session failed"}}},
		{name: "create_session data without an event line",
			wrap: answer(func(r *http.Request) bool { return on(r, "create_session") }, func(w http.ResponseWriter, _ *http.Request) {
				writeSSE(w, "data: some-sid\r\n\r\nevent: end\r\ndata: \r\n\r\n")
			}),
			want: []want{{"ors/create_session", verdict.Fail, "event: line"}}},
		{name: "create_session without end",
			wrap: answer(func(r *http.Request) bool { return on(r, "create_session") }, func(w http.ResponseWriter, _ *http.Request) {
				writeSSE(w, "event: task_id\r\ndata: some-sid\r\n\r\n")
			}),
			want: []want{{"ors/create_session", verdict.Fail, "no end"}}},
		{name: "call with a line without colon",
			wrap: rewrite(func(r *http.Request) bool { return on(r, "call") }, func(b []byte) []byte {
				return append([]byte("bogus\r\n"), b...)
			}),
			want: []want{{"ors/call unknown tool", verdict.Fail, "no colon"}, {"ors/call first tool", verdict.Fail, "no colon"}}},
		{name: "call with lone CR line endings",
			wrap: rewrite(func(r *http.Request) bool { return on(r, "call") }, func(b []byte) []byte {
				return bytes.ReplaceAll(b, []byte("\r\n"), []byte("\r"))
			}),
			want: []want{{"ors/call first tool", verdict.Fail, `lone \r`}}},
		{name: "tool that raises: an error event",
			env:  boomEcho,
			want: []want{{"ors/call first tool", verdict.Fail, "error event"}, {"ors/call unknown tool", verdict.Pass, ""}}},
		{name: "tool call answered HTTP 500",
			wrap: answer(func(r *http.Request) bool { return on(r, "call") && !isProbeCall(r) }, func(w http.ResponseWriter, _ *http.Request) {
				writeJSONAnswer(w, http.StatusInternalServerError, `{"detail":"Internal Server Error"}`)
			}),
			want: []want{{"ors/call first tool", verdict.Fail, "HTTP 500"}}},
		{name: "unknown tool answered HTTP 404 instead of ok:false",
			wrap: answer(func(r *http.Request) bool { return on(r, "call") && isProbeCall(r) }, func(w http.ResponseWriter, _ *http.Request) {
				writeJSONAnswer(w, http.StatusNotFound, `{"detail":"no such tool"}`)
			}),
			want: []want{{"ors/call unknown tool", verdict.Fail, "HTTP 404"}, {"ors/call first tool", verdict.Pass, ""}}},
		{name: "reward never sent: the episode ends with reward null",
			env:  noRewardEcho,
			want: []want{{"ors/episode ends with a reward", verdict.Fail, "reward null"}, {"ors/call first tool", verdict.Pass, ""}}},
		{name: "session that never closes",
			wrap: answer(func(r *http.Request) bool { return on(r, "delete") }, func(w http.ResponseWriter, r *http.Request) {
				writeJSONAnswer(w, http.StatusOK, `{"sid":"`+r.Header.Get("X-Session-ID")+`"}`)
			}),
			want: []want{{"ors/delete", verdict.Fail, "still alive"}, {"ors/delete_session", verdict.Pass, ""}}},
		{name: "errors without a JSON detail",
			wrap: answer(func(r *http.Request) bool { return on(r, "ping") && r.Header.Get("X-Session-ID") == "" }, func(w http.ResponseWriter, _ *http.Request) {
				http.Error(w, "X-Session-ID header is required", http.StatusBadRequest)
			}),
			want: []want{{"ors/ping without session id", verdict.Fail, "Content-Type"}, {"ors/ping unknown session", verdict.Pass, ""}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := envs.Echo
			if tt.env != nil {
				env = tt.env
			}
			url, _ := startORS(t, tt.wrap, env())
			v := runCheck(t, url, testOptions())
			assert.False(t, v.Passed())
			for _, w := range tt.want {
				c := findCheck(t, v, w.name)
				assert.Equal(t, w.status, c.Status, "%s: %s", w.name, c.Observed)
				assert.Contains(t, c.Observed, w.observed, w.name)
			}
		})
	}
}

func TestORSCleanupDeletesTheSession(t *testing.T) {
	// The first /delete fails, so the case fails; the deferred cleanup
	// deletes the session anyway.
	var deletes atomic.Int64
	wrap := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if on(r, "delete") && deletes.Add(1) == 1 {
				writeJSONAnswer(w, http.StatusInternalServerError, `{"detail":"boom"}`)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	url, srv := startORS(t, wrap, envs.Echo())
	v := runCheck(t, url, testOptions())
	assert.Equal(t, verdict.Fail, findCheck(t, v, "ors/delete").Status)
	assert.Equal(t, int64(2), deletes.Load())
	assert.Equal(t, int64(1), srv.Stats().Created)
	assert.Zero(t, srv.Stats().Live)
}

func TestORSUnreachableServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "http://" + l.Addr().String()
	require.NoError(t, l.Close())
	v := runCheck(t, url, testOptions())
	assert.Equal(t, orsCases(), checkNames(v))
	assert.Equal(t, verdict.Fail, findCheck(t, v, "ors/health").Status)
	assert.Equal(t, 1, v.Count(verdict.Fail))
	for _, c := range v.Checks[1:] {
		assert.Equal(t, verdict.Skip, c.Status, c.Name)
		assert.Contains(t, c.Observed, "ors/health", c.Name)
	}
}

func TestORSCancelledContextSkipsTheRest(t *testing.T) {
	// A server that cancels the check while answering /tools: the cases
	// after it are skipped, not failed one by one.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	wrap := answer(func(r *http.Request) bool { return on(r, "tools") }, func(w http.ResponseWriter, _ *http.Request) {
		cancel()
		writeJSONAnswer(w, http.StatusOK, `{"tools":[]}`)
	})
	url, srv := startORS(t, wrap, envs.Echo())
	v, err := Check(ctx, url, testOptions())
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, orsCases(), checkNames(v))
	assert.Equal(t, verdict.Skip, findCheck(t, v, "ors/delete_session").Status)
	assert.Contains(t, findCheck(t, v, "ors/create").Observed, "canceled")
	assert.Zero(t, srv.Stats().Created)
}
