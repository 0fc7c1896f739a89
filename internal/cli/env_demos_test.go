package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/demos"
)

func TestEnvDemosFlags(t *testing.T) {
	tests := []struct {
		args []string
		want EnvDemosOptions
	}{
		{[]string{"lockbox", "--out", "d.jsonl"}, EnvDemosOptions{Target: "builtin:lockbox", Script: "lockbox", N: 256, Out: "d.jsonl", Split: "train", Skill: 1, Concurrency: 8}},
		{[]string{"builtin:lockbox", "--out", "d.jsonl", "--n", "9", "--skill", "0.25", "--seed", "4", "--split", "validation", "--concurrency", "2", "--protocol", "openenv"},
			EnvDemosOptions{Target: "builtin:lockbox", Script: "lockbox", N: 9, Out: "d.jsonl", Split: "validation", Skill: 0.25, Seed: 4, Concurrency: 2, Protocol: "openenv"}},
		{[]string{"builtin:lockbox?tool_latency=5ms", "--out", "d.jsonl"}, EnvDemosOptions{Target: "builtin:lockbox?tool_latency=5ms", Script: "lockbox", N: 256, Out: "d.jsonl", Split: "train", Skill: 1, Concurrency: 8}},
		{[]string{"http://127.0.0.1:9/x", "--script", "lockbox", "--out", "d.jsonl", "--token-env", "TOK"},
			EnvDemosOptions{Target: "http://127.0.0.1:9/x", Script: "lockbox", N: 256, Out: "d.jsonl", Split: "train", Skill: 1, Concurrency: 8, TokenEnv: "TOK"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			deps := SystemDeps()
			deps.IO, _, _ = TestIO()
			var got *EnvDemosOptions
			cmd := newEnvDemosCmd(deps, func(_ context.Context, o *EnvDemosOptions) error { got = o; return nil })
			cmd.SetArgs(tt.args)
			require.NoError(t, cmd.Execute())
			require.NotNil(t, got)
			got.IO, got.Getenv, got.Logger = nil, nil, tt.want.Logger
			assert.Equal(t, tt.want, *got)
		})
	}
}

// readDemos parses a demonstrations file strictly.
func readDemos(t *testing.T, path string) []demos.Record {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var out []demos.Record
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		var r demos.Record
		require.NoError(t, dec.Decode(&r), sc.Text())
		out = append(out, r)
	}
	require.NoError(t, sc.Err())
	return out
}

func TestEnvDemosWritesFile(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "lockbox.jsonl")
	code, stdout, stderr := execCLI(t, nil, "env", "demos", "lockbox", "--n", "20", "--out", out)
	require.Equal(t, ExitOK, code, stderr)
	assert.Empty(t, stdout, "stdout stays clean")
	assert.Contains(t, stderr, out)
	recs := readDemos(t, out)
	require.Len(t, recs, 20)
	for _, r := range recs {
		assert.Equal(t, 1.0, r.Reward)
		require.Len(t, r.Messages, 5)
		assert.Equal(t, "open_envelope", r.Messages[1].ToolCalls[0].Function.Name)
		assert.Equal(t, r.Messages[3].ToolCalls[0].ID, r.Messages[4].ToolCallID)
		require.Len(t, r.Tools, 2)
	}
	first, err := os.ReadFile(out)
	require.NoError(t, err)
	fi, err := os.Stat(out)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), fi.Mode().Perm())

	// The same flags write the same bytes, over the file (atomically: no
	// temporary file is left behind).
	code, _, stderr = execCLI(t, nil, "env", "demos", "lockbox", "--n", "20", "--out", out, "--concurrency", "3")
	require.Equal(t, ExitOK, code, stderr)
	again, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Equal(t, string(first), string(again))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "only the output file")

	// Over OpenEnv, half skill, from the validation tasks.
	mixed := filepath.Join(dir, "mixed.jsonl")
	code, _, stderr = execCLI(t, nil, "env", "demos", "builtin:lockbox", "--protocol", "openenv", "--split", "validation", "--skill", "0", "--n", "10", "--out", mixed)
	require.Equal(t, ExitOK, code, stderr)
	for _, r := range readDemos(t, mixed) {
		require.Len(t, r.Messages, 3, "skill 0: unlock at once")
		assert.Equal(t, "unlock", r.Messages[1].ToolCalls[0].Function.Name)
	}
}

func TestEnvDemosErrors(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "d.jsonl")
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"skill above 1", []string{"lockbox", "--skill", "1.5", "--out", out}},
		{"skill below 0", []string{"lockbox", "--skill", "-0.1", "--out", out}},
		{"n zero", []string{"lockbox", "--n", "0", "--out", out}},
		{"concurrency zero", []string{"lockbox", "--concurrency", "0", "--out", out}},
		{"no out", []string{"lockbox"}},
		{"unknown env", []string{"nope", "--out", out}},
		{"unknown builtin target", []string{"builtin:nope", "--script", "lockbox", "--out", out}},
		{"env without a script", []string{"letters", "--out", out}},
		{"unknown script", []string{"lockbox", "--script", "nope", "--out", out}},
		{"URL without --script", []string{"http://127.0.0.1:9", "--out", out}},
		{"unwritable out", []string{"lockbox", "--n", "1", "--out", filepath.Join(dir, "missing", "d.jsonl")}},
		{"out is a directory", []string{"lockbox", "--n", "1", "--out", dir}},
		{"unknown split", []string{"lockbox", "--n", "1", "--split", "nope", "--out", out}},
		{"bad protocol", []string{"lockbox", "--n", "1", "--protocol", "grpc", "--out", out}},
		{"no args", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := execCLI(t, nil, append([]string{"env", "demos"}, tt.args...)...)
			assert.Equal(t, ExitUsage, code, stderr)
			assert.Empty(t, stdout)
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			assert.Empty(t, entries, "nothing is written")
		})
	}
}

func TestEnvDemosHelp(t *testing.T) {
	code, stdout, stderr := execCLI(t, nil, "env", "demos", "--help")
	require.Equal(t, ExitOK, code, stderr)
	for _, want := range []string{"ortrain sft --config configs/lockbox.yaml --data", "--skill", "--seed", "ortrain env demos lockbox"} {
		assert.Contains(t, stdout, want)
	}
	code, stdout, _ = execCLI(t, nil, "env", "--help")
	require.Equal(t, ExitOK, code)
	assert.Contains(t, stdout, "demos")
}

// TestEnvDemosProgress: on a terminal a progress bar counts the episodes on
// stderr; the file is the same.
func TestEnvDemosProgress(t *testing.T) {
	out := filepath.Join(t.TempDir(), "d.jsonl")
	deps := SystemDeps()
	io, stdout, stderr := TestIO()
	io.SetTTY(false, true)
	deps.IO = io
	deps.Getenv = func(string) string { return "" }
	code := Execute(context.Background(), deps, []string{"env", "demos", "lockbox", "--n", "12", "--concurrency", "2", "--out", out})
	require.Equal(t, ExitOK, code, stderr.String())
	assert.Empty(t, stdout.String())
	assert.Contains(t, stderr.String(), "12/12")
	assert.Len(t, readDemos(t, out), 12)
}
