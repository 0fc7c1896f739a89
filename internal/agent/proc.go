package agent

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// groupAlive reports whether group pgid has a member that is not a zombie.
// childproc.GroupAlive counts zombies too, and where PID 1 does not reap
// orphans (some containers) a killed grandchild stays a zombie for good.
func groupAlive(pgid int) bool {
	if syscall.Kill(-pgid, 0) != nil {
		return false
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return true // cannot tell zombies apart; the signal probe said alive
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if group, state, ok := procGroup(pid); ok && group == pgid && state != 'Z' && state != 'X' {
			return true
		}
	}
	return false
}

// procGroup reads the process group and state of pid from /proc/pid/stat.
func procGroup(pid int) (pgrp int, state byte, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	fields := bytes.Fields(b[i+1:])
	if len(fields) < 3 || len(fields[0]) != 1 {
		return 0, 0, false
	}
	pgrp, err = strconv.Atoi(string(fields[2]))
	if err != nil {
		return 0, 0, false
	}
	return pgrp, fields[0][0], true
}
