package configs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/config"
)

// Every shipped config loads and validates, so a key renamed in
// internal/config cannot silently break them.
func TestShippedConfigsValidate(t *testing.T) {
	files, err := filepath.Glob("*.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			cfg, err := config.Load(config.Source{File: f})
			require.NoError(t, err)
			assert.NotEmpty(t, cfg.Envs)
		})
	}
	data, err := os.ReadFile("quickstart.yaml")
	require.NoError(t, err)
	assert.Equal(t, data, Quickstart(), "the embedded quickstart is the file")
}
