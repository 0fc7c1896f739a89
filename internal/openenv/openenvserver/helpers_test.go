package openenvserver_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
)

// serve runs env on 127.0.0.1:0 until the test ends.
func serve(t *testing.T, env *openenvserver.Env, opts openenvserver.Options) (string, *openenvserver.Server) {
	t.Helper()
	srv, err := openenvserver.New(opts, env)
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, srv.Shutdown(ctx))
		require.NoError(t, <-done)
	})
	return "http://" + l.Addr().String(), srv
}

func dialWS(t *testing.T, base, path string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+path, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.CloseNow() })
	return conn
}

// replay runs a transcript (testdata/README.md) on conn.
func replay(t *testing.T, conn *websocket.Conn, file string) {
	t.Helper()
	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		switch {
		case strings.HasPrefix(line, ">> "):
			require.NoError(t, conn.Write(ctx, websocket.MessageText, []byte(line[3:])), "%s:%d", file, n)
		case strings.HasPrefix(line, "<< "), strings.HasPrefix(line, "<~ "):
			_, got, err := conn.Read(ctx)
			require.NoError(t, err, "%s:%d", file, n)
			if line[1] == '<' {
				assert.JSONEq(t, line[3:], string(got), "%s:%d", file, n)
			} else {
				assertSubset(t, line[3:], string(got), "%s:%d", file, n)
			}
		case strings.HasPrefix(line, "## closed "):
			want, err := strconv.Atoi(line[len("## closed "):])
			require.NoError(t, err)
			_, extra, err := conn.Read(ctx)
			require.Error(t, err, "%s:%d: want close, got frame %s", file, n, extra)
			assert.Equal(t, websocket.StatusCode(want), websocket.CloseStatus(err), "%s:%d: %v", file, n, err)
		default:
			t.Fatalf("%s:%d: bad transcript line %q", file, n, line)
		}
		cancel()
	}
	require.NoError(t, sc.Err())
}

// assertSubset checks that every key of want is in got with an equal (or,
// recursively, subset) value; arrays must have the same length.
func assertSubset(t *testing.T, want, got string, msgAndArgs ...any) {
	t.Helper()
	var w, g any
	require.NoError(t, json.Unmarshal([]byte(want), &w))
	require.NoError(t, json.Unmarshal([]byte(got), &g))
	assert.True(t, subset(w, g), append([]any{"want ⊂ got:\n%s\n%s"}, append([]any{want, got}, msgAndArgs...)...)...)
}

func subset(w, g any) bool {
	switch wv := w.(type) {
	case map[string]any:
		gv, ok := g.(map[string]any)
		if !ok {
			return false
		}
		for k, v := range wv {
			if gvv, ok := gv[k]; !ok || !subset(v, gvv) {
				return false
			}
		}
		return true
	case []any:
		gv, ok := g.([]any)
		if !ok || len(gv) != len(wv) {
			return false
		}
		for i := range wv {
			if !subset(wv[i], gv[i]) {
				return false
			}
		}
		return true
	}
	wb, _ := json.Marshal(w)
	gb, _ := json.Marshal(g)
	return string(wb) == string(gb)
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}
