package orsserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

// fixture is a kit server on a real loopback listener.
type fixture struct {
	url      string
	srv      *orsserver.Server
	follow   *http.Client // follows 308s
	noFollow *http.Client
	counter  *atomic.Int64 // runs of the "counted" tool
}

func startServer(t *testing.T, opts orsserver.Options, env ...*orsserver.Env) *fixture {
	t.Helper()
	opts.Logger = zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
	srv, err := orsserver.New(opts, env...)
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, srv.Shutdown(ctx))
		require.NoError(t, <-done)
	})
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &fixture{
		url:    "http://" + l.Addr().String(),
		srv:    srv,
		follow: &http.Client{Transport: tr, Timeout: 30 * time.Second},
		noFollow: &http.Client{Transport: tr, Timeout: 30 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		counter: &atomic.Int64{},
	}
}

// startServerCounted serves extendedEcho with the fixture's counter.
func startServerCounted(t *testing.T, opts orsserver.Options) *fixture {
	t.Helper()
	counter := &atomic.Int64{}
	f := startServer(t, opts, extendedEcho(counter))
	f.counter = counter
	return f
}

// extendedEcho is the echo fixture plus shared tools for the C cases.
func extendedEcho(counter *atomic.Int64) *orsserver.Env {
	env := envs.Echo()
	type bigParams struct {
		Size int `json:"size"`
	}
	type sleepParams struct {
		Millis int `json:"millis"`
	}
	env.Tools = append(env.Tools,
		orsserver.NewToolNoInput("boom", "raises", func(context.Context, orsserver.Instance) (ors.ToolOutput, error) {
			return ors.ToolOutput{}, errors.New("bad")
		}),
		orsserver.NewToolNoInput("crash", "panics", func(context.Context, orsserver.Instance) (ors.ToolOutput, error) {
			panic("'crash' returned NoneType; expected ToolOutput")
		}),
		orsserver.NewTool("big", "large output", func(_ context.Context, _ orsserver.Instance, p bigParams) (ors.ToolOutput, error) {
			return ors.ToolOutput{Blocks: []ors.Block{ors.TextBlock(bigText(p.Size))}, Reward: ors.Reward(0.5)}, nil
		}),
		orsserver.NewTool("sleep", "sleeps", func(ctx context.Context, _ orsserver.Instance, p sleepParams) (ors.ToolOutput, error) {
			counter.Add(1)
			select {
			case <-time.After(time.Duration(p.Millis) * time.Millisecond):
			case <-ctx.Done():
				return ors.ToolOutput{}, ctx.Err()
			}
			return ors.ToolOutput{Blocks: []ors.Block{ors.TextBlock("slept")}, Finished: true}, nil
		}),
		orsserver.NewToolNoInput("counted", "counts its runs", func(context.Context, orsserver.Instance) (ors.ToolOutput, error) {
			n := counter.Add(1)
			return ors.ToolOutput{Blocks: []ors.Block{ors.TextBlock(strings.Repeat("x", int(n)))}, Reward: ors.Reward(float64(n))}, nil
		}),
	)
	return env
}

// bigText mixes ASCII, multi-byte runes and many kinds of whitespace so that
// naive 4096-byte cuts would split runes and start chunks with spaces.
func bigText(size int) string {
	var b strings.Builder
	pieces := []string{"word ", "é ", "中文\u00a0", "  ", "\u3000x", "<&> ", "\u2003y", "\"q\" "}
	for i := 0; b.Len() < size; i++ {
		b.WriteString(pieces[i%len(pieces)])
	}
	return b.String()
}

type response struct {
	status int
	header http.Header
	body   string
}

func (f *fixture) do(t *testing.T, c *http.Client, method, path, body string, hdr map[string]string) response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, f.url+path, rd)
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// events parses an SSE body.
func events(t *testing.T, body string) []ors.Event {
	t.Helper()
	r := ors.NewSSEReader(strings.NewReader(body))
	var out []ors.Event
	for {
		ev, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		out = append(out, ev)
	}
}

func sidHeader(sid string) map[string]string { return map[string]string{"X-Session-ID": sid} }

func detailOf(t *testing.T, body string) any {
	t.Helper()
	var v struct {
		Detail any `json:"detail"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &v), body)
	return v.Detail
}

type (
	contextT = context.Context
	rawJSON  = json.RawMessage
)
