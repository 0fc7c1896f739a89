package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// binDir holds the binary buildOrtrain builds once for the package's tests.
var binDir = sync.OnceValues(func() (string, error) { return os.MkdirTemp("", "ortrain-cli-test-") })

// builtOrtrain builds ../../cmd/ortrain once.
var builtOrtrain = sync.OnceValues(func() (string, error) {
	dir, err := binDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "ortrain")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/ortrain").CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %w: %s", err, out)
	}
	return bin, nil
})

func TestMain(m *testing.M) {
	code := m.Run()
	if dir, err := binDir(); err == nil {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

// execBinary runs the built binary with args and env added to this
// process's environment, and returns the exit code, stdout and stderr: for
// long trainings, which run at full speed outside the race detector.
func execBinary(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(buildOrtrain(t), args...)
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stdout.String(), stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stdout.String(), stderr.String()
	}
	require.NoError(t, err)
	return -1, "", ""
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

// duplicateKeys returns the keys that occur more than once in the JSON
// object line (at any depth), and an error when line is not one object.
func duplicateKeys(line []byte) ([]string, error) {
	dec := json.NewDecoder(bytes.NewReader(line))
	var dups []string
	var object func() error
	var value func() error
	value = func() error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'):
			return object()
		case json.Delim('['):
			for dec.More() {
				if err := value(); err != nil {
					return err
				}
			}
			_, err = dec.Token()
			return err
		}
		return nil
	}
	object = func() error {
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return err
			}
			k, _ := tok.(string)
			if seen[k] {
				dups = append(dups, k)
			}
			seen[k] = true
			if err := value(); err != nil {
				return err
			}
		}
		_, err := dec.Token()
		return err
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if tok != json.Delim('{') {
		return nil, fmt.Errorf("not a JSON object: %q", line)
	}
	return dups, object()
}

// requireNoDuplicateKeys checks every JSON line of a log; it returns how
// many lines it checked.
func requireNoDuplicateKeys(t *testing.T, log string) int {
	t.Helper()
	n := 0
	for _, line := range strings.Split(log, "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		dups, err := duplicateKeys([]byte(line))
		require.NoError(t, err, line)
		assert.Empty(t, dups, "duplicate keys in %s", line)
		n++
	}
	return n
}
