package openenv_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/openenv"
	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
)

// serveHandler runs h on 127.0.0.1:0 until the test ends.
func serveHandler(t *testing.T, h http.Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = hs.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
		<-done
	})
	return "http://" + l.Addr().String()
}

// securedKit serves the kit's mcp-echo env behind a bearer-token check on
// every request, WebSocket upgrades included (a private HF Space).
func securedKit(t *testing.T, token string) string {
	t.Helper()
	srv, err := openenvserver.New(openenvserver.Options{}, envs.MCPEcho())
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "Invalid credentials", http.StatusUnauthorized)
			return
		}
		srv.ServeHTTP(w, r)
	}))
}

// Issue 23 item 4: the token goes with every HTTP request and the /ws and
// /mcp upgrades; a 401 is an *AuthError naming the variable to set.
func TestBearerToken(t *testing.T) {
	ctx := context.Background()
	url := securedKit(t, "tok")
	opts := fastOptions()
	opts.Token, opts.TokenEnv = "tok", "HF_TOKEN"
	c := newClient(t, url, opts)
	require.NoError(t, c.Health(ctx))
	_, err := c.Schema(ctx)
	require.NoError(t, err)
	_, err = c.MCP(ctx, "tools/list", nil)
	require.NoError(t, err)
	s, _, err := c.Start(ctx, nil)
	require.NoError(t, err)
	_, err = s.ListTools(ctx)
	require.NoError(t, err)
	require.NoError(t, s.Close(ctx))
	m, err := c.DialMCP(ctx)
	require.NoError(t, err)
	_, err = m.Call(ctx, "tools/list", nil)
	require.NoError(t, err)
	require.NoError(t, m.Close(ctx))

	tests := []struct {
		name, token, env string
		sent             bool
		want             string
	}{
		{"no token", "", "HF_TOKEN", false, "set HF_TOKEN (it is not set)"},
		{"wrong token", "nope", "HF_TOKEN", true, "refused the token in HF_TOKEN (it is set)"},
		{"no variable named", "", "", false, "token_env"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := fastOptions()
			opts.Token, opts.TokenEnv = tt.token, tt.env
			c := newClient(t, url, opts)
			for what, call := range map[string]func() error{
				"http": func() error { return c.Health(ctx) },
				"ws":   func() error { _, _, err := c.Start(ctx, nil); return err },
				"mcp":  func() error { _, err := c.DialMCP(ctx); return err },
			} {
				err := call()
				var ae *openenv.AuthError
				require.ErrorAs(t, err, &ae, what)
				assert.Equal(t, http.StatusUnauthorized, ae.Status, what)
				assert.Equal(t, tt.sent, ae.TokenSent, what)
				assert.Contains(t, err.Error(), tt.want, what)
				if tt.token != "" {
					assert.NotContains(t, err.Error(), tt.token, "the token is never shown")
				}
			}
		})
	}
}

// A plain web server's HTML error page is summarised, not dumped.
func TestHTTPErrorSummarisesHTML(t *testing.T) {
	page := "<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head><body><center><h1>404 Not Found</h1></center><hr><center>nginx</center></body></html>\n"
	url := serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(page))
	}))
	err := newClient(t, url, fastOptions()).Health(context.Background())
	var he *openenv.HTTPError
	require.ErrorAs(t, err, &he)
	assert.Equal(t, http.StatusNotFound, he.Status)
	assert.Equal(t, "text/html", he.ContentType)
	assert.Contains(t, err.Error(), `HTTP 404: text/html, first line "404 Not Found"`, "an HTML page gives its title")
	assert.NotContains(t, err.Error(), "<body>")
}

// strayServer speaks just enough /ws and /mcp to answer reset, state and
// tools/list, sending frames nobody asked for around every reply (as a
// newer server's telemetry might).
func strayServer(t *testing.T) string {
	t.Helper()
	return serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer func() { _ = conn.CloseNow() }()
		ctx := r.Context()
		send := func(s string) bool { return conn.Write(ctx, websocket.MessageText, []byte(s)) == nil }
		if r.URL.Path == "/mcp" {
			for {
				_, data, err := conn.Read(ctx)
				if err != nil {
					return
				}
				var req struct{ ID json.RawMessage }
				_ = json.Unmarshal(data, &req)
				if !send(`{"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}`) ||
					!send(`{"jsonrpc":"2.0","id":`+string(req.ID)+`,"result":{"tools":[]}}`) {
					return
				}
			}
		}
		if !send(`{"type":"validation_started","data":{"checks":3}}`) {
			return
		}
		for {
			_, data, err := conn.Read(ctx)
			if err != nil {
				return
			}
			var f struct{ Type string }
			_ = json.Unmarshal(data, &f)
			var reply string
			switch f.Type {
			case "reset":
				reply = `{"type":"observation","data":{"observation":{"ok":true},"reward":0.0,"done":false}}`
			case "state":
				reply = `{"type":"state","data":{"episode_id":"e","step_count":0}}`
			case "close":
				_ = conn.Close(websocket.StatusNormalClosure, "")
				return
			}
			if !send(`{"type": "validation_progress", "data": {"step": "`+f.Type+`"}}`) || !send(reply) || !send(`{"data":{},"type":"validation_result"}`) {
				return
			}
		}
	}))
}

// Issue 23 item 2: frames the client did not ask for are dropped and
// counted, never taken for a reply nor fatal; the first is logged.
func TestStrayFramesAreIgnored(t *testing.T) {
	ctx := context.Background()
	logs := &syncWriter{w: &bytes.Buffer{}}
	opts := fastOptions()
	opts.Logger = zerolog.New(logs)
	c := newClient(t, strayServer(t), opts)
	s, obs, err := c.Start(ctx, nil)
	require.NoError(t, err)
	assert.JSONEq(t, `{"ok":true}`, string(obs.Observation))
	for range 3 {
		st, err := s.State(ctx)
		require.NoError(t, err)
		assert.JSONEq(t, `{"episode_id":"e","step_count":0}`, string(st))
	}
	require.NoError(t, s.Err())
	require.NoError(t, s.Close(ctx))
	// The greeting, then two around each of 4 replies (the last may still
	// be in flight at close).
	assert.GreaterOrEqual(t, s.IgnoredFrames(), int64(8))

	m, err := c.DialMCP(ctx)
	require.NoError(t, err)
	for range 2 {
		res, err := m.Call(ctx, "tools/list", nil)
		require.NoError(t, err)
		assert.JSONEq(t, `{"tools":[]}`, string(res))
	}
	require.NoError(t, m.Close(ctx))
	assert.GreaterOrEqual(t, c.IgnoredFrames(), s.IgnoredFrames()+2)
	assert.Equal(t, 1, strings.Count(logs.String(), "answer no request"), "logged once, not per frame: %s", logs.String())
	assert.Contains(t, logs.String(), `"frame_type":"validation_started"`)
}

// syncWriter makes a buffer safe for the loggers of several goroutines.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}

// Issue 23 item 4: capacity refusals that Start waits out are counted on
// the client and logged once at info level, not once per refusal.
func TestCapacityWaitsAreCounted(t *testing.T) {
	ctx := context.Background()
	k := serveKit(t, envs.MCPEcho(), openenvserver.Options{MaxSessions: 1})
	logs := &syncWriter{w: &bytes.Buffer{}}
	opts := fastOptions()
	opts.Logger = zerolog.New(logs).Level(zerolog.InfoLevel)
	c := newClient(t, k.url, opts)
	holder, _, err := c.Start(ctx, nil)
	require.NoError(t, err)
	assert.Zero(t, c.CapacityWaits())
	started := make(chan error, 1)
	go func() {
		s, _, err := c.Start(ctx, nil)
		if err == nil {
			err = s.Close(ctx)
		}
		started <- err
	}()
	require.Eventually(t, func() bool { return c.CapacityWaits() >= 3 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, holder.Close(ctx))
	require.NoError(t, <-started)
	assert.Equal(t, k.srv.Stats().Refused, c.CapacityWaits(), "every refusal was waited out and counted")
	out := logs.String()
	assert.Equal(t, 1, strings.Count(out, "at capacity"), out)
	assert.Contains(t, out, `"level":"info"`)
	assert.Contains(t, out, `"max_sessions":1`)
}
