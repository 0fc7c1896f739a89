package train

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/agent"
	"github.com/ortrain/ortrain/internal/agentrollout"
	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/gateway"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/rollout"
)

// newRollouts builds what plays the run's rollouts: ortrain's own turn
// loop, or the user's agent (agent: section) through the gateway.
func newRollouts(cfg *config.Config, envList []*runEnv, gen engine.Generator, chatSpec rollout.ChatSpec, modelDir string, log zerolog.Logger) (rolloutRunner, error) {
	if !cfg.Agent.Enabled() {
		return newRunner(cfg, envList, gen, chatSpec, log)
	}
	if err := checkAgent(cfg); err != nil {
		return nil, err
	}
	// An agent's prompt is bounded by the model's context: a longer one is
	// refused (context_length_exceeded) before it costs the engine memory.
	mc, err := model.LoadConfig(modelDir)
	if err != nil {
		return nil, fmt.Errorf("agent gateway: the model's context: %w", err)
	}
	openers := make([]rollout.Opener, len(envList))
	names := make([]string, len(envList))
	for i, e := range envList {
		openers[i], names[i] = e.Conn, e.Key
	}
	format := chat.FormatNone
	if chatSpec.Format != nil {
		format = *chatSpec.Format
	}
	g := cfg.GRPO
	return agentrollout.New(openers, gen, agentrollout.Options{
		Agent: agent.Spec{Command: absoluteArgs(cfg.Agent.Command), URL: cfg.Agent.URL, Timeout: cfg.Rollout.EpisodeTimeout, KillGrace: cfg.Agent.KillGrace,
			Env: cfg.Agent.Env, InheritEnv: cfg.Agent.InheritEnv},
		Gateway: gateway.Options{
			Model: cfg.Agent.ModelName, Tokenizer: chatSpec.Tokenizer, Template: chatSpec.Template, Kwargs: chatSpec.Kwargs, Format: format,
			// Every call samples with the run's settings and at most the
			// run's completion budget, whatever the agent asks for: the loss
			// assumes the log-probs came from this sampler.
			Defaults: gateway.Defaults{
				MaxTokens: g.MaxCompletionLength, MaxTokensCap: g.MaxCompletionLength, ForceSampling: true,
				Sampling: engine.SamplingParams{Temperature: g.Temperature, TopP: g.TopP, TopK: g.TopK, MinP: g.MinP},
			},
			CallTimeout: cfg.Engine.GenerateTimeout,
			MaxModelLen: mc.MaxPositionEmbeddings,
		},
		MaxCompletionTokens: g.MaxCompletionLength,
		Listen:              cfg.Agent.Listen,
		EnvNames:            names,
		SystemPrompt:        cfg.Chat.SystemPrompt,
		MaxConcurrency:      cfg.Rollout.MaxConcurrency,
		ToolAnnotations:     cfg.Agent.ToolAnnotations.MCP(),
		CallTimeout:         cfg.Rollout.CallTimeout,
		Logger:              log.With().Str("component", "agent").Logger(),
	})
}

// closeRollouts releases what newRollouts started (the agent gateway's
// listener); ortrain's own runner holds nothing.
func closeRollouts(r rolloutRunner) {
	if c, ok := r.(io.Closer); ok {
		_ = c.Close()
	}
}

// absoluteArgs makes the relative arguments that name existing files
// absolute: the agent runs in its own temporary directory, so
// [python3, agents/my_agent.py] would not find its script there.
func absoluteArgs(argv []string) []string {
	out := make([]string, len(argv))
	for i, a := range argv {
		out[i] = a
		if a == "" || filepath.IsAbs(a) || strings.HasPrefix(a, "-") {
			continue
		}
		if _, err := os.Stat(a); err == nil {
			if abs, err := filepath.Abs(a); err == nil {
				out[i] = abs
			}
		}
	}
	return out
}

// checkAgent refuses an agent program that is not there: every rollout
// would otherwise fail agent_error; it is said once, before the run (and
// by --dry-run).
func checkAgent(cfg *config.Config) error {
	if len(cfg.Agent.Command) == 0 {
		return nil
	}
	if _, err := exec.LookPath(cfg.Agent.Command[0]); err != nil {
		return &config.FieldError{Field: "agent.command", Value: cfg.Agent.Command,
			Allowed: fmt.Sprintf("a program on PATH or the path of an executable (%v)", err)}
	}
	return nil
}
