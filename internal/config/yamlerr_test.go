package config

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 23: a YAML syntax error is reported at the line where it is, not
// where the enclosing block began.
func TestYAMLSyntaxErrorLine(t *testing.T) {
	head := "model: models/tiny\ngrpo:\n  max_steps: 3\n"
	for _, tc := range []struct {
		name, line4, want string
	}{
		{"indented less", " learning_rate: 0.1\n", "cfg.yaml:4: not valid YAML"},
		{"a list item in a mapping", "  - x\n", "cfg.yaml:4: not valid YAML"},
		{"a tab", "\tlearning_rate: 0.1\n", "cfg.yaml:4: not valid YAML"},
		{"indented more", "    learning_rate: 0.1\n", "cfg.yaml:4: not valid YAML"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(Source{File: "cfg.yaml", Data: []byte(head + tc.line4)})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	// A valid multi-line flow sequence before the error does not mislead it.
	_, err := Load(Source{File: "cfg.yaml", Data: []byte("envs: [\n  {target: builtin:echo}\n]\ngrpo:\n  max_steps: 3\n - x\n")})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cfg.yaml:6: not valid YAML")
}
