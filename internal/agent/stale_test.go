package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReapStaleAfterTrainerKilled: a trainer killed with SIGKILL while its
// agent runs leaves the agent's children (one in the agent's group, one
// that left it with setsid) and its directory behind; ReapStale, as the
// next run calls it, ends them and removes the directory, and leaves a
// live trainer's agents alone.
func TestReapStaleAfterTrainerKilled(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("setsid is not installed")
	}
	root := t.TempDir()
	pids := filepath.Join(root, "pids")
	agentScript := `sleep 300 & echo $! >> ` + pids + `
setsid sleep 300 & echo $! >> ` + pids + `
sleep 300`
	exe, err := os.Executable()
	require.NoError(t, err)
	trainer := exec.Command(exe, helperArg, "trainer", root, agentScript)
	require.NoError(t, trainer.Start())
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(pids)
		return strings.Count(string(b), "\n") == 2
	}, 20*time.Second, 20*time.Millisecond, "the agent started its children")

	live, err := ReapStale(root)
	require.NoError(t, err)
	assert.Zero(t, live, "a live trainer's agent is not reaped")

	require.NoError(t, trainer.Process.Kill())
	_ = trainer.Wait()
	children := readPids(t, pids)
	for _, pid := range children {
		assert.NoError(t, syscall.Kill(pid, 0), "child %d outlived the trainer", pid)
	}
	dirs, _ := filepath.Glob(filepath.Join(root, "ortrain-agent-*"))
	require.Len(t, dirs, 2, "the agent's directory and owner record are left behind")

	n, err := ReapStale(root)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	for _, pid := range children {
		require.Eventually(t, func() bool { return syscall.Kill(pid, 0) != nil || zombie(pid) }, 10*time.Second, 20*time.Millisecond,
			"child %d was ended", pid)
	}
	dirs, _ = filepath.Glob(filepath.Join(root, "ortrain-agent-*"))
	assert.Empty(t, dirs, "the directory and the record are removed")
}

// zombie reports whether pid has exited but not been reaped (its parent,
// init in a container, may be slow to reap it).
func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && strings.HasPrefix(strings.TrimSpace(string(b[i+1:])), "Z")
}
