package cli

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/openenv"
)

// serveInBackground runs `ortrain env serve args...` until the test ends and
// returns the URL it printed.
func serveInBackground(t *testing.T, args ...string) string {
	t.Helper()
	return serveUntilCleanup(t, []string{"env", "serve"}, args...)
}

// serveUntilCleanup runs a serving command (cmd args...) until the test
// ends, checks it then stops cleanly, and returns the URL it printed.
func serveUntilCleanup(t *testing.T, cmd []string, args ...string) string {
	t.Helper()
	deps := SystemDeps()
	out, errOut := &lockedBuffer{}, &lockedBuffer{}
	deps.IO = &IOStreams{In: &bytes.Buffer{}, Out: out, ErrOut: errOut}
	deps.Getenv = func(string) string { return "" }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	argv := append(append(append([]string(nil), cmd...), "--log-format", "json"), args...)
	go func() { done <- Execute(ctx, deps, argv) }()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			assert.Equal(t, ExitOK, code, errOut.String())
			assert.Contains(t, errOut.String(), `"message":"stopped"`)
		case <-time.After(15 * time.Second):
			t.Errorf("%s did not stop after cancel", strings.Join(cmd, " "))
		}
	})
	var url string
	require.Eventually(t, func() bool {
		url = strings.TrimSpace(out.String())
		return url != ""
	}, 10*time.Second, 10*time.Millisecond, "stderr: %s", errOut.String())
	return url
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return port
}

func TestEnvServeFlags(t *testing.T) {
	tests := []struct {
		args []string
		want EnvServeOptions
	}{
		{[]string{"echo"}, EnvServeOptions{Name: "echo", Host: "127.0.0.1", Port: 8080, IdleTimeout: 15 * time.Minute}},
		{[]string{"letters", "--host", "0.0.0.0", "--port", "9000", "--idle-timeout", "30s"}, EnvServeOptions{Name: "letters", Host: "0.0.0.0", Port: 9000, IdleTimeout: 30 * time.Second}},
		{[]string{"letters", "--tool-latency", "300ms"}, EnvServeOptions{Name: "letters", Host: "127.0.0.1", Port: 8080, IdleTimeout: 15 * time.Minute, ToolLatency: 300 * time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			deps := SystemDeps()
			deps.IO, _, _ = TestIO()
			var got *EnvServeOptions
			cmd := newEnvServeCmd(deps, func(_ context.Context, o *EnvServeOptions) error { got = o; return nil })
			cmd.SetArgs(tt.args)
			require.NoError(t, cmd.Execute())
			require.NotNil(t, got)
			assert.Equal(t, tt.want, EnvServeOptions{Name: got.Name, Host: got.Host, Port: got.Port, IdleTimeout: got.IdleTimeout, ToolLatency: got.ToolLatency})
		})
	}
}

func TestEnvServeErrors(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { busy.Close() })
	busyPort := strconv.Itoa(busy.Addr().(*net.TCPAddr).Port)
	tests := []struct {
		name     string
		args     []string
		code     int
		contains string
	}{
		{"unknown env", []string{"env", "serve", "nope"}, ExitUsage, `unknown built-in environment "nope" (available: echo, guess, ladder, letters, lockbox, mcp-echo)`},
		{"no name", []string{"env", "serve"}, ExitUsage, "accepts 1 arg"},
		{"bad port", []string{"env", "serve", "echo", "--port", "70000"}, ExitUsage, "--port 70000 is not a TCP port"},
		{"bad idle timeout", []string{"env", "serve", "echo", "--idle-timeout", "0s"}, ExitUsage, "--idle-timeout 0s must be positive"},
		{"negative tool latency", []string{"env", "serve", "echo", "--tool-latency", "-1s"}, ExitUsage, "--tool-latency -1s must be 0 or positive"},
		{"port in use", []string{"env", "serve", "echo", "--port", busyPort}, ExitError, "is the port in use?"},
		{"bad protocol", []string{"env", "serve", "echo", "--protocol", "grpc"}, ExitUsage, `--protocol "grpc" is not a protocol (allowed: ors, openenv)`},
		{"openenv env over ors", []string{"env", "serve", "guess", "--protocol", "ors", "--port", "0"}, ExitUsage, `"guess" speaks OpenEnv only`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := execCLI(t, nil, tt.args...)
			assert.Equal(t, tt.code, code, errOut)
			assert.Empty(t, out)
			assert.Contains(t, errOut, tt.contains)
		})
	}
}

func TestEnvList(t *testing.T) {
	code, out, errOut := execCLI(t, nil, "env", "list")
	require.Equal(t, ExitOK, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 7)
	assert.Equal(t, "NAME\tPROTOCOL\tENV NAME\tDESCRIPTION", lines[0])
	assert.True(t, strings.HasPrefix(lines[1], "echo\tors\techoenvironment\t"), lines[1])
	assert.True(t, strings.HasPrefix(lines[2], "guess\topenenv\t"), lines[2])
	assert.True(t, strings.HasPrefix(lines[3], "ladder\tors\tladder\t"), lines[3])
	assert.True(t, strings.HasPrefix(lines[4], "letters\tors\tletters\t"), lines[4])
	assert.True(t, strings.HasPrefix(lines[5], "lockbox\tors\tlockbox\t"), lines[5])
	assert.True(t, strings.HasPrefix(lines[6], "mcp-echo\topenenv\t"), lines[6])
}

// TestEnvServeThenListTasks is the must-show: serve echo on a port,
// then list its tasks and tools through that URL.
func TestEnvServeThenListTasks(t *testing.T) {
	port := freePort(t)
	url := serveInBackground(t, "echo", "--port", strconv.Itoa(port))
	require.Equal(t, "http://127.0.0.1:"+strconv.Itoa(port), url)

	code, out, errOut := execCLI(t, nil, "list-tasks", "--env", url, "--tools")
	require.Equal(t, ExitOK, code, errOut)
	assert.Equal(t, `INDEX	ID	TARGET
0	echo-0	hello
1	echo-1	world
2	echo-2	trl
3	echo-3	openreward

TOOL	SCOPE	DESCRIPTION
echo	shared	Echo the given text back. Echoing the task's target wins.
hint	task	Get a hint about how to win.
`, out)
}

// OpenEnv envs are served over OpenEnv, and an ORS env can be too (as an
// MCP env): both answer /health and /metadata as openenv-core does.
func TestEnvServeOverOpenEnv(t *testing.T) {
	for _, tc := range []struct {
		args []string
		name string
	}{
		{[]string{"guess", "--port", "0"}, "guess"},
		{[]string{"letters", "--protocol", "openenv", "--port", "0"}, "letters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := serveInBackground(t, tc.args...)
			c, err := openenv.NewClient(url, openenv.Options{})
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(t, c.Health(ctx))
			info, err := openenv.Probe(ctx, url, openenv.Options{})
			require.NoError(t, err)
			assert.Equal(t, tc.name == "letters", info.MCP, "letters is served as an MCP env, guess is Gym-style")
		})
	}
}

// Issue 23: --version prints what the version subcommand prints.
func TestVersionFlag(t *testing.T) {
	code, flagOut, errOut := execCLI(t, nil, "--version")
	require.Equal(t, ExitOK, code, errOut)
	code, cmdOut, errOut := execCLI(t, nil, "version")
	require.Equal(t, ExitOK, code, errOut)
	assert.Equal(t, cmdOut, flagOut)
	assert.True(t, strings.HasPrefix(flagOut, "ortrain "), flagOut)
}
