package report

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// WriteFile generates the report of runDir into out, atomically (temp file
// and rename), so a browser reloading it never sees half a page.
func WriteFile(ctx context.Context, runDir, out string, opts Options) error {
	var buf bytes.Buffer
	if err := Generate(ctx, runDir, &buf, opts); err != nil {
		return err
	}
	if dir := filepath.Dir(out); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create report dir: %w", err)
		}
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		tmp.Close()
		return fmt.Errorf("write report: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return fmt.Errorf("publish report: %w", err)
	}
	return nil
}

// fingerprint describes the run's inputs by size and mtime; the report is
// regenerated when it changes.
func fingerprint(runDir string) string {
	var b bytes.Buffer
	stat := func(p string) {
		if st, err := os.Stat(p); err == nil {
			fmt.Fprintf(&b, "%s:%d:%d;", p, st.Size(), st.ModTime().UnixNano())
		}
	}
	for _, f := range []string{metricsFile, trajectoriesFile, manifestFile} {
		stat(filepath.Join(runDir, f))
	}
	entries, _ := os.ReadDir(filepath.Join(runDir, evalDir))
	for _, e := range entries {
		stat(filepath.Join(runDir, evalDir, e.Name(), evalResultFile))
	}
	return b.String()
}

// Watch writes the report now and again whenever the run's files change,
// checking every interval, until ctx is done; it then returns nil.
// onWrite is called after each attempt with its error (nil on success); an
// attempt that fails (say, a half-created run directory) does not stop the
// watch. Watch returns an error only for a bad interval.
func Watch(ctx context.Context, runDir, out string, interval time.Duration, opts Options, onWrite func(error)) error {
	if interval <= 0 {
		return errors.New("watch interval must be positive")
	}
	last := ""
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		if fp := fingerprint(runDir); fp != last {
			err := WriteFile(ctx, runDir, out, opts)
			if ctx.Err() != nil {
				return nil
			}
			if err == nil {
				last = fp
			}
			if onWrite != nil {
				onWrite(err)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}
