package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// If ortrain itself is killed (kill -9, the OOM killer), Pdeathsig ends
// each agent's leader but not what the leader started, and no deferred
// cleanup runs. So every command agent leaves an owner record beside its
// working directory (ortrain-agent-XXX.owner: ortrain's pid and start
// time, the rollout id); ReapStale, called when a runner starts, ends the
// processes of every record whose ortrain is gone (found by the rollout id
// in their environment, which also finds those that left the process
// group) and removes the directory and the record.

// ownerSuffix names an agent directory's owner record.
const ownerSuffix = ".owner"

type ownerRecord struct {
	PID       int    `json:"pid"`
	StartTime string `json:"start_time"` // /proc/<pid>/stat field 22
	RolloutID string `json:"rollout_id"`
}

// writeOwner records that this process owns the agent directory dir.
func writeOwner(dir, rolloutID string) error {
	rec := ownerRecord{PID: os.Getpid(), StartTime: procStartTime(os.Getpid()), RolloutID: rolloutID}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return os.WriteFile(dir+ownerSuffix, b, 0o600)
}

// ReapStale ends what agents of dead ortrain processes left behind in
// tempRoot ("" is the system's temporary directory): their processes,
// directories and owner records. It returns how many directories it
// reaped; records of live owners are left alone.
func ReapStale(tempRoot string) (int, error) {
	if tempRoot == "" {
		tempRoot = os.TempDir()
	}
	records, err := filepath.Glob(filepath.Join(tempRoot, "ortrain-agent-*"+ownerSuffix))
	if err != nil {
		return 0, fmt.Errorf("agent: stale directories: %w", err)
	}
	reaped := 0
	for _, path := range records {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		var rec ownerRecord
		if json.Unmarshal(b, &rec) != nil || rec.PID <= 0 {
			continue
		}
		if rec.StartTime != "" && procStartTime(rec.PID) == rec.StartTime {
			continue // its ortrain is alive
		}
		if rec.RolloutID != "" {
			killByRollout(rec.RolloutID)
		}
		removeTree(strings.TrimSuffix(path, ownerSuffix))
		_ = os.Remove(path)
		reaped++
	}
	return reaped, nil
}

// killByRollout SIGKILLs every process whose environment names rolloutID.
func killByRollout(rolloutID string) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	want := []byte(EnvRolloutID + "=" + rolloutID + "\x00")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		if bytes.Contains(append(env, 0), want) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// procStartTime is field 22 of /proc/<pid>/stat (the start time in clock
// ticks since boot), "" when the process is gone: a pid reused by another
// process has another start time.
func procStartTime(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// The command name (field 2) may hold spaces; fields resume after ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return ""
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 20 {
		return ""
	}
	return fields[19]
}
