package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// helperArg, as the test binary's first argument, makes it act as an agent
// (see helperMain) instead of running the tests.
const helperArg = "ortrain-agent-test-helper"

// testKey is the API key the tests hand agents; it must never come back.
const testKey = "sk-test-0123456789-SECRET"

// slack is what a loaded 2-core machine under -race may add to a deadline.
const slack = 2 * time.Second

func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == helperArg {
		// syscall.Exit, not os.Exit: under -race the latter sleeps a second
		// at exit, which would slow every helper agent down.
		syscall.Exit(helperMain(os.Args[2], os.Args[3:]))
	}
	os.Exit(m.Run())
}

// envReport is what the "env" helper agent writes about what it was given.
type envReport struct {
	Env        map[string]*string `json:"env"`
	Cwd        string             `json:"cwd"`
	CwdEntries int                `json:"cwd_entries"`
}

// helperMain is the test binary acting as an agent.
func helperMain(behaviour string, args []string) int {
	switch behaviour {
	case "env": // args: report path
		rep := envReport{Env: map[string]*string{}}
		for _, name := range []string{EnvBaseURL, EnvAPIKey, EnvModel, EnvTask, EnvMCPURL, EnvRolloutID, "ORTRAIN_AGENT_TEST_KEEP"} {
			if v, ok := os.LookupEnv(name); ok {
				rep.Env[name] = &v
			}
		}
		rep.Cwd, _ = os.Getwd()
		entries, _ := os.ReadDir(".")
		rep.CwdEntries = len(entries)
		b, _ := json.Marshal(rep)
		if err := os.WriteFile(args[0], b, 0o600); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println(`{"reward": 0.5}`)
		return 0
	case "trainer": // args: temp root, script: a trainer running one agent, to be killed
		facts := Facts{RolloutID: "rstale-1", BaseURL: "http://127.0.0.1:1/v1", APIKey: testKey, Model: "policy"}
		Run(context.Background(), Spec{Command: []string{"/bin/sh", "-c", args[1]}, Timeout: time.Minute, TempRoot: args[0]}, facts)
		return 0
	case "flood": // args: MiB to stdout, MiB to stderr
		outMiB, _ := strconv.Atoi(args[0])
		errMiB, _ := strconv.Atoi(args[1])
		line := []byte(strings.Repeat("x", 1023) + "\n")
		chunk := []byte(strings.Repeat(string(line), 64)) // 64 KiB
		for i := 0; i < outMiB*16 || i < errMiB*16; i++ {
			if i < outMiB*16 {
				os.Stdout.Write(chunk)
			}
			if i < errMiB*16 {
				os.Stderr.Write(chunk)
			}
		}
		fmt.Fprintln(os.Stderr, "stderr end")
		fmt.Println(`{"reward": 1}`)
		return 0
	}
	fmt.Fprintf(os.Stderr, "unknown helper behaviour %q\n", behaviour)
	return 2
}

// helperCommand is argv running the test binary as the agent.
func helperCommand(t *testing.T, behaviour string, args ...string) []string {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	return append([]string{exe, helperArg, behaviour}, args...)
}

// script writes a /bin/sh agent and returns argv running it with args.
func script(t *testing.T, body string, args ...string) []string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.sh")
	require.NoError(t, os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o600))
	return append([]string{"/bin/sh", path}, args...)
}

// testFacts are the facts most tests hand their agent.
func testFacts() Facts {
	return Facts{
		RolloutID: "rollout-7",
		BaseURL:   "http://127.0.0.1:1/v1",
		APIKey:    testKey,
		Model:     "policy",
		MCPURL:    "http://127.0.0.1:2/mcp",
		Task:      json.RawMessage(`{"question":"2+2?","id":7}`),
	}
}

// requireEmptyDir checks that no agent working directory was left behind.
func requireEmptyDir(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, entries, "agent working directories left in %s", dir)
}

// processGone reports whether pid has exited (a zombie counts as gone: where
// PID 1 does not reap orphans they stay zombies).
func processGone(pid int) bool {
	_, state, ok := procGroup(pid)
	return !ok || state == 'Z' || state == 'X'
}

// readPids reads the pids an agent script wrote, one a line.
func readPids(t *testing.T, path string) []int {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		require.NoError(t, err)
		pids = append(pids, pid)
	}
	return pids
}
