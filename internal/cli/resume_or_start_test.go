package cli

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestResumeOrStart: a directory with a complete checkpoint is resumed; one
// without (never started, or stopped before its first checkpoint, an
// incomplete one included) is started afresh; with --resume or
// --overwrite it is a usage error.
func TestResumeOrStart(t *testing.T) {
	cases := []struct {
		name          string
		setup         func(dir string)
		resume, fresh bool
	}{
		{"no directory", func(string) {}, false, true},
		{"an attempt that saved nothing", func(dir string) {
			require.NoError(t, os.MkdirAll(dir, 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(dir, "config.yaml"), []byte("seed: 1\n"), 0o644))
		}, false, true},
		{"only an incomplete checkpoint", func(dir string) {
			require.NoError(t, os.MkdirAll(filepath.Join(dir, "checkpoints", "step-000002"), 0o755))
		}, false, true},
		{"a complete checkpoint", func(dir string) {
			ck := filepath.Join(dir, "checkpoints", "step-000002")
			require.NoError(t, os.MkdirAll(ck, 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(ck, "DONE"), nil, 0o644))
		}, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "run")
			tc.setup(dir)
			opts := &RunOptions{Logger: zerolog.Nop()}
			require.NoError(t, chooseResumeOrStart(opts, dir))
			assert.Equal(t, tc.resume, opts.Resume)
			assert.Equal(t, tc.fresh, opts.Overwrite)
		})
	}
	for _, extra := range []string{"--resume", "--overwrite"} {
		code, _, errOut := execCLI(t, nil, "run", "--resume-or-start", extra, "--output-dir", t.TempDir())
		assert.Equal(t, ExitUsage, code, errOut)
		assert.Contains(t, errOut, "--resume-or-start decides")
	}
}

// TestResumeCommand: an interrupted run says how to continue it, with
// its own flags and --resume instead of what chose a fresh start.
func TestResumeCommand(t *testing.T) {
	assert.Equal(t, "bin/ortrain run --config=my.yaml --max-steps=5 --resume",
		resumeCommand("bin/ortrain", []string{"run", "--config=my.yaml", "--overwrite=true", "--max-steps=5", "--interrupt-after=2"}))
	assert.Equal(t, "ortrain run '--env=a b' --resume", resumeCommand("", []string{"run", "--env=a b", "--resume-or-start=true"}))
}
