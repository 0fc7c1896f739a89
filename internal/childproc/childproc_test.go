package childproc

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStatusWriterKeepsErrorTail(t *testing.T) {
	var sink strings.Builder
	now := time.Unix(100, 0)
	w := NewStatusWriter(&sink, func() time.Time { return now })
	_, _ = w.Write([]byte("INFO loading weights\nTraceback (most recent call last):\n  File x\nRuntimeError: CUDA error: out of"))
	now = time.Unix(200, 0)
	_, _ = w.Write([]byte(" memory\nINFO shutting down\n"))
	assert.Equal(t, "Traceback (most recent call last):\nRuntimeError: CUDA error: out of memory", w.Tail())
	assert.Equal(t, time.Unix(200, 0), w.LastOutput())
	assert.Contains(t, sink.String(), "INFO loading weights", "everything reaches the log file")
	for range 2000 {
		_, _ = w.Write([]byte("RuntimeError: again and again and again\n"))
	}
	assert.LessOrEqual(t, len(w.Tail()), 9<<10, "the tail is bounded")

	j := NewStatusWriter(nil, nil)
	_, _ = j.Write([]byte(`{"level":"info","message":"Application startup complete."}` + "\n" + `{"level":"error","error":"listen: address in use"}` + "\n"))
	assert.Equal(t, `{"level":"error","error":"listen: address in use"}`, j.Tail())
}

// TestProcessStopsItsWholeGroup: the child's own children die with it,
// the log keeps its output, and the exit error carries the error tail.
func TestProcessStopsItsWholeGroup(t *testing.T) {
	sh, err := exec.LookPath("sh")
	require.NoError(t, err)
	log := filepath.Join(t.TempDir(), "child.log")
	var echo strings.Builder
	p, err := Start(Options{Argv: []string{sh, "-c", "echo started; echo 'RuntimeError: boom' >&2; sleep 300 & sleep 300"}, LogPath: log, Echo: &syncWriter{b: &echo}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return strings.Contains(p.Tail(), "boom") }, 10*time.Second, 10*time.Millisecond)
	p.Stop(time.Second)
	<-p.Done()
	assert.False(t, GroupAlive(p.PGID()), "the background sleep died with the group")
	assert.Error(t, p.Err())
	assert.Contains(t, p.ExitError().Error(), "RuntimeError: boom")
	data, err := os.ReadFile(log)
	require.NoError(t, err)
	assert.Contains(t, string(data), "started")
	assert.Contains(t, echo.String(), "started")

	q, err := Start(Options{Argv: []string{sh, "-c", "exit 3"}, LogPath: log})
	require.NoError(t, err)
	<-q.Done()
	var ee *exec.ExitError
	require.ErrorAs(t, q.Err(), &ee)
	assert.Equal(t, 3, ee.ExitCode())
	assert.Equal(t, syscall.Signal(-1), ee.Sys().(syscall.WaitStatus).Signal())
}

// syncWriter serialises writes for the test's reader.
type syncWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}
