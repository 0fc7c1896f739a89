package agent

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func ptr(f float64) *float64 { return &f }

// TestCommandOutcomes runs agents that end on their own and checks how each
// is classified.
func TestCommandOutcomes(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "no-such-agent")
	cases := []struct {
		name      string
		argv      []string
		tailBytes int
		outcome   Outcome
		reward    *float64
		exitCode  int
	}{
		{name: "reward", argv: script(t, `echo thinking >&2; echo '{"reward": 0.5}'`), outcome: OutcomeOK, reward: ptr(0.5)},
		{name: "reward then blank lines, extra fields", argv: script(t, `echo log; printf '{"reward": -1, "info": {"a": [1]}}\r\n\n   \n'`), outcome: OutcomeOK, reward: ptr(-1)},
		{name: "reward without newline", argv: script(t, `printf '{"reward": 2e-3}'`), outcome: OutcomeOK, reward: ptr(2e-3)},
		{name: "null reward", argv: script(t, `echo '{"reward": null}'`), outcome: OutcomeOK},
		{name: "plain text last line", argv: script(t, `echo '{"reward": 1}'; echo done`), outcome: OutcomeOK},
		{name: "no output", argv: script(t, `true`), outcome: OutcomeOK},
		// (Run as root, the removal succeeds without the chmod walk.)
		{name: "read-only leftovers", argv: script(t, `mkdir -p sub/deep && touch sub/deep/f && chmod 0500 sub/deep sub && chmod 0500 .`), outcome: OutcomeOK},
		{name: "long plain line", argv: script(t, `head -c 5000 /dev/zero | tr '\0' x; echo`), tailBytes: 1024, outcome: OutcomeOK},
		{name: "non-zero exit", argv: script(t, `echo '{"reward": 1}'; echo failing >&2; exit 3`), outcome: OutcomeAgentError, exitCode: 3},
		{name: "killed by signal", argv: script(t, `echo '{"reward": 1}'; kill -KILL $$`), outcome: OutcomeAgentError, exitCode: -1},
		{name: "cannot start", argv: []string{missing}, outcome: OutcomeAgentError, exitCode: -1},
		{name: "garbage JSON", argv: script(t, `echo '{"reward": 0.5'`), outcome: OutcomeBadOutput},
		{name: "reward is a string", argv: script(t, `echo '{"reward": "0.5"}'`), outcome: OutcomeBadOutput},
		{name: "no reward field", argv: script(t, `echo '{"score": 1}'`), outcome: OutcomeBadOutput},
		{name: "reward out of range", argv: script(t, `echo '{"reward": 1e999}'`), outcome: OutcomeBadOutput},
		{name: "trailing garbage", argv: script(t, `echo '{"reward": 1} x'`), outcome: OutcomeBadOutput},
		{name: "non-UTF-8 text line", argv: script(t, `printf 'caf\351\n'`), outcome: OutcomeBadOutput},
		{name: "non-UTF-8 inside JSON", argv: script(t, `printf '{"reward": 1, "note": "\377"}\n'`), outcome: OutcomeBadOutput},
		{name: "JSON line longer than the tail", argv: script(t, `printf '{"reward": 1, "pad": "'; head -c 5000 /dev/zero | tr '\0' x; printf '"}\n'`), tailBytes: 1024, outcome: OutcomeBadOutput},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			spec := Spec{Command: tc.argv, Timeout: 2 * time.Second, KillGrace: 500 * time.Millisecond, TempRoot: root, TailBytes: tc.tailBytes}
			res := Run(context.Background(), spec, testFacts())
			assert.Equal(t, tc.outcome, res.Outcome, "err: %v; stderr: %s", res.Err, res.StderrTail)
			assert.Equal(t, tc.outcome.Failed(), res.Err != nil, "Err is set exactly for failures: %v", res.Err)
			assert.Equal(t, tc.exitCode, res.ExitCode)
			if tc.reward == nil {
				assert.Nil(t, res.Reward)
			} else if assert.NotNil(t, res.Reward) {
				assert.InDelta(t, *tc.reward, *res.Reward, 1e-12)
			}
			assert.Positive(t, res.Duration)
			requireEmptyDir(t, root)
		})
	}
	t.Run("tails", func(t *testing.T) {
		t.Parallel()
		res := Run(context.Background(), Spec{Command: script(t, `echo out1; echo err1 >&2; echo '{"reward": 1}'`), Timeout: 2 * time.Second}, testFacts())
		require.Equal(t, OutcomeOK, res.Outcome, "%v", res.Err)
		assert.Equal(t, "out1\n{\"reward\": 1}\n", res.StdoutTail)
		assert.Equal(t, "err1\n", res.StderrTail)
	})
}

// TestCommandEnvironment checks what a command agent is given: the facts
// override the parent's variables of the same names, the rest of the
// parent's environment passes, and each run gets a fresh directory that is
// removed afterwards. Not parallel: it sets the process environment.
func TestCommandEnvironment(t *testing.T) {
	t.Setenv(EnvBaseURL, "http://stale.invalid/v1")
	t.Setenv(EnvAPIKey, "stale-key")
	t.Setenv(EnvMCPURL, "http://stale.invalid/mcp")
	t.Setenv("ORTRAIN_AGENT_TEST_KEEP", "kept")
	root := t.TempDir()
	run := func(facts Facts) envReport {
		report := filepath.Join(t.TempDir(), "report.json")
		res := Run(context.Background(), Spec{Command: helperCommand(t, "env", report), Timeout: 5 * time.Second, TempRoot: root}, facts)
		require.Equal(t, OutcomeOK, res.Outcome, "err: %v; stderr: %s", res.Err, res.StderrTail)
		require.NotNil(t, res.Reward)
		assert.Equal(t, 0.5, *res.Reward)
		b, err := os.ReadFile(report)
		require.NoError(t, err)
		var rep envReport
		require.NoError(t, json.Unmarshal(b, &rep))
		requireEmptyDir(t, root)
		return rep
	}
	env := func(rep envReport, name string) string {
		v := rep.Env[name]
		require.NotNil(t, v, "%s not set", name)
		return *v
	}

	facts := testFacts()
	rep := run(facts)
	assert.Equal(t, facts.BaseURL, env(rep, EnvBaseURL))
	assert.Equal(t, facts.APIKey, env(rep, EnvAPIKey))
	assert.Equal(t, facts.Model, env(rep, EnvModel))
	assert.Equal(t, facts.MCPURL, env(rep, EnvMCPURL))
	assert.Equal(t, facts.RolloutID, env(rep, EnvRolloutID))
	assert.JSONEq(t, string(facts.Task), env(rep, EnvTask))
	assert.Equal(t, "kept", env(rep, "ORTRAIN_AGENT_TEST_KEEP"))
	assert.Equal(t, root, filepath.Dir(rep.Cwd), "the agent runs in a directory under TempRoot")
	assert.Zero(t, rep.CwdEntries, "the directory starts empty")
	assert.NoDirExists(t, rep.Cwd)

	facts.MCPURL, facts.Task = "", nil
	rep2 := run(facts)
	assert.Nil(t, rep2.Env[EnvMCPURL], "no MCP URL, and not the parent's stale one")
	assert.Equal(t, "null", env(rep2, EnvTask))
	assert.NotEqual(t, rep.Cwd, rep2.Cwd, "each run gets a fresh directory")
}

// TestCommandStopped covers agents that do not end on their own: the whole
// process group is stopped and Run returns within Timeout+KillGrace.
func TestCommandStopped(t *testing.T) {
	t.Parallel()
	const timeout, grace = 800 * time.Millisecond, 300 * time.Millisecond
	cases := []struct {
		name    string
		body    string // $1 is a file for the pids the script starts
		ctx     func(t *testing.T) context.Context
		outcome Outcome
	}{
		{name: "hang", body: `echo $$ > "$1"; sleep 30`, outcome: OutcomeTimeout},
		{name: "ignores SIGTERM", body: `echo $$ > "$1"; trap '' TERM; sleep 30`, outcome: OutcomeTimeout},
		{
			name: "grandchild ignores SIGTERM and holds stdout",
			body: `echo $$ > "$1"
sh -c 'trap "" TERM; exec sleep 30' &
echo $! >> "$1"
echo waiting
wait`,
			outcome: OutcomeTimeout,
		},
		{
			name: "caller deadline",
			body: `echo $$ > "$1"; sleep 30`,
			ctx: func(t *testing.T) context.Context {
				ctx, cancel := context.WithTimeout(context.Background(), timeout/2)
				t.Cleanup(cancel)
				return ctx
			},
			outcome: OutcomeTimeout,
		},
		{
			name: "caller cancels",
			body: `echo $$ > "$1"; sleep 30`,
			ctx: func(t *testing.T) context.Context {
				ctx, cancel := context.WithCancel(context.Background())
				t.Cleanup(cancel)
				time.AfterFunc(timeout/2, cancel)
				return ctx
			},
			outcome: OutcomeCanceled,
		},
		{
			name: "leader exits, background child holds stdout",
			body: `echo $$ > "$1"
sh -c 'trap "" TERM; exec sleep 30' &
echo $! >> "$1"
echo '{"reward": 0.25}'`,
			outcome: OutcomeOK,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			if tc.ctx != nil {
				ctx = tc.ctx(t)
			}
			root := t.TempDir()
			pidFile := filepath.Join(t.TempDir(), "pids")
			spec := Spec{Command: script(t, tc.body, pidFile), Timeout: timeout, KillGrace: grace, TempRoot: root}
			start := time.Now()
			res := Run(ctx, spec, testFacts())
			elapsed := time.Since(start)
			assert.Equal(t, tc.outcome, res.Outcome, "err: %v", res.Err)
			assert.Less(t, elapsed, timeout+grace+slack)
			if tc.outcome == OutcomeOK {
				require.NotNil(t, res.Reward)
				assert.Equal(t, 0.25, *res.Reward)
			} else {
				assert.Error(t, res.Err)
				assert.Equal(t, -1, res.ExitCode)
			}
			pids := readPids(t, pidFile)
			require.NotEmpty(t, pids)
			assert.False(t, groupAlive(pids[0]), "the agent's process group is gone")
			for _, pid := range pids {
				assert.True(t, processGone(pid), "pid %d is still running", pid)
			}
			requireEmptyDir(t, root)
		})
	}
	t.Run("canceled before start", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		marker := filepath.Join(t.TempDir(), "ran")
		res := Run(ctx, Spec{Command: script(t, `touch "$1"`, marker), Timeout: time.Second}, testFacts())
		assert.Equal(t, OutcomeCanceled, res.Outcome)
		assert.NoFileExists(t, marker)
	})
}

// TestCommandHugeOutput: an agent printing far more than the tails keep
// leaves memory bounded, and the tails and the report survive.
// Not parallel, so that the allocation count is this test's own.
func TestCommandHugeOutput(t *testing.T) {
	const outMiB, errMiB = 96, 32
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	res := Run(context.Background(), Spec{Command: helperCommand(t, "flood", "96", "32"), Timeout: 60 * time.Second}, testFacts())
	runtime.ReadMemStats(&after)
	require.Equal(t, OutcomeOK, res.Outcome, "err: %v", res.Err)
	require.NotNil(t, res.Reward)
	assert.Equal(t, 1.0, *res.Reward)
	assert.Len(t, res.StdoutTail, DefaultTailBytes)
	assert.Len(t, res.StderrTail, DefaultTailBytes)
	assert.True(t, strings.HasSuffix(res.StdoutTail, "x\n{\"reward\": 1}\n"))
	assert.True(t, strings.HasSuffix(res.StderrTail, "x\nstderr end\n"))
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("allocated %d KiB for %d MiB of output", allocated>>10, outMiB+errMiB)
	assert.Less(t, allocated, uint64(16<<20), "allocated %d bytes for %d MiB of output", allocated, outMiB+errMiB)
}

// TestCommandRedactsKey: an agent echoing its key gets it masked in the
// tails (also where the tail cut it in two) and never in Err.
func TestCommandRedactsKey(t *testing.T) {
	t.Parallel()
	res := Run(context.Background(), Spec{
		Command: script(t, `echo "key=$OPENAI_API_KEY" >&2; echo "using $OPENAI_API_KEY"; printf '%s\n' "$OPENAI_API_KEY" >&2; exit 1`),
		Timeout: 2 * time.Second,
	}, testFacts())
	assert.Equal(t, OutcomeAgentError, res.Outcome)
	assert.NotContains(t, res.StdoutTail, testKey)
	assert.NotContains(t, res.StderrTail, testKey)
	assert.Contains(t, res.StdoutTail, redacted)
	assert.NotContains(t, res.Err.Error(), testKey)

	// The tail keeps the key's last 10 bytes and what follows.
	res = Run(context.Background(), Spec{
		Command:   script(t, `printf '%s0123456789' "$OPENAI_API_KEY"`),
		Timeout:   2 * time.Second,
		TailBytes: 20,
	}, testFacts())
	assert.Equal(t, OutcomeOK, res.Outcome, "err: %v", res.Err)
	assert.Equal(t, redacted+"0123456789", res.StdoutTail)
}

// TestCommandOnStart: the caller learns the agent's pid (the agent's own
// $$) while the agent runs; an agent that cannot start reports none.
func TestCommandOnStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		argv    []string
		started bool
	}{
		{name: "started", argv: script(t, `echo "{\"reward\": $$}"`), started: true},
		{name: "cannot start", argv: []string{filepath.Join(t.TempDir(), "no-such-agent")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			facts := testFacts()
			var pids []int // OnStart runs on Run's goroutine, before it returns
			facts.OnStart = func(pid int) { pids = append(pids, pid) }
			res := Run(context.Background(), Spec{Command: tc.argv, Timeout: 5 * time.Second, TempRoot: t.TempDir()}, facts)
			if !tc.started {
				assert.Empty(t, pids)
				return
			}
			require.Equal(t, OutcomeOK, res.Outcome, "err: %v", res.Err)
			require.Len(t, pids, 1)
			require.NotNil(t, res.Reward)
			assert.Equal(t, float64(pids[0]), *res.Reward, "the pid is the agent's own")
		})
	}
}
