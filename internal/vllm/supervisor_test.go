package vllm_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/vllm"
	"github.com/ortrain/ortrain/internal/worker"
)

// eventLog records supervisor events for assertions.
type eventLog struct {
	mu  sync.Mutex
	evs []vllm.Event
}

func (l *eventLog) add(ev vllm.Event) { l.mu.Lock(); l.evs = append(l.evs, ev); l.mu.Unlock() }

func (l *eventLog) states(replica int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, ev := range l.evs {
		if ev.Replica == replica {
			out = append(out, ev.State.String())
		}
	}
	return out
}

// last is the replica's latest event.
func (l *eventLog) last(replica int) vllm.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out vllm.Event
	for _, ev := range l.evs {
		if ev.Replica == replica {
			out = ev
		}
	}
	return out
}

func supervisorOptions(t *testing.T, kind childKind, replicas int) (vllm.Options, *eventLog) {
	log := &eventLog{}
	env := []string{"PATH=" + os.Getenv("PATH")}
	if lib, _, err := worker.FindLibrary("", os.Getenv); err == nil {
		env = append(env, "ORTRAIN_WORKER_LIB="+lib)
	}
	return vllm.Options{
		Launch:         vllm.LaunchConfig{Command: kind.command, Model: kind.model, Environ: env},
		GPUs:           make([][]int, replicas),
		LogDir:         t.TempDir(),
		StartupTimeout: 30 * time.Second,
		PollInterval:   50 * time.Millisecond,
		HealthInterval: 200 * time.Millisecond,
		RestartBase:    50 * time.Millisecond,
		RestartCap:     200 * time.Millisecond,
		StopGrace:      5 * time.Second,
		OnEvent:        log.add,
		Logger:         zerolog.New(zerolog.NewTestWriter(t)),
	}, log
}

// complete sends a one-prompt, 4-token completion (with the API key, when
// one is given) and checks the shape.
func complete(t *testing.T, ctx context.Context, url, model string, key ...string) *vllm.CompletionResponse {
	t.Helper()
	c, err := vllm.NewClient(url, nil)
	require.NoError(t, err)
	if len(key) > 0 {
		c = c.WithAPIKey(key[0])
	}
	zero, seed := 0, int64(3)
	resp, err := c.Complete(ctx, &vllm.CompletionRequest{Model: model, Prompt: []int32{1, 2, 3}, MaxTokens: 4, N: 1,
		Temperature: 1, TopP: 1, TopK: -1, RepetitionPenalty: 1, Seed: &seed, IgnoreEOS: true, Logprobs: &zero, ReturnTokenIDs: true})
	require.NoError(t, err)
	require.NoError(t, resp.Validate(1))
	require.Len(t, resp.Choices[0].TokenIDs, 4)
	return resp
}

func groupGone(pgid int) bool { return syscall.Kill(-pgid, 0) != nil }

func TestSupervisorReadyKillRestartStop(t *testing.T) {
	for _, kind := range childKinds(t) {
		t.Run(kind.name, func(t *testing.T) {
			opts, log := supervisorOptions(t, kind, 2)
			ctx := testContext(t, 2*time.Minute)
			sup, err := vllm.Start(ctx, opts)
			require.NoError(t, err)
			stopped := false
			t.Cleanup(func() {
				if !stopped {
					sup.Stop()
				}
			})
			// Ready: both replicas answer on distinct loopback URLs.
			urls := sup.URLs()
			require.Len(t, urls, 2)
			assert.NotEqual(t, urls[0], urls[1])
			for i, r := range sup.Replicas() {
				assert.True(t, r.Ready(), "replica %d", i)
				assert.True(t, strings.HasPrefix(r.URL(), "http://127.0.0.1:"))
				complete(t, ctx, r.URL(), kind.model)
				assert.Equal(t, []string{"starting", "ready"}, log.states(i))
			}

			// kill -9 of replica 0's leader: restarted, traffic resumes.
			r0 := sup.Replicas()[0]
			oldPID := r0.PID()
			require.NoError(t, syscall.Kill(oldPID, syscall.SIGKILL))
			require.Eventually(t, func() bool { return r0.Restarts() == 1 && r0.Ready() }, time.Minute, 20*time.Millisecond)
			assert.NotEqual(t, oldPID, r0.PID())
			assert.True(t, groupGone(oldPID), "the killed replica's group is gone")
			complete(t, ctx, r0.URL(), kind.model)
			assert.Equal(t, []string{"starting", "ready", "restarting", "starting", "ready"}, log.states(0))
			assert.Equal(t, 0, sup.Replicas()[1].Restarts())
			require.NoError(t, sup.Err())

			// Graceful stop leaves no process behind.
			pids := []int{sup.Replicas()[0].PID(), sup.Replicas()[1].PID()}
			sup.Stop()
			stopped = true
			for _, pid := range pids {
				assert.True(t, groupGone(pid), "process group %d still alive after Stop", pid)
			}
			for i := range 2 {
				states := log.states(i)
				assert.Equal(t, "stopped", states[len(states)-1])
			}
			logData, err := os.ReadFile(r0.LogPath())
			require.NoError(t, err)
			assert.Equal(t, 2, strings.Count(string(logData), "=== "), "one header per start in the replica log")
		})
	}
}

func TestSupervisorStartupDeadline(t *testing.T) {
	// A child that never serves /health and prints nothing.
	kind := childKind{name: "silent", command: []string{"sh", "-c", "sleep 60", "sh"}, model: "m"}
	opts, log := supervisorOptions(t, kind, 1)
	opts.StartupTimeout = 500 * time.Millisecond
	start := time.Now()
	_, err := vllm.Start(testContext(t, time.Minute), opts)
	require.Error(t, err)
	assert.Less(t, time.Since(start), 10*time.Second)
	assert.Contains(t, err.Error(), "not ready after")
	assert.Contains(t, err.Error(), "replica 0")
	assert.Equal(t, []string{"starting", "failed"}, log.states(0))
}

// TestSupervisorSlowHealth: a server whose /health answers later than the
// supervisor waits (the stand-in's slow-health fault) never counts as
// ready: the start fails, naming the health check, instead of hanging.
func TestSupervisorSlowHealth(t *testing.T) {
	opts, log := supervisorOptions(t, childKind{name: "toy", command: []string{toyServer}, model: "toy"}, 1)
	opts.Launch.ExtraArgs = []string{"--fault", "slow-health=5s"}
	opts.StartupTimeout = 2500 * time.Millisecond
	_, err := vllm.Start(testContext(t, time.Minute), opts)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not ready after")
	assert.Contains(t, err.Error(), "/health")
	assert.ErrorIs(t, err, context.DeadlineExceeded, "the last health check ran out of time")
	assert.Equal(t, []string{"starting", "failed"}, log.states(0))
}

func TestSupervisorStartupCrashReportsErrorLines(t *testing.T) {
	kind := childKind{name: "crash", command: []string{"sh", "-c", "echo loading; echo 'ValueError: unknown architecture' >&2; exit 3", "sh"}, model: "m"}
	opts, _ := supervisorOptions(t, kind, 1)
	_, err := vllm.Start(testContext(t, time.Minute), opts)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "exit status 3")
	assert.Contains(t, err.Error(), "ValueError: unknown architecture")
	assert.NotContains(t, err.Error(), "loading", "only error-like lines are repeated")
}

func TestSupervisorPortInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	opts, _ := supervisorOptions(t, childKind{name: "toy", command: []string{toyServer}, model: "toy"}, 1)
	opts.BasePort = l.Addr().(*net.TCPAddr).Port
	_, err = vllm.Start(testContext(t, time.Minute), opts)
	var pe *vllm.PortInUseError
	require.ErrorAs(t, err, &pe)
	assert.Contains(t, err.Error(), "pick another --port")
}

func TestSupervisorFixedPorts(t *testing.T) {
	port, err := vllm.FreePort("127.0.0.1")
	require.NoError(t, err)
	opts, _ := supervisorOptions(t, childKind{name: "toy", command: []string{toyServer}, model: "toy"}, 1)
	opts.BasePort = port
	sup, err := vllm.Start(testContext(t, time.Minute), opts)
	require.NoError(t, err)
	defer sup.Stop()
	assert.Equal(t, "http://127.0.0.1:"+itoa(port), sup.URLs()[0])
}

func TestSupervisorGivesUpAfterMaxRestarts(t *testing.T) {
	opts, log := supervisorOptions(t, childKind{name: "toy", command: []string{toyServer}, model: "toy"}, 1)
	opts.MaxRestarts = 1
	sup, err := vllm.Start(testContext(t, time.Minute), opts)
	require.NoError(t, err)
	defer sup.Stop()
	r := sup.Replicas()[0]
	require.NoError(t, syscall.Kill(r.PID(), syscall.SIGKILL))
	require.Eventually(t, func() bool { return r.Restarts() == 1 && r.Ready() }, time.Minute, 20*time.Millisecond)
	require.NoError(t, syscall.Kill(r.PID(), syscall.SIGKILL))
	select {
	case <-sup.Failed():
	case <-time.After(30 * time.Second):
		t.Fatal("supervisor did not give up")
	}
	assert.Contains(t, sup.Err().Error(), "gave up after 1 restarts")
	assert.Equal(t, vllm.StateFailed, r.State())
	states := log.states(0)
	assert.Equal(t, "failed", states[len(states)-1])
}

func TestSupervisorStopDuringStartup(t *testing.T) {
	kind := childKind{name: "silent", command: []string{"sh", "-c", "sleep 60", "sh"}, model: "m"}
	opts, _ := supervisorOptions(t, kind, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(300 * time.Millisecond); cancel() }()
	_, err := vllm.Start(ctx, opts)
	require.Error(t, err)
	assert.True(t, errors.Is(err, context.Canceled), "%v", err)
}
