package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/model"
)

func TestInitModelFlags(t *testing.T) {
	tests := []struct {
		args []string
		want InitModelOptions
	}{
		{[]string{"--out", "m"}, InitModelOptions{Preset: "tiny", Out: "m"}},
		{[]string{"--preset", "small100m", "--out", "x", "--seed", "9", "--force"}, InitModelOptions{Preset: "small100m", Out: "x", Seed: 9, Force: true}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			deps := SystemDeps()
			deps.IO, _, _ = TestIO()
			var got *InitModelOptions
			cmd := newInitModelCmd(deps, func(_ context.Context, o *InitModelOptions) error { got = o; return nil })
			cmd.SetArgs(tt.args)
			require.NoError(t, cmd.Execute())
			require.NotNil(t, got)
			assert.Equal(t, tt.want.Preset, got.Preset)
			assert.Equal(t, tt.want.Out, got.Out)
			assert.Equal(t, tt.want.Seed, got.Seed)
			assert.Equal(t, tt.want.Force, got.Force)
		})
	}
}

func TestInitModelCommand(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "tiny")

	code, out, errOut := execCLI(t, nil, "init-model", "--preset", "tiny", "--out", dir, "--seed", "3", "--log-format", "json")
	require.Equal(t, ExitOK, code, errOut)
	assert.Equal(t, dir+"\n", out, "stdout is only the model path")
	cfg, err := model.LoadConfig(dir)
	require.NoError(t, err)
	assert.Equal(t, "qwen3", cfg.ModelType)
	first, err := model.Hash(dir)
	require.NoError(t, err)

	// A second run without --force is a usage error naming the dir and the flag.
	code, out, errOut = execCLI(t, nil, "init-model", "--out", dir, "--seed", "4")
	assert.Equal(t, ExitUsage, code)
	assert.Empty(t, out)
	assert.Contains(t, errOut, dir)
	assert.Contains(t, errOut, "--force")

	// --force replaces the model.
	code, _, errOut = execCLI(t, nil, "init-model", "--out", dir, "--seed", "4", "--force")
	require.Equal(t, ExitOK, code, errOut)
	second, err := model.Hash(dir)
	require.NoError(t, err)
	assert.NotEqual(t, first, second)

	// --force never replaces a directory that is not a model.
	other := filepath.Join(root, "notes")
	require.NoError(t, os.Mkdir(other, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(other, "a.txt"), []byte("keep"), 0o644))
	code, _, errOut = execCLI(t, nil, "init-model", "--out", other, "--force")
	assert.Equal(t, ExitUsage, code)
	assert.Contains(t, errOut, "holds no config.json")
	b, err := os.ReadFile(filepath.Join(other, "a.txt"))
	require.NoError(t, err)
	assert.Equal(t, "keep", string(b))
}

func TestInitModelUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		msgs []string
	}{
		{"unknown preset", []string{"init-model", "--preset", "huge", "--out", "x"}, []string{`"huge"`, "tiny", "small100m"}},
		{"no out", []string{"init-model", "--preset", "tiny"}, []string{"--out is required"}},
		{"positional arg", []string{"init-model", "extra"}, []string{"unknown command"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := execCLI(t, nil, tt.args...)
			assert.Equal(t, ExitUsage, code, errOut)
			assert.Empty(t, out)
			for _, m := range tt.msgs {
				assert.Contains(t, errOut, m)
			}
			assert.Contains(t, errOut, "ortrain init-model --help")
		})
	}
}

func TestInitModelHelpListsPresets(t *testing.T) {
	code, out, _ := execCLI(t, nil, "init-model", "--help")
	require.Equal(t, ExitOK, code)
	for _, p := range model.Presets() {
		assert.Contains(t, out, p.Name)
		assert.Contains(t, out, p.Description)
	}
	assert.Contains(t, out, "Examples:")
}
