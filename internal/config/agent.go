package config

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"
)

// AgentConfig hands the rollouts to the user's own agent (the `agent:`
// section): ortrain opens each rollout's env session, serves the policy to
// the agent as an OpenAI-compatible API and the session's tools as an MCP
// server, runs the agent once per rollout and trains on the token ids its
// model calls sampled. Empty (no command, no url): ortrain's own turn loop.
type AgentConfig struct {
	// Command is run once per rollout (argv, no shell), in a fresh
	// temporary directory and its own process group, with OPENAI_BASE_URL,
	// OPENAI_API_KEY, ORTRAIN_MODEL, ORTRAIN_TASK and ORTRAIN_MCP_URL set.
	// Relative paths among its arguments that name existing files are made
	// absolute when the run starts, since the agent does not run in
	// ortrain's directory.
	Command []string `mapstructure:"command"`
	// URL is an HTTP agent service instead: ortrain POSTs the same facts as
	// JSON per rollout and reads {"reward": ...} back.
	URL string `mapstructure:"url"`
	// ModelName is the model id the agent sends (ORTRAIN_MODEL) and
	// /v1/models lists.
	ModelName string `mapstructure:"model_name"`
	// Listen is the address of the gateway and the MCP server: loopback by
	// default; another address lets agents in remote sandboxes reach them
	// (each rollout still needs its own key).
	Listen string `mapstructure:"listen"`
	// KillGrace is how long the agent's process group has to exit after
	// SIGTERM (at rollout.episode_timeout) before SIGKILL.
	KillGrace time.Duration `mapstructure:"kill_grace"`
	// Env sets variables for the agent ("NAME=VALUE"). InheritEnv names
	// variables of ortrain's environment the agent may see beyond the
	// allow-list (PATH, HOME, the locale, language runtimes' paths,
	// proxies, ORTRAIN_*, OPENAI_*, ANTHROPIC_*): an agent runs what its
	// policy chooses, so the trainer's credentials (OPENREWARD_API_KEY,
	// HF_TOKEN, cloud keys, the envs' token_env) reach it only when named.
	Env        []string `mapstructure:"env"`
	InheritEnv []string `mapstructure:"inherit_env"`
	// ToolAnnotations are MCP tool annotations set on every env tool the
	// agent lists (an env's own annotations win): agents that run tools
	// without asking only when they are marked safe (Codex CLI with
	// approval_policy "never") need read_only: true or destructive: false
	// and open_world: false.
	ToolAnnotations ToolAnnotations `mapstructure:"tool_annotations"`
}

// ToolAnnotations are MCP's tool hints (readOnlyHint, destructiveHint,
// idempotentHint, openWorldHint); unset ones are not sent.
type ToolAnnotations struct {
	ReadOnly    *bool `mapstructure:"read_only"`
	Destructive *bool `mapstructure:"destructive"`
	Idempotent  *bool `mapstructure:"idempotent"`
	OpenWorld   *bool `mapstructure:"open_world"`
}

// MCP returns the annotations under MCP's names (nil when none is set).
func (a ToolAnnotations) MCP() map[string]any {
	out := map[string]any{}
	for name, v := range map[string]*bool{"readOnlyHint": a.ReadOnly, "destructiveHint": a.Destructive,
		"idempotentHint": a.Idempotent, "openWorldHint": a.OpenWorld} {
		if v != nil {
			out[name] = *v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// Enabled reports whether the rollouts are played by an agent.
func (a AgentConfig) Enabled() bool { return len(a.Command) > 0 || a.URL != "" }

func defaultAgent() AgentConfig {
	return AgentConfig{ModelName: "ortrain-policy", Listen: "127.0.0.1:0", KillGrace: 5 * time.Second}
}

func (c *Config) validateAgent() error {
	a := c.Agent
	if !a.Enabled() {
		return nil
	}
	switch {
	case len(a.Command) > 0 && a.URL != "":
		return bad("agent.url", a.URL, "set agent.command or agent.url, not both")
	case len(a.Command) > 0 && strings.TrimSpace(a.Command[0]) == "":
		return bad("agent.command", a.Command, "a program and its arguments, e.g. [python3, agents/my_agent.py]")
	case strings.TrimSpace(a.ModelName) == "":
		return bad("agent.model_name", a.ModelName, "the model id the agent sends, e.g. ortrain-policy")
	case !(a.KillGrace > 0):
		return bad("agent.kill_grace", a.KillGrace, "a positive duration such as 5s")
	case len(c.Envs) == 0:
		return bad("envs", "[]", "at least one env: an agent's tasks come from an env")
	}
	if a.URL != "" {
		u, err := url.Parse(a.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad("agent.url", a.URL, "an http:// or https:// URL of the agent service")
		}
	}
	for i, kv := range a.Env {
		if name, _, ok := strings.Cut(kv, "="); !ok || name == "" || strings.ContainsAny(name, " \t") {
			return bad(fmt.Sprintf("agent.env[%d]", i), kv, "NAME=VALUE, e.g. HF_HOME=/data/hf")
		}
	}
	for i, name := range a.InheritEnv {
		if name == "" || strings.ContainsAny(name, "= \t") {
			return bad(fmt.Sprintf("agent.inherit_env[%d]", i), name, "a variable name, e.g. HF_TOKEN")
		}
	}
	if _, _, err := net.SplitHostPort(a.Listen); err != nil {
		return bad("agent.listen", a.Listen, "host:port, e.g. 127.0.0.1:0 (loopback, any free port)")
	}
	return nil
}
