package peercred

import (
	"bufio"
	"context"
	"encoding/binary"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// helperEnv makes the test binary a client: it connects to the address in
// the variable, says "connected" and holds the connection until stdin ends.
const helperEnv = "PEERCRED_TEST_CONNECT"

func TestMain(m *testing.M) {
	if addr := os.Getenv(helperEnv); addr != "" {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			os.Exit(3)
		}
		os.Stdout.WriteString("connected\n")
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		c.Close()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// accept listens on network's loopback and returns the listener's
// accepted connections.
func listen(t *testing.T, network, addr string) (net.Listener, <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Skipf("no %s loopback here: %v", network, err)
	}
	t.Cleanup(func() { ln.Close() })
	conns := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			conns <- c
		}
	}()
	return ln, conns
}

func accepted(t *testing.T, conns <-chan net.Conn) net.Conn {
	t.Helper()
	select {
	case c := <-conns:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no connection accepted")
		return nil
	}
}

func TestConnPIDOfThisProcess(t *testing.T) {
	cases := []struct{ name, network, listen, dial string }{
		{"ipv4", "tcp4", "127.0.0.1:0", ""},
		{"ipv6", "tcp6", "[::1]:0", ""},
		{"dual-stack listener, ipv4 client", "tcp", ":0", "127.0.0.1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ln, conns := listen(t, c.network, c.listen)
			addr := ln.Addr().String()
			if c.dial != "" {
				addr = net.JoinHostPort(c.dial, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
			}
			client, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			defer client.Close()
			srv := accepted(t, conns)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			pid, err := ConnPID(ctx, srv)
			require.NoError(t, err)
			assert.Equal(t, os.Getpid(), pid)
		})
	}
}

func TestConnPIDOfChildProcess(t *testing.T) {
	ln, conns := listen(t, "tcp4", "127.0.0.1:0")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+ln.Addr().String())
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() {
		stdin.Close()
		_ = cmd.Wait()
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "connected\n", line)
	srv := accepted(t, conns)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pid, err := ConnPID(ctx, srv)
	require.NoError(t, err)
	assert.Equal(t, cmd.Process.Pid, pid)

	ok, err := IsDescendant(pid, os.Getpid())
	require.NoError(t, err)
	assert.True(t, ok, "the child descends from the test")
	ok, err = IsDescendant(os.Getpid(), pid)
	require.NoError(t, err)
	assert.False(t, ok, "the test does not descend from its child")
	ok, err = IsDescendant(pid, pid)
	require.NoError(t, err)
	assert.True(t, ok, "a process counts as its own tree")
}

func TestLookupMisses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Nobody connects from port 1 to port 2.
	_, err := PID(ctx, netip.MustParseAddrPort("127.0.0.1:2"), netip.MustParseAddrPort("127.0.0.1:1"))
	require.ErrorIs(t, err, ErrNotFound)

	done, cancelDone := context.WithCancel(context.Background())
	cancelDone()
	_, err = findSocketHolder(done, 1)
	require.ErrorIs(t, err, context.Canceled)

	_, err = IsDescendant(1<<30, os.Getpid()) // beyond any pid_max
	require.ErrorIs(t, err, ErrNotFound)
}

func TestParseTCPLine(t *testing.T) {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("the rows below are a little-endian host's")
	}
	cases := []struct {
		name, line    string
		local, remote string
		inode         uint64
		ok            bool
	}{
		{name: "ipv4", line: "   3: 0100007F:A1B2 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 123456 1 0000000000000000 20 4 30 10 -1",
			local: "127.0.0.1:41394", remote: "127.0.0.1:8080", inode: 123456, ok: true},
		{name: "ipv6 loopback", line: "   0: 00000000000000000000000001000000:D431 00000000000000000000000001000000:0050 01 00000000:00000000 00:00000000 00000000  1000        0 99 1",
			local: "[::1]:54321", remote: "[::1]:80", inode: 99, ok: true},
		{name: "ipv4-mapped", line: "   0: 0000000000000000FFFF00000100007F:D431 0000000000000000FFFF00000100007F:0050 01 00000000:00000000 00:00000000 00000000  1000        0 7 1",
			local: "127.0.0.1:54321", remote: "127.0.0.1:80", inode: 7, ok: true},
		{name: "header", line: "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"},
		{name: "short", line: "0: 0100007F:A1B2"},
		{name: "bad hex", line: "   3: 0100G07F:A1B2 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 1 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, r, inode, ok := parseTCPLine(c.line)
			require.Equal(t, c.ok, ok)
			if !ok {
				return
			}
			assert.Equal(t, c.local, l.String())
			assert.Equal(t, c.remote, r.String())
			assert.Equal(t, c.inode, inode)
		})
	}
}

// An HTTP server with ConnContext resolves each connection once; one
// without it still resolves from the request's addresses.
func TestRequestPID(t *testing.T) {
	for _, withConnContext := range []bool{true, false} {
		t.Run("conncontext="+strconv.FormatBool(withConnContext), func(t *testing.T) {
			pids := make(chan int, 2)
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				pid, err := RequestPID(r)
				if err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				pids <- pid
			}))
			if withConnContext {
				srv.Config.ConnContext = ConnContext
			}
			srv.Start()
			defer srv.Close()
			for range 2 {
				resp, err := srv.Client().Get(srv.URL)
				require.NoError(t, err)
				resp.Body.Close()
				require.Equal(t, http.StatusOK, resp.StatusCode)
				assert.Equal(t, os.Getpid(), <-pids)
			}
		})
	}
}
