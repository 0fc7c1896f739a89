package config

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestValidateAgent: each bad agent: setting is refused naming its field.
func TestValidateAgent(t *testing.T) {
	base := func() Config {
		c := Default()
		c.Envs = []EnvConfig{{Target: "builtin:lockbox", Split: "train", Weight: 1}}
		return c
	}
	cases := []struct {
		name  string
		edit  func(*Config)
		field string
	}{
		{"command and url", func(c *Config) { c.Agent.Command, c.Agent.URL = []string{"a"}, "http://x" }, "agent.url"},
		{"empty program", func(c *Config) { c.Agent.Command = []string{" "} }, "agent.command"},
		{"url scheme", func(c *Config) { c.Agent.URL = "ftp://x" }, "agent.url"},
		{"no model name", func(c *Config) { c.Agent.Command, c.Agent.ModelName = []string{"a"}, "" }, "agent.model_name"},
		{"no kill grace", func(c *Config) { c.Agent.Command, c.Agent.KillGrace = []string{"a"}, 0 }, "agent.kill_grace"},
		{"listen not host:port", func(c *Config) { c.Agent.Command, c.Agent.Listen = []string{"a"}, "localhost" }, "agent.listen"},
		{"no envs", func(c *Config) { c.Agent.Command, c.Envs = []string{"a"}, nil }, "envs"},
		{"env without a value", func(c *Config) { c.Agent.Command, c.Agent.Env = []string{"a"}, []string{"A=1", "HF_HOME"} }, "agent.env[1]"},
		{"inherit_env with a value", func(c *Config) { c.Agent.Command, c.Agent.InheritEnv = []string{"a"}, []string{"HF_TOKEN=x"} }, "agent.inherit_env[0]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.edit(&c)
			var fe *FieldError
			require.True(t, errors.As(c.validateAgent(), &fe))
			assert.Equal(t, tc.field, fe.Field)
		})
	}
	ok := base()
	ok.Agent.Command = []string{"python3", "agent.py"}
	ok.Async.MaxOffPolicySteps = 1
	assert.NoError(t, ok.validateAgent())
	assert.False(t, base().Agent.Enabled())
	assert.Equal(t, 5*time.Second, base().Agent.KillGrace)
}
