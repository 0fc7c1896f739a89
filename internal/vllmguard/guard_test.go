package vllmguard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/vllmguard"
)

const key = "s3cret-guard-key"

// upstream is a fake vLLM on 127.0.0.1: it records what reached it and
// answers with handler.
type upstream struct {
	*httptest.Server
	hits atomic.Int64
}

func newUpstream(t *testing.T, handler http.HandlerFunc) *upstream {
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		handler(w, r)
	}))
	t.Cleanup(u.Close)
	return u
}

// echo answers with what it got: method, path, query, body and the
// Authorization header, with the status asked for in X-Want-Status.
func echo(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	status := http.StatusOK
	if s := r.Header.Get("X-Want-Status"); s != "" {
		fmt.Sscan(s, &status)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Upstream", "yes")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]string{"method": r.Method, "path": r.URL.Path, "query": r.URL.RawQuery,
		"body": string(body), "auth": r.Header.Get("Authorization")})
}

// startGuard serves a Guard for up on 127.0.0.1:0 until the test ends; it
// returns the guard, its base URL and a function that stops it and returns
// Serve's result.
func startGuard(t *testing.T, opts vllmguard.Options) (*vllmguard.Guard, string, func() error) {
	t.Helper()
	if opts.APIKey == "" {
		opts.APIKey = key
	}
	opts.Logger = zerolog.New(zerolog.NewTestWriter(t))
	g, err := vllmguard.New(opts)
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Serve(ctx, l) }()
	require.Eventually(t, func() bool { return g.Addr() != nil }, 5*time.Second, time.Millisecond)
	var result error
	stopped := false
	stop := func() error {
		if stopped {
			return result
		}
		stopped = true
		cancel()
		select {
		case result = <-done:
		case <-time.After(30 * time.Second):
			result = errors.New("Serve did not return after cancel")
		}
		return result
	}
	t.Cleanup(func() { assert.NoError(t, stop()) })
	return g, "http://" + l.Addr().String(), stop
}

func send(t *testing.T, method, url, auth, body string, header ...string) (int, http.Header, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	require.NoError(t, err)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, string(data)
}

func TestNewRefusesBadOptions(t *testing.T) {
	tests := []struct {
		name string
		opts vllmguard.Options
		msg  string
	}{
		{"no key", vllmguard.Options{Upstream: "http://127.0.0.1:1"}, "API key is required"},
		{"no upstream", vllmguard.Options{APIKey: key}, "must look like http://HOST:PORT"},
		{"not a url", vllmguard.Options{APIKey: key, Upstream: "127.0.0.1:80"}, "must look like http://HOST:PORT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := vllmguard.New(tt.opts)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.msg)
		})
	}
}

// TestRefusesEveryRouteWithoutTheKey: health, control and OpenAI routes
// alike answer 401 in vLLM's shape, and nothing reaches upstream.
func TestRefusesEveryRouteWithoutTheKey(t *testing.T) {
	up := newUpstream(t, echo)
	g, base, _ := startGuard(t, vllmguard.Options{Upstream: up.URL})
	routes := []struct{ method, path, body string }{
		{"GET", "/health", ""}, {"GET", "/is_paused", ""}, {"POST", "/pause?mode=wait", ""}, {"POST", "/resume", ""},
		{"POST", "/collective_rpc", `{"method":"reload_weights"}`}, {"POST", "/reset_prefix_cache", ""},
		{"GET", "/v1/models", ""}, {"POST", "/v1/completions", `{"prompt":[1]}`}, {"GET", "/metrics", ""}, {"GET", "/no/such/route", ""},
	}
	auths := []struct{ name, header string }{
		{"none", ""}, {"wrong key", "Bearer wrong"}, {"key with suffix", "Bearer " + key + "x"}, {"key prefix", "Bearer " + key[:4]},
		{"no scheme", key}, {"basic", "Basic " + key}, {"lower-case scheme", "bearer " + key}, {"scheme only", "Bearer "},
	}
	n := int64(0)
	for _, rt := range routes {
		for _, a := range auths {
			t.Run(rt.method+" "+rt.path+" "+a.name, func(t *testing.T) {
				code, hdr, body := send(t, rt.method, base+rt.path, a.header, rt.body)
				n++
				assert.Equal(t, http.StatusUnauthorized, code)
				assert.Equal(t, "application/json", hdr.Get("Content-Type"))
				assert.JSONEq(t, `{"error":"Unauthorized"}`, body)
				assert.NotContains(t, body, key)
			})
		}
	}
	assert.Zero(t, up.hits.Load(), "a refused request reached upstream")
	assert.Equal(t, n, g.Refused())
}

// TestForwardsWithTheKey: with the key, method, path, query, body, status
// and headers pass through both ways, and the key reaches upstream (vLLM
// checks it again on /v1).
func TestForwardsWithTheKey(t *testing.T) {
	up := newUpstream(t, echo)
	g, base, _ := startGuard(t, vllmguard.Options{Upstream: up.URL})
	tests := []struct {
		name, method, path, body string
		status                   int
	}{
		{"health", "GET", "/health", "", 200},
		{"is_paused", "GET", "/is_paused", "", 200},
		{"pause with query", "POST", "/pause?mode=wait", "", 200},
		{"collective_rpc with body", "POST", "/collective_rpc", `{"method":"reload_weights","kwargs":{"weights_path":"/w"}}`, 200},
		{"completion", "POST", "/v1/completions", `{"prompt":[1,2,3],"max_tokens":4}`, 200},
		{"upstream 422 passes through", "POST", "/collective_rpc", `{}`, 422},
		{"upstream 404 passes through", "GET", "/nope", "", 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, hdr, body := send(t, tt.method, base+tt.path, "Bearer "+key, tt.body, "X-Want-Status", fmt.Sprint(tt.status))
			require.Equal(t, tt.status, code, body)
			assert.Equal(t, "yes", hdr.Get("X-Upstream"))
			var got map[string]string
			require.NoError(t, json.Unmarshal([]byte(body), &got))
			path, query, _ := strings.Cut(tt.path, "?")
			assert.Equal(t, map[string]string{"method": tt.method, "path": path, "query": query, "body": tt.body, "auth": "Bearer " + key}, got)
		})
	}
	assert.Zero(t, g.Refused())
}

// TestStreamsUnbuffered: upstream sends one SSE chunk and then waits until
// the client has it; a buffering proxy would deadlock here.
func TestStreamsUnbuffered(t *testing.T) {
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"chunk\":%d}\n\n", i)
			w.(http.Flusher).Flush()
			if i == 0 {
				select {
				case <-release:
				case <-time.After(10 * time.Second):
					return // the client never saw chunk 0: the test fails below
				}
			} else {
				time.Sleep(20 * time.Millisecond)
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	_, base, _ := startGuard(t, vllmguard.Options{Upstream: up.URL})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/completions", strings.NewReader(`{"stream":true}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	first := make(chan string, 1)
	go func() { line, _ := rd.ReadString('\n'); first <- line }()
	select {
	case line := <-first:
		assert.Equal(t, "data: {\"chunk\":0}\n", line)
	case <-time.After(5 * time.Second):
		t.Fatal("the first chunk did not arrive while upstream was still streaming")
	}
	close(release)
	rest, err := io.ReadAll(rd)
	require.NoError(t, err)
	assert.Equal(t, "\ndata: {\"chunk\":1}\n\ndata: {\"chunk\":2}\n\ndata: [DONE]\n\n", string(rest))
}

// TestCapsBodies: a body over MaxBodyBytes gets 413, whether its length is
// announced or it arrives chunked; a body at the cap passes.
func TestCapsBodies(t *testing.T) {
	up := newUpstream(t, echo)
	_, base, _ := startGuard(t, vllmguard.Options{Upstream: up.URL, MaxBodyBytes: 1000})
	tests := []struct {
		name    string
		size    int
		chunked bool
		want    int
	}{
		{"at the cap", 1000, false, 200},
		{"at the cap chunked", 1000, true, 200},
		{"announced over the cap", 1001, false, 413},
		{"chunked over the cap", 5000, true, 413},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := strings.Repeat("x", tt.size)
			var rd io.Reader = strings.NewReader(body)
			if tt.chunked {
				rd = io.MultiReader(rd) // hides the length: sent chunked
			}
			req, err := http.NewRequest("POST", base+"/v1/completions", rd)
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+key)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, tt.want, resp.StatusCode, string(data))
			if tt.want == 413 {
				assert.Contains(t, string(data), "limit of 1000")
			}
		})
	}
}

// TestBoundsConcurrency: with MaxConcurrent requests in flight the next
// one gets 503 at once; when they finish, requests pass again.
func TestBoundsConcurrency(t *testing.T) {
	release := make(chan struct{})
	var inflight atomic.Int64
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			inflight.Add(1)
			<-release
		}
		w.WriteHeader(http.StatusOK)
	})
	_, base, _ := startGuard(t, vllmguard.Options{Upstream: up.URL, MaxConcurrent: 2})
	codes := make(chan int, 2)
	for range 2 {
		go func() {
			req, _ := http.NewRequest("GET", base+"/slow", nil)
			req.Header.Set("Authorization", "Bearer "+key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				codes <- 0
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	require.Eventually(t, func() bool { return inflight.Load() == 2 }, 10*time.Second, 5*time.Millisecond)
	code, hdr, body := send(t, "GET", base+"/fast", "Bearer "+key, "")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Equal(t, "1", hdr.Get("Retry-After"))
	assert.Contains(t, body, "more than 2 requests in flight")
	close(release)
	assert.Equal(t, 200, <-codes)
	assert.Equal(t, 200, <-codes)
	code, _, _ = send(t, "GET", base+"/fast", "Bearer "+key, "")
	assert.Equal(t, 200, code)
}

// TestUpstreamFailures: an upstream that is not listening gives 502, one
// that does not answer in time 504; both in vLLM's JSON error shape.
func TestUpstreamFailures(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	downURL := "http://" + l.Addr().String()
	require.NoError(t, l.Close())
	slow := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	})
	tests := []struct {
		name     string
		upstream string
		want     int
		msg      string
	}{
		{"down", downURL, http.StatusBadGateway, "upstream server unreachable"},
		{"no answer in time", slow.URL, http.StatusGatewayTimeout, "did not answer in time"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, base, _ := startGuard(t, vllmguard.Options{Upstream: tt.upstream, ResponseHeaderTimeout: 200 * time.Millisecond})
			code, hdr, body := send(t, "GET", base+"/is_paused", "Bearer "+key, "")
			assert.Equal(t, tt.want, code)
			assert.Equal(t, "application/json", hdr.Get("Content-Type"))
			var e struct {
				Error struct {
					Message string `json:"message"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			require.NoError(t, json.Unmarshal([]byte(body), &e), body)
			assert.Contains(t, e.Error.Message, tt.msg)
			assert.Equal(t, tt.want, e.Error.Code)
		})
	}
}

// TestClientDisconnectCancelsUpstream: when the client goes, the request
// to upstream is cancelled (a long generation stops using the GPU).
func TestClientDisconnectCancelsUpstream(t *testing.T) {
	for _, body := range []string{"", `{"prompt":[1]}`} {
		t.Run(fmt.Sprintf("body=%q", body), func(t *testing.T) {
			started, cancelled := make(chan struct{}), make(chan struct{})
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				close(started)
				select {
				case <-r.Context().Done():
					close(cancelled)
				case <-time.After(20 * time.Second):
				}
			})
			_, base, _ := startGuard(t, vllmguard.Options{Upstream: up.URL})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var rd io.Reader
			if body != "" {
				rd = strings.NewReader(body)
			}
			req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/completions", rd)
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+key)
			errc := make(chan error, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					resp.Body.Close()
				}
				errc <- err
			}()
			select {
			case <-started:
			case <-time.After(10 * time.Second):
				t.Fatal("the request never reached upstream")
			}
			cancel()
			require.Error(t, <-errc)
			select {
			case <-cancelled:
			case <-time.After(10 * time.Second):
				t.Fatal("upstream's request was not cancelled when the client went")
			}
		})
	}
}

// TestSlowBodyIsCutOff: a client that announces a body and stalls is
// answered 408 after BodyReadTimeout, and nothing waits forever.
func TestSlowBodyIsCutOff(t *testing.T) {
	up := newUpstream(t, echo)
	_, base, _ := startGuard(t, vllmguard.Options{Upstream: up.URL, BodyReadTimeout: 300 * time.Millisecond})
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 100\r\n\r\n{\"prompt\"", key)
	start := time.Now()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
	assert.Less(t, time.Since(start), 5*time.Second)
}

// TestLongAnswerOutlivesBodyTimeout: the body deadline is lifted once the
// body is read, so an answer slower than BodyReadTimeout still arrives.
func TestLongAnswerOutlivesBodyTimeout(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		time.Sleep(600 * time.Millisecond)
		w.Write([]byte(`{"ok":true}`))
	})
	_, base, _ := startGuard(t, vllmguard.Options{Upstream: up.URL, BodyReadTimeout: 200 * time.Millisecond})
	code, _, body := send(t, "POST", base+"/collective_rpc", "Bearer "+key, `{"method":"reload_weights"}`)
	assert.Equal(t, 200, code)
	assert.JSONEq(t, `{"ok":true}`, body)
}

// TestShutdownOnCancel: cancelling Serve's context stops new connections,
// lets a request in flight finish, and returns nil; a request still
// running after ShutdownTimeout is cut off.
func TestShutdownOnCancel(t *testing.T) {
	tests := []struct {
		name        string
		release     bool // upstream answers during the grace period
		wantAnswer  bool
		maxDuration time.Duration
	}{
		{"in-flight request finishes", true, true, 10 * time.Second},
		{"stuck request cut off", false, false, 10 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			started, release := make(chan struct{}), make(chan struct{})
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				close(started)
				select {
				case <-release:
					w.Write([]byte("done"))
				case <-r.Context().Done():
				case <-time.After(20 * time.Second):
				}
			})
			t.Cleanup(func() {
				select {
				case <-release:
				default:
					close(release)
				}
			})
			_, base, stop := startGuard(t, vllmguard.Options{Upstream: up.URL, ShutdownTimeout: 500 * time.Millisecond})
			type result struct {
				code int
				body string
				err  error
			}
			res := make(chan result, 1)
			go func() {
				req, _ := http.NewRequest("GET", base+"/is_paused", nil)
				req.Header.Set("Authorization", "Bearer "+key)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					res <- result{err: err}
					return
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				res <- result{code: resp.StatusCode, body: string(b), err: err}
			}()
			<-started
			begin := time.Now()
			stopped := make(chan error, 1)
			go func() { stopped <- stop() }()
			require.Eventually(t, func() bool {
				c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), time.Second)
				if err == nil {
					c.Close()
				}
				return err != nil
			}, 5*time.Second, 10*time.Millisecond, "the guard still accepts connections after cancel")
			if tt.release {
				close(release)
			}
			require.NoError(t, <-stopped)
			assert.Less(t, time.Since(begin), tt.maxDuration)
			r := <-res
			if tt.wantAnswer {
				require.NoError(t, r.err)
				assert.Equal(t, 200, r.code)
				assert.Equal(t, "done", r.body)
			} else {
				assert.True(t, r.err != nil || r.code != 200, "a stuck request was answered 200")
			}
		})
	}
}

func TestServeTwiceFails(t *testing.T) {
	up := newUpstream(t, echo)
	g, _, _ := startGuard(t, vllmguard.Options{Upstream: up.URL})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	assert.ErrorContains(t, g.Serve(context.Background(), l), "Serve called twice")
}
