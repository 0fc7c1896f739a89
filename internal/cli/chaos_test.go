package cli

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/configs"
	"github.com/ortrain/ortrain/internal/worker"
)

// envProcess is `ortrain env serve letters` as its own process, so the
// test can kill -9 it.
type envProcess struct {
	t    *testing.T
	bin  string
	port int
	cmd  *exec.Cmd
}

func (e *envProcess) start() {
	e.t.Helper()
	e.cmd = exec.Command(e.bin, "env", "serve", "letters", "--port", strconv.Itoa(e.port))
	e.cmd.Stdout, e.cmd.Stderr = nil, nil
	require.NoError(e.t, e.cmd.Start())
	url := fmt.Sprintf("http://127.0.0.1:%d/splits", e.port)
	require.Eventually(e.t, func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 20*time.Second, 20*time.Millisecond, "env server did not come up")
}

func (e *envProcess) kill() {
	_ = e.cmd.Process.Signal(syscall.SIGKILL)
	_ = e.cmd.Wait()
}

// stallLimit is how long a run may go without logging a step before a
// test calls it hung: a stall clock, not a deadline for the whole run, so a
// busy machine makes a run slow but never fails it.
const stallLimit = 5 * time.Minute

// waitSteps blocks until metrics.jsonl in dir holds at least n lines, or
// fails when the run ends first or logs no new step for stallLimit.
func waitSteps(t *testing.T, dir string, n int, done <-chan error) {
	t.Helper()
	last, lastAt := -1, time.Now()
	for {
		got := lines(filepath.Join(dir, "metrics.jsonl"))
		if got >= n {
			return
		}
		if got != last {
			last, lastAt = got, time.Now()
		}
		if time.Since(lastAt) > stallLimit {
			t.Fatalf("stalled at step %d of %d: no new step for %v", got, n, stallLimit)
		}
		select {
		case err := <-done:
			t.Fatalf("the run ended before step %d: %v", n, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitDone waits for the run to end, failing only when it logs no new step
// for stallLimit.
func waitDone(t *testing.T, dir string, done <-chan error) error {
	t.Helper()
	last, lastAt := -1, time.Now()
	for {
		select {
		case err := <-done:
			return err
		case <-time.After(100 * time.Millisecond):
		}
		if got := lines(filepath.Join(dir, "metrics.jsonl")); got != last {
			last, lastAt = got, time.Now()
		}
		if time.Since(lastAt) > stallLimit {
			t.Fatalf("the run stalled at step %d: no new step for %v", last, stallLimit)
		}
	}
}

// TestChaos is issue 14's fault-injection run: a 40-step quickstart whose
// env server is killed with SIGKILL twice (and restarted a second later)
// and whose trainer is killed once (and resumed). The run completes, logs
// steps 1..40 once each, still learns, and its final weights load.
func TestChaos(t *testing.T) {
	lib := requireWorkerLib(t)
	if testing.Short() {
		t.Skip("chaos run takes about a minute")
	}
	bin := buildOrtrain(t)
	work := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	env := &envProcess{t: t, bin: bin, port: port}
	env.start()
	t.Cleanup(env.kill)

	out := filepath.Join(work, "run")
	cfg := bytes.Replace(configs.Quickstart(), []byte("builtin:letters"), []byte(fmt.Sprintf("http://127.0.0.1:%d", port)), 1)
	cfg = append(cfg, []byte(fmt.Sprintf("\noutput_dir: %s\n", out))...)
	cfgPath := filepath.Join(work, "chaos.yaml")
	require.NoError(t, os.WriteFile(cfgPath, bytes.Replace(cfg, []byte("output_dir: runs/quickstart"), nil, 1), 0o644))
	trainer := func(args ...string) (*exec.Cmd, <-chan error) {
		cmd := exec.Command(bin, append([]string{"run", "--config", cfgPath, "--max-steps", "40", "--log-format", "json"}, args...)...)
		cmd.Dir = work
		cmd.Env = append(os.Environ(), worker.EnvLibrary+"="+lib, "ORTRAIN_GRPO_SAVE_STEPS=5", "ORTRAIN_ROLLOUT_RETRY_BACKOFF=200ms")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		require.NoError(t, cmd.Start())
		done := make(chan error, 1)
		go func() {
			err := cmd.Wait()
			if err != nil {
				err = fmt.Errorf("%w; stderr tail: %s", err, tail(stderr.Bytes(), 3000))
			}
			done <- err
		}()
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		return cmd, done
	}

	cmd, done := trainer()
	for _, at := range []int{6, 14} {
		waitSteps(t, out, at, done)
		env.kill()
		time.Sleep(time.Second)
		env.start()
	}
	waitSteps(t, out, 22, done)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	<-done

	_, done = trainer("--resume")
	require.NoError(t, waitDone(t, out, done), "the resumed run completes")

	metrics := readStepMetrics(t, out)
	require.Len(t, metrics, 40, "every step logged once")
	for i, m := range metrics {
		require.Equal(t, float64(i+1), m["step"], "line %d", i+1)
	}
	mean := func(ms []map[string]float64) float64 {
		s := 0.0
		for _, m := range ms {
			s += m["reward"]
		}
		return s / float64(len(ms))
	}
	first, last := mean(metrics[:5]), mean(metrics[35:])
	t.Logf("chaos run: mean reward first 5 steps %.3f, last 5 steps %.3f", first, last)
	// Undisturbed, the quickstart goes from about 0.007 to 0.077 over these
	// 40 steps (its steep part comes later).
	assert.Greater(t, last, 3*first, "the reward still rises")

	l2, err := worker.Open(lib)
	require.NoError(t, err)
	defer l2.Close()
	ck := filepath.Join(out, "checkpoints", "step-000040")
	m, err := l2.LoadModel(context.Background(), worker.ModelOptions{Dir: filepath.Join(ck, "model"), Threads: 1})
	require.NoError(t, err, "the final weights load")
	require.NoError(t, m.LoadOptimizer(context.Background(), filepath.Join(ck, "optimizer.pt")))
	require.NoError(t, m.Close())
}

// readStepMetrics reads metrics.jsonl as maps.
func readStepMetrics(t *testing.T, dir string) []map[string]float64 {
	t.Helper()
	return stepMetrics(t, dir)
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
