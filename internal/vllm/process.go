package vllm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// process is one run of a replica's command, in its own process group so
// that stopping it also stops the engine and GPU worker processes it forks.
type process struct {
	cmd    *exec.Cmd
	pgid   int
	done   chan struct{}
	err    error // the exit error; read only after done is closed
	status *StatusWriter
	log    *os.File
}

// startProcess launches argv with env, appending its output to logPath.
func startProcess(argv, env []string, logPath string) (*process, error) {
	if len(argv) == 0 {
		return nil, errors.New("empty replica command")
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open replica log: %w", err)
	}
	fmt.Fprintf(logf, "=== %s: %s\n", time.Now().UTC().Format(time.RFC3339), strings.Join(argv, " "))
	p := &process{done: make(chan struct{}), status: NewStatusWriter(logf, nil), log: logf}
	// The child is not tied to any context: it is stopped explicitly with
	// SIGTERM then SIGKILL to its whole group (exec.CommandContext would kill
	// only the leader).
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.status, p.status
	// A crashed leader is noticed even if a surviving group member still
	// holds its output pipe.
	p.cmd.WaitDelay = 2 * time.Second
	// Pdeathsig frees the GPUs if ortrain itself dies without stopping us.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	p.pgid = p.cmd.Process.Pid
	go func() {
		p.err = p.cmd.Wait()
		p.log.Close()
		close(p.done)
	}()
	return p, nil
}

// exitError describes how the process ended, with its last error lines.
func (p *process) exitError() error {
	msg := "exited"
	if p.err != nil {
		msg = p.err.Error()
	} else {
		msg = "exited with status 0"
	}
	if tail := p.status.Tail(); tail != "" {
		return fmt.Errorf("%s; last error lines:\n%s", msg, tail)
	}
	return errors.New(msg)
}

// stop sends SIGTERM to the group, waits up to grace for the leader, then
// SIGKILLs the group (which also catches children the leader left behind).
func (p *process) stop(grace time.Duration) {
	_ = syscall.Kill(-p.pgid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
	}
	p.kill()
}

// kill SIGKILLs the whole group and waits for the leader to be reaped.
func (p *process) kill() {
	_ = syscall.Kill(-p.pgid, syscall.SIGKILL)
	<-p.done
	// Members of the group that outlived the leader are killed by the same
	// signal; wait briefly until none is left so GPU memory is free before a
	// restart.
	deadline := time.Now().Add(5 * time.Second)
	for groupAlive(p.pgid) && time.Now().Before(deadline) {
		_ = syscall.Kill(-p.pgid, syscall.SIGKILL)
		time.Sleep(20 * time.Millisecond)
	}
}

// groupAlive reports whether any process is left in group pgid.
func groupAlive(pgid int) bool {
	return syscall.Kill(-pgid, 0) == nil
}

// waitReady polls /health until 200, then reads /v1/models. It fails at once
// when the process exits, and after stall without both a healthy answer and
// any output from the child (a slow but progressing load keeps waiting).
func (p *process) waitReady(ctx context.Context, c *Client, stall, poll time.Duration) (*ModelCard, error) {
	start := time.Now()
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, max(poll*5, 2*time.Second))
		err := c.Health(pctx)
		if err == nil {
			var models *ModelList
			models, err = c.Models(pctx)
			if err == nil {
				cancel()
				return &models.Data[0], nil
			}
		}
		cancel()
		last := p.status.LastOutput()
		if last.Before(start) {
			last = start
		}
		if time.Since(last) > stall {
			return nil, fmt.Errorf("not ready after %s (no progress for %s; last health check: %v)", time.Since(start).Round(time.Millisecond), stall, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-p.done:
			return nil, p.exitError()
		case <-tick.C:
		}
	}
}
