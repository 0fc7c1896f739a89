// Package childproc runs supervised child processes: each in its own
// process group (stopping it stops everything it forked), killed with the
// parent (Pdeathsig), its output appended to a log file while the last
// error-like lines and the time of its last output are remembered for
// readiness stall deadlines and crash reports. vLLM replicas and the local
// ranks of a data-parallel run use it.
package childproc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Process is one run of a command in its own process group.
type Process struct {
	cmd    *exec.Cmd
	pgid   int
	done   chan struct{}
	err    error // the exit error; read only after done is closed
	status *StatusWriter
	log    *os.File
}

// Options describe how a child is started.
type Options struct {
	Argv []string
	Env  []string
	// LogPath receives the child's output (appended, or from empty with
	// Truncate).
	LogPath  string
	Truncate bool
	// Echo, when set, also receives the child's output as it is written.
	Echo io.Writer
}

// Start launches the child.
func Start(o Options) (*Process, error) {
	if len(o.Argv) == 0 {
		return nil, errors.New("empty child command")
	}
	mode := os.O_APPEND
	if o.Truncate {
		mode = os.O_TRUNC
	}
	logf, err := os.OpenFile(o.LogPath, os.O_CREATE|os.O_WRONLY|mode, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open child log: %w", err)
	}
	fmt.Fprintf(logf, "=== %s: %s\n", time.Now().UTC().Format(time.RFC3339), strings.Join(o.Argv, " "))
	var out io.Writer = logf
	if o.Echo != nil {
		out = io.MultiWriter(logf, o.Echo)
	}
	p := &Process{done: make(chan struct{}), status: NewStatusWriter(out, nil), log: logf}
	// The child is not tied to any context: it is stopped explicitly with
	// SIGTERM then SIGKILL to its whole group (exec.CommandContext would kill
	// only the leader).
	p.cmd = exec.Command(o.Argv[0], o.Argv[1:]...)
	p.cmd.Env = o.Env
	p.cmd.Stdout, p.cmd.Stderr = p.status, p.status
	// A crashed leader is noticed even if a surviving group member still
	// holds its output pipe.
	p.cmd.WaitDelay = 2 * time.Second
	// Pdeathsig frees GPUs and ports if ortrain itself dies without
	// stopping its children.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", o.Argv[0], err)
	}
	p.pgid = p.cmd.Process.Pid
	go func() {
		p.err = p.cmd.Wait()
		p.log.Close()
		close(p.done)
	}()
	return p, nil
}

// PGID is the child's process group (and the leader's pid).
func (p *Process) PGID() int { return p.pgid }

// Done is closed once the leader has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is the leader's exit error (nil for status 0); valid after Done.
func (p *Process) Err() error { return p.err }

// LastOutput is when the child last wrote anything.
func (p *Process) LastOutput() time.Time { return p.status.LastOutput() }

// Tail is the child's last error-like lines.
func (p *Process) Tail() string { return p.status.Tail() }

// ExitError describes how the process ended, with its last error lines.
// Valid after Done.
func (p *Process) ExitError() error {
	msg := "exited with status 0"
	if p.err != nil {
		msg = p.err.Error()
	}
	if tail := p.status.Tail(); tail != "" {
		return fmt.Errorf("%s; last error lines:\n%s", msg, tail)
	}
	return errors.New(msg)
}

// Signal sends sig to the whole group.
func (p *Process) Signal(sig syscall.Signal) { _ = syscall.Kill(-p.pgid, sig) }

// Stop sends SIGTERM to the group, waits up to grace for the leader, then
// SIGKILLs the group (which also catches children the leader left behind).
func (p *Process) Stop(grace time.Duration) {
	p.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
	}
	p.Kill()
}

// Kill SIGKILLs the whole group and waits for the leader to be reaped.
func (p *Process) Kill() {
	p.Signal(syscall.SIGKILL)
	<-p.done
	// Members of the group that outlived the leader are killed by the same
	// signal; wait briefly until none is left so GPU memory is free before a
	// restart.
	deadline := time.Now().Add(5 * time.Second)
	for GroupAlive(p.pgid) && time.Now().Before(deadline) {
		p.Signal(syscall.SIGKILL)
		time.Sleep(20 * time.Millisecond)
	}
}

// GroupAlive reports whether any process is left in group pgid.
func GroupAlive(pgid int) bool {
	return syscall.Kill(-pgid, 0) == nil
}
