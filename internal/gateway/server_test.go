package gateway

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// closedWithin reports whether the server closes conn within d (a read
// returns EOF or a reset, not the test's own deadline).
func closedWithin(t *testing.T, conn net.Conn, r *bufio.Reader, d time.Duration) bool {
	t.Helper()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(d)))
	_, err := io.Copy(io.Discard, r)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	return true
}

// TestConnLimitsCloseSlowAndIdleConnections: a client that sends its body
// a byte at a time, one that never finishes its headers, and an idle
// keep-alive connection are each closed by the server once its limit
// passes, with the gateway's handler behind it.
func TestConnLimitsCloseSlowAndIdleConnections(t *testing.T) {
	h := newHarness(t, nil)
	limits := ConnLimits{Header: 200 * time.Millisecond, Request: 400 * time.Millisecond, Idle: 300 * time.Millisecond}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := limits.Server(h.gw.Handler())
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	key, _ := h.open(t, "c")

	for _, tc := range []struct {
		name string
		send func(t *testing.T, conn net.Conn, r *bufio.Reader)
	}{
		{"a body sent a byte at a time", func(t *testing.T, conn net.Conn, r *bufio.Reader) {
			_, err := io.WriteString(conn, "POST "+RolloutPath("c")+"/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+key+
				"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
			require.NoError(t, err)
		}},
		{"headers never finished", func(t *testing.T, conn net.Conn, r *bufio.Reader) {
			_, err := io.WriteString(conn, "GET "+RolloutPath("c")+"/models HTTP/1.1\r\nHost: x\r\n")
			require.NoError(t, err)
		}},
		{"an idle keep-alive connection", func(t *testing.T, conn net.Conn, r *bufio.Reader) {
			_, err := io.WriteString(conn, "GET "+RolloutPath("c")+"/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+key+"\r\n\r\n")
			require.NoError(t, err)
			resp, err := http.ReadResponse(r, nil)
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", ln.Addr().String())
			require.NoError(t, err)
			defer conn.Close()
			r := bufio.NewReader(conn)
			tc.send(t, conn, r)
			assert.True(t, closedWithin(t, conn, r, 5*time.Second), "the server closed the connection")
		})
	}
}
