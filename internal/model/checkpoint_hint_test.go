package model

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMissingCheckpointListsTheSteps: a RUN/checkpoints/step-N path that
// does not exist lists the checkpoints that do, not how to make a model.
func TestMissingCheckpointListsTheSteps(t *testing.T) {
	run := t.TempDir()
	for _, step := range []string{"step-000002", "step-000004"} {
		require.NoError(t, os.MkdirAll(filepath.Join(run, "checkpoints", step, "model"), 0o755))
	}
	missing := filepath.Join(run, "checkpoints", "step-000100", "model")
	_, _, err := Resolve(missing, func(string) string { return "" })
	var nf *NotFoundError
	require.ErrorAs(t, err, &nf)
	assert.Equal(t, []string{filepath.Join(run, "checkpoints", "step-000002", "model"), filepath.Join(run, "checkpoints", "step-000004", "model")}, nf.Steps)
	assert.NotContains(t, err.Error(), "init-model")

	_, _, err = Resolve(filepath.Join(t.TempDir(), "nothing-here"), func(string) string { return "" })
	require.ErrorAs(t, err, &nf)
	assert.Empty(t, nf.Steps)
}
