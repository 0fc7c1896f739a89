// Package memstat reads this process's memory from Linux's /proc: the
// resident set size now, and its peak since the last reset, so a training
// step can report the most memory it held (the number that decides
// whether a run fits a machine).
package memstat

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
)

// ErrUnsupported is returned where /proc/self/status is absent (not Linux).
var ErrUnsupported = errors.New("memory statistics need Linux's /proc/self/status")

// Files are the procfs paths Stats reads and ResetPeak writes; tests point
// them at fixtures.
type Files struct {
	Status, ClearRefs string
}

// Self is this process.
func Self() Files {
	return Files{Status: "/proc/self/status", ClearRefs: "/proc/self/clear_refs"}
}

// Stats are the resident set now (VmRSS) and its peak (VmHWM), in bytes.
type Stats struct {
	RSS, PeakRSS int64
}

// Read returns the process's resident set and its peak.
func (f Files) Read() (Stats, error) {
	b, err := os.ReadFile(f.Status)
	if errors.Is(err, os.ErrNotExist) {
		return Stats{}, ErrUnsupported
	}
	if err != nil {
		return Stats{}, fmt.Errorf("memory statistics: %w", err)
	}
	var s Stats
	found := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		fields := bytes.Fields(sc.Bytes())
		if len(fields) < 2 {
			continue
		}
		var dst *int64
		switch string(fields[0]) {
		case "VmRSS:":
			dst = &s.RSS
		case "VmHWM:":
			dst = &s.PeakRSS
		default:
			continue
		}
		kb, err := strconv.ParseInt(string(fields[1]), 10, 64)
		if err != nil {
			return Stats{}, fmt.Errorf("memory statistics: %s %q: %w", fields[0], fields[1], err)
		}
		*dst = kb << 10
		found++
	}
	if found < 2 {
		return Stats{}, fmt.Errorf("memory statistics: %s has no VmRSS and VmHWM lines", f.Status)
	}
	return s, nil
}

// ResetPeak starts a new peak at the current resident set (Linux 4.0+:
// writing 5 to clear_refs resets VmHWM), so the next Read's PeakRSS is the
// most held since now.
func (f Files) ResetPeak() error {
	if err := os.WriteFile(f.ClearRefs, []byte("5"), 0); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return ErrUnsupported
		}
		return fmt.Errorf("reset peak memory: %w", err)
	}
	return nil
}
