package envcheck

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
	"github.com/ortrain/ortrain/internal/verdict"
)

// oeServe serves the built-in env key over OpenEnv on 127.0.0.1:0
// until the test ends; maxSessions 0 keeps the kit's default (8).
func oeServe(t *testing.T, key string, maxSessions int) *envs.Served {
	t.Helper()
	srv, err := envs.ServeLocalProtocol(context.Background(), key, envs.ProtocolOpenEnv,
		envs.ServeOptions{OpenEnv: openenvserver.Options{MaxSessions: maxSessions}})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, srv.Stop(ctx))
	})
	return srv
}

func oeRun(t *testing.T, target, protocol string) *verdict.Verdict {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	v, err := Check(ctx, target, Options{Protocol: protocol, RequestTimeout: 5 * time.Second, CallTimeout: 10 * time.Second})
	require.NoError(t, err)
	return v
}

func oeLog(t *testing.T, v *verdict.Verdict) {
	t.Helper()
	var b strings.Builder
	require.NoError(t, v.WriteText(&b))
	t.Log("\n" + b.String())
}

func oeFind(t *testing.T, v *verdict.Verdict, name string) verdict.Check {
	t.Helper()
	for _, c := range v.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check named %q", name)
	return verdict.Check{}
}

func oeFailed(v *verdict.Verdict) []string {
	var out []string
	for _, c := range v.Checks {
		if c.Status == verdict.Fail {
			out = append(out, c.Name)
		}
	}
	return out
}

// TestOpenEnvBuiltinsConform: every built-in env served over OpenEnv by
// the kit passes every case (detected, not pinned), at the default
// capacity and at capacities 1 and 2; the suite leaves no session open.
func TestOpenEnvBuiltinsConform(t *testing.T) {
	type tc struct {
		name, key   string
		maxSessions int
	}
	var tests []tc
	for _, key := range envs.Names() {
		tests = append(tests, tc{name: key, key: key})
	}
	tests = append(tests, tc{"guess capacity 1", "guess", 1}, tc{"mcp-echo capacity 2", "mcp-echo", 2})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := oeServe(t, tt.key, tt.maxSessions)
			v := oeRun(t, srv.URL, "")
			t.Cleanup(func() {
				if t.Failed() {
					oeLog(t, v)
				}
			})
			assert.True(t, v.Passed())
			assert.Zero(t, v.Count(verdict.Fail), "failed: %v", oeFailed(v))
			assert.Equal(t, "env check (OpenEnv)", v.Suite)

			decl, err := envs.NewOpenEnv(tt.key)
			require.NoError(t, err)
			must := []string{"protocol detected", "openenv/health", "openenv/metadata", "openenv/http reset", "openenv/http state",
				"openenv/http reset bad seed", "openenv/http step without action", "openenv/http step invalid action",
				"openenv/http unknown path", "openenv/http wrong method", "openenv/mcp tools/list", "openenv/mcp unknown method",
				"openenv/mcp invalid request", "openenv/mcp parse error", "openenv/mcp websocket", "openenv/ws connect",
				"openenv/ws reset", "openenv/ws state", "openenv/ws state after step", "openenv/ws step invalid action",
				"openenv/ws mcp", "openenv/ws invalid JSON", "openenv/ws unknown type", "openenv/ws envelope extra key",
				"openenv/ws close", "openenv/ws non-object frame", "openenv/capacity"}
			if decl.MCP {
				must = append(must, "openenv/ws step list_tools", "openenv/ws step call_tool", "openenv/mcp tools/call")
			} else {
				must = append(must, "openenv/ws step")
				assert.Equal(t, verdict.Skip, oeFind(t, v, "openenv/mcp tools/call").Status, "a Gym-style env has no MCP tools")
			}
			for _, name := range must {
				assert.Equal(t, verdict.Pass, oeFind(t, v, name).Status, name)
			}
			capacity := oeFind(t, v, "openenv/capacity")
			assert.Contains(t, capacity.Observed, "CAPACITY_REACHED", "every kit capacity is below the probe's bound")
			indep := oeFind(t, v, "openenv/sessions independent")
			if tt.maxSessions == 1 {
				assert.Equal(t, verdict.Skip, indep.Status)
				assert.Contains(t, indep.Observed, "at most 1")
			} else {
				assert.Equal(t, verdict.Pass, indep.Status)
			}
			assert.Eventually(t, func() bool { return srv.OpenEnv.Stats().Live == 0 }, 5*time.Second, 10*time.Millisecond,
				"every socket the suite opened is closed")
		})
	}
}

// oeMutant serves upstream through a proxy that rewrites answers: HTTP
// bodies by httpMut, /ws server frames by wsMut (nil: unchanged).
func oeMutant(t *testing.T, upstream string, httpMut func(path string, res *http.Response, body []byte) []byte, wsMut func([]byte) []byte) string {
	t.Helper()
	u, err := url.Parse(upstream)
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ModifyResponse = func(res *http.Response) error {
		if httpMut == nil || res.StatusCode == http.StatusSwitchingProtocols {
			return nil
		}
		body, err := io.ReadAll(res.Body)
		_ = res.Body.Close()
		if err != nil {
			return err
		}
		body = httpMut(res.Request.URL.Path, res, body)
		res.Body = io.NopCloser(bytes.NewReader(body))
		res.ContentLength = int64(len(body))
		res.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ws" {
			oeProxyWS(w, r, upstream, wsMut)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// oeProxyWS pipes one /ws session to upstream, rewriting server frames and
// passing the server's close status on.
func oeProxyWS(w http.ResponseWriter, r *http.Request, upstream string, mut func([]byte) []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	up, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(upstream, "http")+"/ws", nil)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer func() { _ = up.CloseNow() }()
	down, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer func() { _ = down.CloseNow() }()
	done := make(chan struct{})
	defer func() { <-done }()
	go func() {
		defer close(done)
		for {
			typ, b, err := down.Read(ctx)
			if err != nil {
				_ = up.Close(websocket.StatusNormalClosure, "")
				return
			}
			if up.Write(ctx, typ, b) != nil {
				return
			}
		}
	}()
	for {
		typ, b, err := up.Read(ctx)
		if err != nil {
			st := websocket.CloseStatus(err)
			if st == -1 {
				st = websocket.StatusInternalError
			}
			_ = down.Close(st, "")
			return
		}
		if mut != nil {
			b = mut(b)
		}
		if down.Write(ctx, typ, b) != nil {
			return
		}
	}
}

// TestOpenEnvNonConformingNamed: a server that breaks one rule of §2
// fails exactly the case for that rule, and the case's observed names what
// came instead.
func TestOpenEnvNonConformingNamed(t *testing.T) {
	replace := func(old, new string) func([]byte) []byte {
		return func(b []byte) []byte { return bytes.ReplaceAll(b, []byte(old), []byte(new)) }
	}
	tests := []struct {
		name        string
		key         string
		maxSessions int
		httpMut     func(path string, res *http.Response, body []byte) []byte
		wsMut       func([]byte) []byte
		failed      map[string]string // case → a word its observed holds
		skipped     map[string]string // case → a word its reason holds
	}{
		{name: "health answers plain text", key: "guess",
			httpMut: func(path string, res *http.Response, body []byte) []byte {
				if path != "/health" {
					return body
				}
				res.Header.Set("Content-Type", "text/plain")
				return []byte("OK")
			},
			failed: map[string]string{"openenv/health": "JSON"}},
		{name: "schema without the action schema", key: "guess",
			httpMut: func(path string, _ *http.Response, body []byte) []byte {
				if path != "/schema" {
					return body
				}
				var m map[string]json.RawMessage
				if json.Unmarshal(body, &m) != nil {
					return body
				}
				delete(m, "action")
				b, _ := json.Marshal(m)
				return b
			},
			failed:  map[string]string{"openenv/schema": "action"},
			skipped: map[string]string{"openenv/ws step": "openenv/schema", "openenv/sessions independent": "openenv/schema"}},
		{name: "unknown ws type answered VALIDATION_ERROR", key: "mcp-echo",
			wsMut:  replace(`"UNKNOWN_TYPE"`, `"VALIDATION_ERROR"`),
			failed: map[string]string{"openenv/ws unknown type": "VALIDATION_ERROR"}},
		{name: "invalid JSON frame answered UNKNOWN_TYPE", key: "guess",
			wsMut:  replace(`"INVALID_JSON"`, `"UNKNOWN_TYPE"`),
			failed: map[string]string{"openenv/ws invalid JSON": "UNKNOWN_TYPE"}},
		{name: "unknown MCP method answered -32600", key: "mcp-echo",
			httpMut: func(path string, _ *http.Response, body []byte) []byte {
				if path != "/mcp" {
					return body
				}
				return bytes.ReplaceAll(body, []byte(`-32601`), []byte(`-32600`))
			},
			failed: map[string]string{"openenv/mcp unknown method": "-32600"}},
		{name: "capacity refusal answered SESSION_ERROR", key: "guess", maxSessions: 2,
			wsMut:  replace(`"CAPACITY_REACHED"`, `"SESSION_ERROR"`),
			failed: map[string]string{"openenv/capacity": "SESSION_ERROR"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := oeServe(t, tt.key, tt.maxSessions)
			v := oeRun(t, oeMutant(t, up.URL, tt.httpMut, tt.wsMut), OpenEnv)
			t.Cleanup(func() {
				if t.Failed() {
					oeLog(t, v)
				}
			})
			want := make([]string, 0, len(tt.failed))
			for name := range tt.failed {
				want = append(want, name)
			}
			assert.ElementsMatch(t, want, oeFailed(v), "exactly the broken rules fail")
			for name, word := range tt.failed {
				c := oeFind(t, v, name)
				assert.Equal(t, verdict.Fail, c.Status, name)
				assert.Contains(t, c.Observed, word, name)
				assert.NotEmpty(t, c.Expected, name)
			}
			for name, word := range tt.skipped {
				c := oeFind(t, v, name)
				assert.Equal(t, verdict.Skip, c.Status, name)
				assert.Contains(t, c.Observed, word, name)
			}
		})
	}
}

// TestOpenEnvUnreachable: a server that is not there fails the cases
// that talk to it and skips the ones that need them, without an error.
func TestOpenEnvUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	target := srv.URL
	srv.Close()
	v := oeRun(t, target, OpenEnv)
	assert.False(t, v.Passed())
	for _, name := range []string{"openenv/health", "openenv/schema", "openenv/ws connect"} {
		assert.Equal(t, verdict.Fail, oeFind(t, v, name).Status, name)
	}
	for _, name := range []string{"openenv/ws reset", "openenv/ws step", "openenv/capacity", "openenv/sessions independent"} {
		c := oeFind(t, v, name)
		assert.Equal(t, verdict.Skip, c.Status, name)
		assert.Contains(t, c.Observed, "needs", name)
	}
}
