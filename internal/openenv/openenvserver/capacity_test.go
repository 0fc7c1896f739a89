package openenvserver_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/openenv"
	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
)

// stuckClose is an MCP echo instance whose Close waits until the test
// lets it go: a teardown that outlasts the socket by as long as it likes.
type stuckClose struct {
	openenvserver.MCPInstance
	release <-chan struct{}
	closing *atomic.Int64
}

func (s stuckClose) Close(ctx context.Context) error {
	s.closing.Add(1)
	select {
	case <-s.release:
	case <-ctx.Done():
	}
	return nil
}

// stuckEnv is MCPEcho with stuckClose instances; the cleanup it registers
// lets every teardown finish, and runs before the server's Shutdown.
func stuckEnv(t *testing.T) (*openenvserver.Env, *atomic.Int64, func()) {
	release := make(chan struct{})
	closing := &atomic.Int64{}
	env := envs.MCPEcho()
	inner := env.New
	env.New = func(ctx context.Context) (openenvserver.Instance, error) {
		inst, err := inner(ctx)
		if err != nil {
			return nil, err
		}
		return stuckClose{MCPInstance: inst.(openenvserver.MCPInstance), release: release, closing: closing}, nil
	}
	return env, closing, func() { close(release) }
}

// TestSlotFreedWhenSocketCloses: sessions opened and closed back to back at
// exactly capacity are never refused, whoever sends the close frame, even
// though every instance's teardown is still running: the slot is free
// before the client hears the close.
func TestSlotFreedWhenSocketCloses(t *testing.T) {
	const rounds = 300
	tests := []struct {
		name    string
		session func(ctx context.Context, t *testing.T, base string, c *openenv.Client)
	}{
		{"ws: client sends close message, server closes", func(ctx context.Context, t *testing.T, _ string, c *openenv.Client) {
			s, err := c.Open(ctx)
			require.NoError(t, err)
			_, err = s.Reset(ctx, nil)
			require.NoError(t, err, "refused: the previous session's slot was still taken")
			require.NoError(t, s.Close(ctx))
		}},
		{"ws: client sends the close frame", func(ctx context.Context, t *testing.T, base string, _ *openenv.Client) {
			conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/ws", nil)
			require.NoError(t, err)
			defer func() { _ = conn.CloseNow() }()
			require.NoError(t, conn.Write(ctx, websocket.MessageText, []byte(`{"type":"reset","data":{}}`)))
			_, reply, err := conn.Read(ctx)
			require.NoError(t, err)
			require.Contains(t, string(reply), `"type":"observation"`, "refused: the previous session's slot was still taken")
			require.NoError(t, conn.Close(websocket.StatusNormalClosure, ""))
		}},
		{"mcp socket: client sends the close frame", func(ctx context.Context, t *testing.T, _ string, c *openenv.Client) {
			m, err := c.DialMCP(ctx)
			require.NoError(t, err)
			_, err = m.Call(ctx, "tools/list", nil)
			require.NoError(t, err, "refused: the previous session's slot was still taken")
			require.NoError(t, m.Close(ctx))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, closing, release := stuckEnv(t)
			base, srv := serve(t, env, openenvserver.Options{MaxSessions: 2})
			t.Cleanup(release)
			c, err := openenv.NewClient(base, openenv.Options{ReplyTimeout: 5 * time.Second, OpenTimeout: 5 * time.Second, CloseTimeout: 5 * time.Second})
			require.NoError(t, err)
			t.Cleanup(c.CloseIdleConnections)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			// One slot stays taken throughout: the loop runs at exactly
			// capacity.
			holder := dialWS(t, base, "/ws")
			require.NoError(t, holder.Write(ctx, websocket.MessageText, []byte(`{"type":"reset","data":{}}`)))
			_, _, err = holder.Read(ctx)
			require.NoError(t, err)
			for i := range rounds {
				tt.session(ctx, t, base, c)
				if t.Failed() {
					t.Fatalf("round %d of %d", i+1, rounds)
				}
			}
			assert.Zero(t, srv.Stats().Refused)
			assert.Equal(t, int64(rounds+1), srv.Stats().Created)
			assert.Positive(t, closing.Load(), "teardowns were still running while the loop went on")
		})
	}
}

// TestInvalidUTF8TextFrame: a text frame that is not UTF-8 fails the
// socket with 1007 (RFC 6455 §8.1) on /ws and the /mcp socket alike; it
// is not answered, and the session ends.
func TestInvalidUTF8TextFrame(t *testing.T) {
	tests := []struct {
		name, path string
		frame      []byte
	}{
		{"ws reset with a bad byte", "/ws", []byte("{\"type\":\"reset\",\"data\":{\"seed\":\"\xff\"}}")},
		{"ws truncated rune", "/ws", []byte("{\"type\":\"state\"}\xe2\x82")},
		{"mcp socket", "/mcp", []byte("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"x\":\"\xc0\xaf\"}")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base, srv := serve(t, envs.MCPEcho(), openenvserver.Options{MaxSessions: 1})
			conn := dialWS(t, base, tt.path)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			require.NoError(t, conn.Write(ctx, websocket.MessageText, tt.frame))
			_, got, err := conn.Read(ctx)
			require.Error(t, err, "no reply, got %s", got)
			assert.Equal(t, websocket.StatusInvalidFramePayloadData, websocket.CloseStatus(err), "%v", err)
			require.Eventually(t, func() bool { return srv.Stats().Live == 0 }, 5*time.Second, 10*time.Millisecond)

			// The slot came back: a valid frame on a new socket is served.
			conn2 := dialWS(t, base, tt.path)
			msg := `{"type":"reset","data":{}}`
			if tt.path == "/mcp" {
				msg = `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
			}
			require.NoError(t, conn2.Write(ctx, websocket.MessageText, []byte(msg)))
			_, reply, err := conn2.Read(ctx)
			require.NoError(t, err)
			var v map[string]any
			require.NoError(t, json.Unmarshal(reply, &v))
			assert.NotContains(t, v, "error", string(reply))
		})
	}
}
