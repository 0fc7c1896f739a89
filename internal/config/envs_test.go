package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 23 item 8: config knows no target syntax — which targets take a
// tool latency is envtarget's rule (Resolve refuses it, so --dry-run still
// reports it).
func TestValidateLeavesTargetKindsToTheResolver(t *testing.T) {
	cfg := Default()
	cfg.Envs = []EnvConfig{{Target: "http://127.0.0.1:8080", Split: "train", Weight: 1, ToolLatency: time.Second}}
	require.NoError(t, cfg.Validate())
}

// Issue 23 item 4: token_env names the variable holding an OpenEnv
// server's bearer token.
func TestTokenEnv(t *testing.T) {
	cfg, err := Load(Source{File: writeFile(t, `
envs:
  - target: https://owner-env.hf.space
    token_env: MY_HF_TOKEN
`)})
	require.NoError(t, err)
	assert.Equal(t, "MY_HF_TOKEN", cfg.Envs[0].TokenEnv)
	for _, name := range []string{"HF_TOKEN", "_x", "a1"} {
		cfg.Envs[0].TokenEnv = name
		assert.NoError(t, cfg.Validate(), name)
	}
	for _, name := range []string{"1X", "hf_abcdefGHIJ0123456789", "A B", "$HF_TOKEN"} {
		cfg.Envs[0].TokenEnv = name
		err := cfg.Validate()
		var fe *FieldError
		require.ErrorAs(t, err, &fe, name)
		assert.Equal(t, "envs[0].token_env", fe.Field)
		assert.NotContains(t, err.Error(), name, "a token put here by mistake is not echoed")
	}
}
