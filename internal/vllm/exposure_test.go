package vllm_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/vllm"
)

// fakeVLLM answers the control routes the way a vLLM variant does and
// records every request it saw.
type fakeVLLM struct {
	guardAll    bool // every route needs the key (a guard in front)
	noDevRoutes bool // started without VLLM_SERVER_DEV_MODE: no dev routes
	noRPC       bool // v0.14: /is_paused ungated, /collective_rpc absent
	rpcStatus   int  // answer to POST /collective_rpc {} (default 400, vLLM's)
	pausedFails bool // GET /is_paused answers 500

	mu   sync.Mutex
	seen []string
}

func (f *fakeVLLM) requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.seen...)
}

func (f *fakeVLLM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.seen = append(f.seen, r.Method+" "+r.URL.Path+" "+string(body)+" auth="+r.Header.Get("Authorization"))
	f.mu.Unlock()
	guarded := f.guardAll || strings.HasPrefix(r.URL.Path, "/v1")
	if guarded && r.Header.Get("Authorization") != "Bearer k" {
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"error":"Unauthorized"}`)
		return
	}
	notFound := func() { w.WriteHeader(http.StatusNotFound); io.WriteString(w, `{"detail":"Not Found"}`) }
	switch {
	case r.URL.Path == "/is_paused" && !f.noDevRoutes:
		if f.pausedFails {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		io.WriteString(w, `{"is_paused":false}`)
	case r.URL.Path == "/collective_rpc" && !f.noDevRoutes && !f.noRPC:
		status := f.rpcStatus
		if status == 0 {
			status = http.StatusBadRequest
		}
		w.WriteHeader(status)
		io.WriteString(w, `{"detail":"Missing 'method' in request body"}`)
	default:
		notFound()
	}
}

func TestOpenRoutes(t *testing.T) {
	all := []string{"/is_paused", "/pause", "/resume", "/collective_rpc", "/reset_prefix_cache"}
	tests := []struct {
		name    string
		fake    *fakeVLLM
		want    []string
		wantErr string
	}{
		{"vllm: key only on /v1", &fakeVLLM{}, all, ""},
		{"vllm with a typed rpc body (422)", &fakeVLLM{rpcStatus: http.StatusUnprocessableEntity}, all, ""},
		{"every route guarded", &fakeVLLM{guardAll: true}, nil, ""},
		{"no dev routes", &fakeVLLM{noDevRoutes: true}, nil, ""},
		{"v0.14: rlhf router ungated, no rpc", &fakeVLLM{noRPC: true}, []string{"/is_paused", "/pause", "/resume"}, ""},
		{"an unreadable answer is an error", &fakeVLLM{pausedFails: true}, []string{"/collective_rpc", "/reset_prefix_cache"}, "probe GET"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(tt.fake)
			t.Cleanup(srv.Close)
			c, err := vllm.NewClient(srv.URL, nil)
			require.NoError(t, err)
			got, err := vllm.OpenRoutes(testContext(t, 30*time.Second), c.WithAPIKey("k"))
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
				assert.ErrorContains(t, err, srv.URL+"/is_paused")
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tt.want, got)
			// Two harmless probes, no key, never /pause, /resume or /reset_prefix_cache.
			assert.Equal(t, []string{"GET /is_paused  auth=", "POST /collective_rpc {} auth="}, tt.fake.requests())
		})
	}
}

func TestOpenRoutesUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "http://" + l.Addr().String()
	require.NoError(t, l.Close())
	c, err := vllm.NewClient(url, nil)
	require.NoError(t, err)
	got, err := vllm.OpenRoutes(testContext(t, 30*time.Second), c)
	assert.Empty(t, got)
	assert.ErrorContains(t, err, "probe GET "+url+"/is_paused without the API key")
	assert.ErrorContains(t, err, "probe POST "+url+"/collective_rpc without the API key")
}

func TestOpenRoutesHonoursContext(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	t.Cleanup(srv.Close)
	c, err := vllm.NewClient(srv.URL, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = vllm.OpenRoutes(ctx, c)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 5*time.Second)
}
