package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Environment variables a command agent is given.
const (
	EnvBaseURL   = "OPENAI_BASE_URL"
	EnvAPIKey    = "OPENAI_API_KEY"
	EnvModel     = "ORTRAIN_MODEL"
	EnvTask      = "ORTRAIN_TASK"
	EnvMCPURL    = "ORTRAIN_MCP_URL"
	EnvRolloutID = "ORTRAIN_ROLLOUT_ID"
	// Anthropic's clients append /v1/messages to their base URL and send
	// the key as x-api-key (ANTHROPIC_AUTH_TOKEN: as a bearer).
	EnvAnthropicBaseURL   = "ANTHROPIC_BASE_URL"
	EnvAnthropicAPIKey    = "ANTHROPIC_API_KEY"
	EnvAnthropicAuthToken = "ANTHROPIC_AUTH_TOKEN"
)

const (
	// outputDrainWait bounds reading what is left in the output pipes once
	// the agent's group has ended; only a process that left the group (setsid)
	// can hold them open longer.
	outputDrainWait = time.Second
	// reapWait bounds waiting for SIGKILLed processes to die (one stuck in
	// uninterruptible sleep does not hold Run up).
	reapWait = 2 * time.Second
	// groupPoll is how often a stopping group is checked for survivors.
	groupPoll = 20 * time.Millisecond
)

// runCommand runs a command agent in a fresh temporary directory and its own
// process group. childproc is not used: it has no working directory option,
// merges stdout into stderr and keeps only error-like lines, while the reward
// is read from stdout's last line.
func runCommand(ctx context.Context, spec Spec, facts Facts) Result {
	task, err := facts.taskJSON()
	if err != nil {
		return Result{Outcome: OutcomeAgentError, ExitCode: -1, Err: err}
	}
	argv0, err := programPath(spec.Command[0])
	if err != nil {
		return Result{Outcome: OutcomeAgentError, ExitCode: -1, Err: err}
	}
	dir, err := os.MkdirTemp(spec.TempRoot, "ortrain-agent-")
	if err != nil {
		return Result{Outcome: OutcomeAgentError, ExitCode: -1, Err: fmt.Errorf("agent working directory: %w", err)}
	}
	// Deferred first, so they run last: after the whole group is gone, the
	// directory, then its owner record (stale.go).
	defer os.Remove(dir + ownerSuffix)
	defer removeTree(dir)
	if err := writeOwner(dir, facts.RolloutID); err != nil {
		return Result{Outcome: OutcomeAgentError, ExitCode: -1, Err: fmt.Errorf("agent owner record: %w", err)}
	}

	outR, outW, err := os.Pipe()
	if err != nil {
		return Result{Outcome: OutcomeAgentError, ExitCode: -1, Err: fmt.Errorf("agent stdout pipe: %w", err)}
	}
	defer outR.Close()
	errR, errW, err := os.Pipe()
	if err != nil {
		outW.Close()
		return Result{Outcome: OutcomeAgentError, ExitCode: -1, Err: fmt.Errorf("agent stderr pipe: %w", err)}
	}
	defer errR.Close()

	cmd := exec.Command(argv0, spec.Command[1:]...)
	cmd.Dir = dir
	cmd.Env = agentEnv(os.Environ(), spec, facts, string(task))
	// Files, not writers: Wait then returns when the leader exits instead of
	// waiting for every holder of the pipes, and this function drains them.
	cmd.Stdout, cmd.Stderr = outW, errW
	// Pdeathsig: an agent does not outlive ortrain if ortrain is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	startErr := cmd.Start()
	outW.Close()
	errW.Close()
	if startErr != nil {
		return Result{Outcome: OutcomeAgentError, ExitCode: -1, Err: fmt.Errorf("start agent %s: %w", spec.Command[0], startErr)}
	}
	pgid := cmd.Process.Pid
	if facts.OnStart != nil {
		facts.OnStart(pgid)
	}

	stdout := newStream(spec.tailBytes(), true)
	stderr := newStream(spec.tailBytes(), false)
	stdoutDone, stderrDone := make(chan error, 1), make(chan error, 1)
	go func() { stdoutDone <- stdout.readFrom(outR) }()
	go func() { stderrDone <- stderr.readFrom(errR) }()
	leaderDone := make(chan struct{})
	var waitErr error // written before leaderDone is closed
	go func() {
		waitErr = cmd.Wait()
		close(leaderDone)
	}()

	runCtx, cancel := context.WithTimeout(ctx, spec.Timeout)
	defer cancel()
	var stopped Outcome // set when the run was cut short
	select {
	case <-leaderDone:
	case <-runCtx.Done():
		if !closed(leaderDone) { // an agent that just finished keeps its result
			stopped = endedBy(ctx)
		}
	}
	// Also after a normal exit: whatever the agent left running in its group
	// is stopped, so nothing outlives the rollout or holds the pipes.
	stopGroup(pgid, leaderDone, spec.killGrace())

	// The group is gone; give the readers what is buffered, then cut them off.
	deadline := time.Now().Add(outputDrainWait)
	_ = outR.SetReadDeadline(deadline)
	_ = errR.SetReadDeadline(deadline)
	// A read error here only means a process outside the group still held a
	// pipe; the report is judged on what was read.
	<-stdoutDone
	<-stderrDone

	res := Result{
		ExitCode:   -1,
		StdoutTail: stdout.tail.String(),
		StderrTail: stderr.tail.String(),
	}
	leaderExited := closed(leaderDone)
	if leaderExited && cmd.ProcessState != nil {
		res.ExitCode = cmd.ProcessState.ExitCode()
	}
	switch {
	case stopped != "":
		res.Outcome, res.Err = stopped, stopError(ctx, spec.Timeout)
	case !leaderExited:
		// The leader was not reaped within reapWait of SIGKILL (stuck in
		// uninterruptible sleep); its Wait goroutine is left to finish.
		res.Outcome = OutcomeAgentError
		res.Err = errors.New("agent did not exit after SIGKILL")
	case waitErr != nil:
		res.Outcome = OutcomeAgentError
		res.Err = exitError(waitErr)
	default:
		line, cut := stdout.line.final()
		reward, err := parseReportLine(line, cut)
		if err != nil {
			res.Outcome, res.Err = OutcomeBadOutput, err
			break
		}
		res.Outcome, res.Reward = OutcomeOK, reward
	}
	return res
}

// stopError says why a run was cut short: the caller's cancel or deadline,
// else the agent's own timeout.
func stopError(callerCtx context.Context, timeout time.Duration) error {
	if err := callerCtx.Err(); err != nil {
		return fmt.Errorf("agent stopped by the caller: %w", context.Cause(callerCtx))
	}
	return fmt.Errorf("agent timed out after %s", timeout)
}

// exitError describes how the leader ended without repeating its output.
func exitError(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return fmt.Errorf("agent killed by signal %s", ws.Signal())
		}
		return fmt.Errorf("agent exited with status %d", ee.ExitCode())
	}
	return fmt.Errorf("wait for agent: %w", err)
}

// programPath makes a relative program path absolute against ortrain's
// working directory; the agent's own directory is a fresh temporary one.
func programPath(prog string) (string, error) {
	if !strings.ContainsRune(prog, filepath.Separator) || filepath.IsAbs(prog) {
		return prog, nil
	}
	abs, err := filepath.Abs(prog)
	if err != nil {
		return "", fmt.Errorf("agent.command: resolve %s: %w", prog, err)
	}
	return abs, nil
}

// agentEnv is the allow-listed part of the parent's environment (env.go),
// the variables spec sets, and the facts. Every name the facts may set is
// first removed, so a stale ORTRAIN_MCP_URL of the parent is not passed on
// when this rollout has no MCP server.
func agentEnv(parent []string, spec Spec, facts Facts, task string) []string {
	env := make([]string, 0, 32)
	keep := func(kv string) {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case EnvBaseURL, EnvAPIKey, EnvModel, EnvTask, EnvMCPURL, EnvRolloutID, EnvAnthropicBaseURL, EnvAnthropicAPIKey, EnvAnthropicAuthToken:
			return
		}
		env = append(env, kv)
	}
	for _, kv := range parent {
		if name, _, _ := strings.Cut(kv, "="); inherited(name, spec.InheritEnv) {
			keep(kv)
		}
	}
	for _, kv := range spec.Env {
		keep(kv)
	}
	env = append(env,
		EnvBaseURL+"="+facts.BaseURL,
		EnvAPIKey+"="+facts.APIKey,
		EnvAnthropicBaseURL+"="+facts.AnthropicBaseURL(),
		EnvAnthropicAPIKey+"="+facts.APIKey,
		EnvModel+"="+facts.Model,
		EnvTask+"="+task,
		EnvRolloutID+"="+facts.RolloutID,
	)
	if facts.MCPURL != "" {
		env = append(env, EnvMCPURL+"="+facts.MCPURL)
	}
	return env
}

// stopGroup ends every process of group pgid: nothing to do if none is
// left, else SIGTERM, and SIGKILL once grace has passed with any still
// alive. It returns once the leader is reaped and the group is empty, or
// reapWait after the SIGKILL.
func stopGroup(pgid int, leaderDone <-chan struct{}, grace time.Duration) {
	gone := func() bool { return closed(leaderDone) && !groupAlive(pgid) }
	if gone() {
		return
	}
	signalGroup(pgid, syscall.SIGTERM)
	// A stopped (SIGSTOP) member acts on SIGTERM only once continued.
	signalGroup(pgid, syscall.SIGCONT)
	if waitUntil(gone, leaderDone, grace) {
		return
	}
	signalGroup(pgid, syscall.SIGKILL)
	waitUntil(gone, leaderDone, reapWait)
}

// waitUntil polls done until it holds or d has passed; leader wakes it early.
func waitUntil(done func() bool, leader <-chan struct{}, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	tick := time.NewTicker(groupPoll)
	defer tick.Stop()
	for !done() {
		if closed(leader) {
			leader = nil // a closed channel would make the select spin
		}
		select {
		case <-timer.C:
			return done()
		case <-tick.C:
		case <-leader:
		}
	}
	return true
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// signalGroup sends sig to every process of group pgid, but only while the
// group has a live member: once it is empty its id may be reused.
func signalGroup(pgid int, sig syscall.Signal) {
	if groupAlive(pgid) {
		_ = syscall.Kill(-pgid, sig)
	}
}

// removeTree removes the agent's directory, first making its directories
// writable again in case the agent made them read-only.
func removeTree(dir string) {
	if os.RemoveAll(dir) == nil {
		return
	}
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(path, 0o700)
		}
		return nil
	})
	_ = os.RemoveAll(dir)
}
