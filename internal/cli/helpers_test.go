package cli

import (
	"bytes"
	"context"
	"sync"
	"testing"
)

// lockedBuffer is a bytes.Buffer safe for a command writing while a test reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// execCLI runs ortrain with args and env (OPENREWARD_* etc.) and returns
// the exit code, stdout and stderr.
func execCLI(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	deps := SystemDeps()
	io, out, errOut := TestIO()
	deps.IO = io
	deps.Getenv = func(k string) string { return env[k] }
	code := Execute(context.Background(), deps, args)
	return code, out.String(), errOut.String()
}
