package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ortrain/ortrain/internal/childproc"
)

// LocalOptions describe the ranks of a single-node run.
type LocalOptions struct {
	NProc int
	// Argv is every rank's command line; Env its base environment (the
	// launcher variables are replaced per rank).
	Argv []string
	Env  []string
	// LogDir receives rank-<i>.log for every rank.
	LogDir string
	// FreshLogs starts every rank's log empty and removes the logs of ranks
	// this launch does not have (run --overwrite); else logs are appended.
	FreshLogs bool
	// MasterPort is rank 0's store port; 0 picks a free one.
	MasterPort int
	// Echo receives rank 0's output as it is written (the others' is in
	// their logs, and their error lines come back in a RankError).
	Echo io.Writer
	// FailGrace is how long the other ranks get, after one failed, between
	// SIGTERM and SIGKILL (default 10s).
	FailGrace time.Duration
	// InterruptGrace is how long ranks get to save and exit after ctx ends
	// and they are sent SIGINT (default 2m), before SIGKILL.
	InterruptGrace time.Duration
}

// RankError says which rank failed first and how.
type RankError struct {
	Rank int
	Code int // exit status; -1 when killed by a signal
	Err  error
}

func (e *RankError) Error() string { return fmt.Sprintf("rank %d failed: %v", e.Rank, e.Err) }
func (e *RankError) Unwrap() error { return e.Err }

// ErrInterrupted is returned when ctx ended and every rank stopped.
var ErrInterrupted = errors.New("interrupted: every rank was stopped")

// launcherVars are replaced in each rank's environment.
var launcherVars = []string{"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT=",
	"SLURM_PROCID=", "SLURM_STEP_ID=", "SLURM_STEPID=", LauncherVar + "="}

// LauncherVar names the launcher that set a rank's RANK family when it was
// not torchrun: ortrain's own --nproc-per-node sets it to "nproc-per-node",
// so logs say what started the ranks.
const LauncherVar = "ORTRAIN_LAUNCHER"

// RankEnv is env with the launcher variables of rank in a world of size
// on this machine.
func RankEnv(env []string, rank, size, port int) []string {
	out := make([]string, 0, len(env)+6)
	for _, kv := range env {
		keep := true
		for _, p := range launcherVars {
			if strings.HasPrefix(kv, p) {
				keep = false
				break
			}
		}
		if keep {
			out = append(out, kv)
		}
	}
	return append(out, "RANK="+strconv.Itoa(rank), "WORLD_SIZE="+strconv.Itoa(size), "LOCAL_RANK="+strconv.Itoa(rank),
		"LOCAL_WORLD_SIZE="+strconv.Itoa(size), "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port), LauncherVar+"=nproc-per-node")
}

// RunLocal starts NProc ranks and supervises them: it returns nil when all
// exit 0; when one fails, the others are stopped (SIGTERM, then SIGKILL
// after FailGrace) and a *RankError names the first; when ctx ends, every
// rank gets SIGINT (rank 0 saves the checkpoint) and InterruptGrace to
// exit, and ErrInterrupted is returned. No rank outlives the call.
func RunLocal(ctx context.Context, o LocalOptions) error {
	if o.NProc < 1 {
		return fmt.Errorf("launch: %d ranks: want at least 1", o.NProc)
	}
	if o.FailGrace <= 0 {
		o.FailGrace = 10 * time.Second
	}
	if o.InterruptGrace <= 0 {
		o.InterruptGrace = 2 * time.Minute
	}
	port := o.MasterPort
	if port == 0 {
		var err error
		if port, err = freePort(); err != nil {
			return err
		}
	}
	procs := make([]*childproc.Process, 0, o.NProc)
	stopAll := func(grace time.Duration) {
		for _, p := range procs {
			p.Stop(grace)
		}
	}
	if o.FreshLogs {
		removeStaleRankLogs(o.LogDir, o.NProc)
	}
	for i := range o.NProc {
		opts := childproc.Options{Argv: o.Argv, Env: RankEnv(o.Env, i, o.NProc, port), LogPath: filepath.Join(o.LogDir, fmt.Sprintf("rank-%d.log", i)), Truncate: o.FreshLogs}
		if i == 0 {
			opts.Echo = o.Echo
		}
		p, err := childproc.Start(opts)
		if err != nil {
			stopAll(o.FailGrace)
			return fmt.Errorf("start rank %d: %w", i, err)
		}
		procs = append(procs, p)
	}
	exited := make(chan int, o.NProc)
	for i, p := range procs {
		go func() { <-p.Done(); exited <- i }()
	}
	for left := o.NProc; left > 0; left-- {
		select {
		case i := <-exited:
			if err := procs[i].Err(); err != nil {
				first := &RankError{Rank: i, Code: exitCode(err), Err: procs[i].ExitError()}
				stopAll(o.FailGrace)
				return first
			}
		case <-ctx.Done():
			for _, p := range procs {
				p.Signal(syscall.SIGINT)
			}
			deadline := time.NewTimer(o.InterruptGrace)
			defer deadline.Stop()
			for ; left > 0; left-- {
				select {
				case <-exited:
				case <-deadline.C:
					left = 1
				}
			}
			stopAll(0)
			return ErrInterrupted
		}
	}
	return nil
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// freePort asks the kernel for a free loopback port for rank 0's store.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port for the rendezvous: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// removeStaleRankLogs deletes rank-<i>.log for i >= nproc: the logs of an
// earlier launch with more ranks.
func removeStaleRankLogs(dir string, nproc int) {
	paths, _ := filepath.Glob(filepath.Join(dir, "rank-*.log"))
	for _, p := range paths {
		var i int
		if _, err := fmt.Sscanf(filepath.Base(p), "rank-%d.log", &i); err == nil && i >= nproc {
			_ = os.Remove(p)
		}
	}
}
