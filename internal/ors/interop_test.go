package ors_test

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
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

// §13.5 G1–G9: the Go client against the kit made to behave like the
// Python reference server, the platform, or a misbehaving network.

func TestG1BarePathsReachDefaultEnvOfMultiEnvServer(t *testing.T) {
	k := startKit(t, orsserver.Options{}, nil, envs.Echo(), envs.Letters())
	c := newClient(t, k.url, ors.Options{})
	n, err := c.NumTasks(ctx, "train") // POST body re-sent across the 308
	require.NoError(t, err)
	assert.Equal(t, 4, n)
	assert.Equal(t, []string{"POST /num_tasks", "POST /echoenvironment/num_tasks"}, k.seen())

	// A URL with an env segment reaches that env, also for sessions.
	lc := newClient(t, k.url+"/letters", ors.Options{})
	n, err = lc.NumTasks(ctx, "train")
	require.NoError(t, err)
	assert.Equal(t, 64, n)
	s := openSession(t, lc, ors.SessionSpec{Split: "mixed", Index: 2})
	out, err := s.CallTool(ctx, "submit", json.RawMessage(`{"answer":"ccx"}`))
	require.NoError(t, err)
	assert.InDelta(t, 2.0/3, *out.Reward, 1e-12)
}

func TestG2CreateSessionFraming(t *testing.T) {
	tests := []struct{ name, body, wantSID string }{
		{"CRLF with comments", ": ping - 2026-01-01\r\n\r\nevent: task_id\r\ndata: sid-crlf\r\n\r\n: ping\r\n\r\nevent: end\r\ndata: \r\n\r\n", "sid-crlf"},
		{"LF", "event: task_id\ndata: sid-lf\n\nevent: end\ndata:\n\n", "sid-lf"},
		{"CR only", "event: task_id\rdata: sid-cr\r\revent: end\rdata: \r\r", "sid-cr"},
		{"sid in end payload", "event: task_id\ndata: provisional\n\nevent: end\ndata: {\"sid\":\"sid-end\"}\n\n", "sid-end"},
		{"unknown events ignored", "event: progress\ndata: 50%\n\nevent: task_id\ndata: sid-x\n\nevent: end\ndata: \n\n", "sid-x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := startKit(t, orsserver.Options{}, func(w http.ResponseWriter, r *http.Request) bool {
				if r.URL.Path != "/create_session" {
					return false
				}
				w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
				_, _ = io.WriteString(w, tt.body)
				return true
			})
			c := newClient(t, k.url, ors.Options{})
			s := openSession(t, c, ors.SessionSpec{Split: "train", Index: 1})
			assert.Equal(t, tt.wantSID, s.ID())
			_, err := s.Prompt(ctx)
			require.NoError(t, err)
		})
	}
}

func TestG3LargeResultReassembled(t *testing.T) {
	k := startKit(t, orsserver.Options{}, nil)
	c := newClient(t, k.url, ors.Options{})
	s := openSession(t, c, ors.SessionSpec{Split: "train", Index: 0})
	// Spaces every few bytes guarantee that 4096-byte cuts would fall before
	// a space; multi-byte runes that they would fall inside a rune.
	text := strings.Repeat("ab é 中 \u00a0x ", 2500)
	input, _ := json.Marshal(map[string]string{"text": text})
	out, err := s.CallTool(ctx, "echo", input)
	require.NoError(t, err)
	assert.Equal(t, "no match (got '"+text+"')", out.Text())
}

func TestG4ResumeAfterDrop(t *testing.T) {
	t.Run("dropped once, resumed by task id, tool ran once", func(t *testing.T) {
		var drops atomic.Int64
		k := startKit(t, orsserver.Options{Hooks: orsserver.Hooks{DropCallStream: func(*http.Request, string) bool { return drops.Add(1) == 1 }}}, nil)
		c := newClient(t, k.url, ors.Options{})
		s := openSession(t, c, ors.SessionSpec{Split: "train", Index: 2})
		out, err := s.CallTool(ctx, "echo", json.RawMessage(`{"text":"trl"}`))
		require.NoError(t, err)
		assert.Equal(t, "match", out.Text())
		assert.Equal(t, int64(1), k.srv.Stats().ToolCalls)
		assert.Equal(t, int64(2), drops.Load())
	})
	t.Run("unknown task_id after a drop is an error, not a loop", func(t *testing.T) {
		k := startKit(t, orsserver.Options{}, func(w http.ResponseWriter, r *http.Request) bool {
			if !strings.HasSuffix(r.URL.Path, "/call") {
				return false
			}
			body, _ := io.ReadAll(r.Body)
			w.Header().Set("Content-Type", "text/event-stream")
			if strings.Contains(string(body), "task_id") {
				_, _ = io.WriteString(w, "event: error\r\ndata: unknown task_id\r\n\r\n")
			} else {
				_, _ = io.WriteString(w, "event: task_id\r\ndata: 0123456789abcdef0123456789abcdef\r\n\r\n") // then the "server dies"
			}
			return true
		})
		c := newClient(t, k.url, ors.Options{})
		s := openSession(t, c, ors.SessionSpec{Split: "train", Index: 2})
		_, err := s.CallTool(ctx, "echo", json.RawMessage(`{"text":"trl"}`))
		var failed *ors.ToolFailedError
		require.ErrorAs(t, err, &failed)
		assert.Equal(t, "unknown task_id", failed.Message)
	})
	t.Run("always dropped gives up after CallRetries", func(t *testing.T) {
		k := startKit(t, orsserver.Options{Hooks: orsserver.Hooks{DropCallStream: func(*http.Request, string) bool { return true }}}, nil)
		sl := &instant{}
		c := newClient(t, k.url+"/echoenvironment", ors.Options{Sleep: sl.sleep})
		s := openSession(t, c, ors.SessionSpec{Split: "train", Index: 2})
		_, err := s.CallTool(ctx, "echo", json.RawMessage(`{"text":"trl"}`))
		require.ErrorContains(t, err, "giving up after 5 retries")
		assert.Equal(t, 6, k.count("POST /echoenvironment/call"))
		assert.Equal(t, int64(1), k.srv.Stats().ToolCalls, "every retry resumed the same invocation")
	})
}

func TestG5TaskToolsFallback(t *testing.T) {
	k := startKit(t, orsserver.Options{}, func(w http.ResponseWriter, r *http.Request) bool {
		if strings.HasSuffix(r.URL.Path, "/task_tools") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(404)
			_, _ = io.WriteString(w, `{"detail":"Not Found"}`)
			return true
		}
		return false
	})
	c := newClient(t, k.url+"/echoenvironment", ors.Options{})
	s := openSession(t, c, ors.SessionSpec{Split: "train", Index: 0})
	for range 2 {
		tools, err := s.Tools(ctx)
		require.NoError(t, err)
		assert.Equal(t, []string{"boom", "echo"}, toolNames(tools))
	}
	assert.Equal(t, 1, k.count("GET /echoenvironment/task_tools"), "fallback sticks for the session")
	assert.Equal(t, 2, k.count("GET /echoenvironment/tools"))
}

func TestG6Unauthorized(t *testing.T) {
	k := startKit(t, orsserver.Options{}, func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(401)
		_, _ = io.WriteString(w, `{"detail":"Invalid API key"}`)
		return true
	})
	c := newClient(t, k.url, ors.Options{})
	_, err := c.Splits(ctx)
	var ae *ors.AuthError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, "Invalid API key", ae.Detail)
	_, err = c.OpenSession(ctx, ors.SessionSpec{Split: "train"})
	require.ErrorAs(t, err, &ae)
	assert.Len(t, k.seen(), 2, "no retries")
}

func TestG7RetryOn503(t *testing.T) {
	var n atomic.Int64
	k := startKit(t, orsserver.Options{}, func(w http.ResponseWriter, r *http.Request) bool {
		if strings.HasSuffix(r.URL.Path, "/call") && n.Add(1) <= 2 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(503)
			_, _ = io.WriteString(w, `{"detail":"busy"}`)
			return true
		}
		return false
	})
	sl := &instant{}
	c := newClient(t, k.url+"/echoenvironment", ors.Options{Sleep: sl.sleep})
	s := openSession(t, c, ors.SessionSpec{Split: "train", Index: 0})
	out, err := s.CallTool(ctx, "echo", json.RawMessage(`{"text":"hello"}`))
	require.NoError(t, err)
	assert.Equal(t, 1.0, *out.Reward)
	require.Len(t, sl.waits, 2)
	assert.InDelta(t, 500*time.Millisecond, sl.waits[0], float64(60*time.Millisecond))
	assert.InDelta(t, time.Second, sl.waits[1], float64(110*time.Millisecond))
}

func TestG8CreateSessionAsJSON(t *testing.T) {
	k := startKit(t, orsserver.Options{}, func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == "/create_session" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"sid":"X"}`)
			return true
		}
		return false
	})
	c := newClient(t, k.url, ors.Options{})
	s := openSession(t, c, ors.SessionSpec{Split: "train", Index: 0})
	assert.Equal(t, "X", s.ID())
	_, err := s.Prompt(ctx)
	require.NoError(t, err)
}

// hostedTransport stands in for https://sessions.<host> and
// https://api.<host>: it records each request and sends it to the kit (or
// answers the API itself).
type hostedTransport struct {
	kit  *url.URL
	mu   sync.Mutex
	reqs []*http.Request
}

func (h *hostedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	h.mu.Lock()
	h.reqs = append(h.reqs, r.Clone(r.Context()))
	h.mu.Unlock()
	if strings.HasPrefix(r.URL.Host, "api.") {
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(`{"secrets":["OPENAI_API_KEY"]}`)), Request: r}, nil
	}
	out := r.Clone(r.Context())
	out.URL.Scheme, out.URL.Host, out.Host = h.kit.Scheme, h.kit.Host, ""
	return http.DefaultTransport.RoundTrip(out)
}

func TestG9HostedMode(t *testing.T) {
	k := startKit(t, orsserver.Options{}, nil)
	ku, _ := url.Parse(k.url)
	ht := &hostedTransport{kit: ku}
	getenv := func(key string) string {
		return map[string]string{"OPENREWARD_API_KEY": "key-123", "OPENREWARD_URL": "https://example.test"}[key]
	}
	c := newClient(t, "Owner/Env", ors.Options{Getenv: getenv, HTTPClient: &http.Client{Transport: ht}})
	assert.Equal(t, "https://sessions.example.test", c.BaseURL())

	secrets, err := c.RequiredSecrets(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"OPENAI_API_KEY"}, secrets)

	n, err := c.NumTasks(ctx, "train")
	require.NoError(t, err)
	assert.Equal(t, 4, n)

	s, err := c.OpenSession(ctx, ors.SessionSpec{Split: "train", Index: 0, Secrets: map[string]string{"OPENAI_API_KEY": "sk"}})
	require.NoError(t, err)
	_, err = s.CallTool(ctx, "echo", json.RawMessage(`{"text":"hello"}`))
	require.NoError(t, err)
	require.NoError(t, s.Close(ctx))

	var got []string
	for _, r := range ht.reqs {
		got = append(got, r.Method+" "+r.URL.Scheme+"://"+r.URL.Host+r.URL.Path)
		assert.Equal(t, "key-123", r.Header.Get("X-API-Key"), r.URL.Path)
		wantDeployment := "Owner/Env"
		if r.URL.Path == "/delete" || r.URL.Path == "/delete_session" || strings.HasPrefix(r.URL.Host, "api.") {
			wantDeployment = ""
		}
		assert.Equal(t, wantDeployment, r.Header.Get("X-Deployment"), r.URL.Path)
		if r.URL.Path == "/create" {
			raw, err := base64.StdEncoding.DecodeString(r.Header.Get("X-Secrets"))
			require.NoError(t, err)
			var sec map[string]struct {
				Value   string   `json:"value"`
				Domains []string `json:"allowed_domains"`
			}
			require.NoError(t, json.Unmarshal(raw, &sec))
			assert.Equal(t, "sk", sec["OPENAI_API_KEY"].Value)
			assert.Equal(t, "key-123", sec["api_key"].Value)
			assert.Equal(t, []string{"api.example.test", "sessions.example.test"}, sec["api_key"].Domains)
		}
	}
	assert.Equal(t, []string{
		"GET https://api.example.test/v1/environments/Owner/Env/required-secrets",
		// discovery wrapped in an ephemeral sid; bare path follows the 308
		"POST https://sessions.example.test/create_session",
		"POST https://sessions.example.test/num_tasks",
		"POST https://sessions.example.test/echoenvironment/num_tasks",
		"POST https://sessions.example.test/delete_session",
		"POST https://sessions.example.test/create_session",
		"POST https://sessions.example.test/create",
		"POST https://sessions.example.test/call",
		"POST https://sessions.example.test/echoenvironment/call",
		"POST https://sessions.example.test/delete",
		"POST https://sessions.example.test/delete_session",
	}, got)
}
