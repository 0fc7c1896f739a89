// Package runlock keeps one live writer per run directory: an exclusive
// OS lock (flock) on DIR/.ortrain.lock, held for the run's life and
// released by the kernel however the process ends, so a crashed run never
// leaves a stale lock. The file records who holds it, so a refused run can
// name the holder.
package runlock

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// FileName is the lock file inside a run directory.
const FileName = ".ortrain.lock"

// Holder is what the lock file says about the process holding it.
type Holder struct {
	PID     int       `json:"pid"`
	Host    string    `json:"host"`
	Command string    `json:"command"`
	Since   time.Time `json:"since"`
}

// HeldError: another live process holds the run directory.
type HeldError struct {
	Dir    string
	Holder Holder // zero when the file could not be read
}

func (e *HeldError) Error() string {
	who := "another process"
	if e.Holder.PID > 0 {
		who = fmt.Sprintf("pid %d on %s (%s, since %s)", e.Holder.PID, e.Holder.Host, e.Holder.Command, e.Holder.Since.Format(time.RFC3339))
	}
	return fmt.Sprintf("%s is in use by a run that is still going: %s holds %s. "+
		"Wait for it to finish or stop it (Ctrl-C, or kill %d), or pick another --output-dir; --overwrite never deletes a live run",
		e.Dir, who, filepath.Join(e.Dir, FileName), e.Holder.PID)
}

// Lock is a held run-directory lock.
type Lock struct {
	f *os.File
}

// Acquire creates dir if needed and takes its lock without waiting; a
// directory another process holds is a *HeldError. command names this
// process's job in the lock file ("run", "sft").
func Acquire(dir, command string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create run directory: %w", err)
	}
	path := filepath.Join(dir, FileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open the run directory's lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			he := &HeldError{Dir: dir}
			if b, rerr := os.ReadFile(path); rerr == nil {
				_ = json.Unmarshal(b, &he.Holder)
			}
			return nil, he
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	host, _ := os.Hostname()
	b, _ := json.Marshal(Holder{PID: os.Getpid(), Host: host, Command: command, Since: time.Now().UTC().Truncate(time.Second)})
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt(append(b, '\n'), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("record the holder in %s: %w", path, err)
	}
	return &Lock{f: f}, nil
}

// Release gives the directory up; nil and a released lock are fine.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	f := l.f
	l.f = nil
	// Closing drops the flock; the file stays (a later run reuses it).
	return f.Close()
}

// Held reports, without taking it, whether a live process holds dir: the
// *HeldError Acquire would give, or nil (free, or never locked). It creates
// nothing, so read-only checks (--dry-run, the earlier-run check) may use it.
func Held(dir string) *HeldError {
	path := filepath.Join(dir, FileName)
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err == nil {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		return nil
	}
	he := &HeldError{Dir: dir}
	if b, err := os.ReadFile(path); err == nil {
		_ = json.Unmarshal(b, &he.Holder)
	}
	return he
}
