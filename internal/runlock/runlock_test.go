package runlock

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOneWriterPerDirectory: a held directory is refused naming the
// holder; released, it can be taken again.
func TestOneWriterPerDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	l, err := Acquire(dir, "run")
	require.NoError(t, err)
	assert.Nil(t, Held(t.TempDir()), "a directory never locked")
	require.NotNil(t, Held(dir))
	assert.Equal(t, os.Getpid(), Held(dir).Holder.PID)
	_, err = Acquire(dir, "sft")
	var he *HeldError
	require.ErrorAs(t, err, &he)
	assert.Equal(t, os.Getpid(), he.Holder.PID)
	assert.Equal(t, "run", he.Holder.Command)
	assert.NotEmpty(t, he.Holder.Host)
	require.NoError(t, l.Release())
	assert.Nil(t, Held(dir), "released")
	require.NoError(t, l.Release(), "twice is fine")
	l2, err := Acquire(dir, "sft")
	require.NoError(t, err)
	require.NoError(t, l2.Release())
	var none *Lock
	assert.NoError(t, none.Release())
}

// TestKernelReleasesADeadHolder: a holder killed with SIGKILL leaves no
// stale lock.
func TestKernelReleasesADeadHolder(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 holds the lock from another process")
	}
	dir := t.TempDir()
	cmd := exec.Command("python3", "-c", `import fcntl, sys, time
f = open(sys.argv[1], "a")
fcntl.flock(f, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(60)`, filepath.Join(dir, FileName))
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "locked\n", line)

	_, err = Acquire(dir, "run")
	var he *HeldError
	require.ErrorAs(t, err, &he)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	l, err := Acquire(dir, "run")
	require.NoError(t, err, "the kernel released the dead holder's lock")
	require.NoError(t, l.Release())
}
