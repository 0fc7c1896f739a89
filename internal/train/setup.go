package train

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/engine"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/reward"
	"github.com/ortrain/ortrain/internal/rollout"
	"github.com/ortrain/ortrain/internal/worker"
)

// stack is what a run and an eval build before rolling out: the model, its
// chat template, the connected envs, the worker with the policy, the
// generation engine and the rollout runner.
type stack struct {
	modelDir string
	chat     rollout.ChatSpec
	envs     []*runEnv
	lib      *worker.Library
	policy   *workerPolicy
	gen      engine.Generator
	runner   *rollout.Runner
	rewards  *reward.Set
}

// stackOptions say what differs between a run and an eval.
type stackOptions struct {
	resumeDir string // load weights and optimizer state from this checkpoint
	reference bool   // keep a frozen reference model (beta > 0)
	getenv    func(string) string
	logger    zerolog.Logger
	// engine builds the generation backend over the loaded policy.
	engine func(ctx context.Context, modelDir string, p *workerPolicy) (engine.Generator, error)
}

// buildStack loads everything in dependency order; on error it releases
// what it had built.
func buildStack(ctx context.Context, cfg *config.Config, so stackOptions) (_ *stack, err error) {
	st := &stack{}
	defer func() {
		if err != nil {
			st.close()
		}
	}()
	if st.rewards, err = compileRewards(cfg); err != nil {
		return nil, err
	}
	if st.modelDir, err = PrepareModel(cfg, so.getenv, so.logger); err != nil {
		return nil, err
	}
	if st.chat, err = LoadChat(st.modelDir, cfg.Chat); err != nil {
		return nil, err
	}
	if st.envs, err = connectEnvs(ctx, cfg.Envs, so.getenv, so.logger); err != nil {
		return nil, err
	}
	if err = checkFinalAnswerTools(ctx, cfg, st.envs); err != nil {
		return nil, err
	}
	if st.lib, st.policy, err = loadPolicy(ctx, cfg, st.modelDir, so.resumeDir, so.reference, so.getenv, so.logger); err != nil {
		return nil, err
	}
	if st.gen, err = so.engine(ctx, st.modelDir, st.policy); err != nil {
		return nil, err
	}
	if st.runner, err = newRunner(cfg, st.envs, st.gen, st.chat, so.logger); err != nil {
		return nil, err
	}
	return st, nil
}

// close releases the stack in reverse order of construction.
func (st *stack) close() {
	if st.gen != nil {
		_ = st.gen.Close()
	}
	if st.policy != nil {
		st.policy.m.Close()
	}
	if st.lib != nil {
		_ = st.lib.Close()
	}
	closeEnvs(st.envs)
}

// PrepareModel resolves the model directory; a missing directory is created
// with init_model_preset when one is configured (the quickstart).
func PrepareModel(cfg *config.Config, getenv func(string) string, log zerolog.Logger) (string, error) {
	if cfg.Model == "" {
		return "", &config.FieldError{Field: "model", Value: "", Allowed: "a model directory or Hugging Face repo id (or init_model_preset to create one)"}
	}
	if cfg.InitModelPreset != "" {
		if _, err := os.Stat(cfg.Model); errors.Is(err, os.ErrNotExist) {
			preset, ok := model.PresetByName(cfg.InitModelPreset)
			if !ok {
				return "", &config.FieldError{Field: "init_model_preset", Value: cfg.InitModelPreset, Allowed: "one of " + strings.Join(model.PresetNames(), ", ")}
			}
			log.Info().Str("dir", cfg.Model).Str("preset", preset.Name).Msg("creating model")
			if err := model.Init(cfg.Model, preset, cfg.Seed); err != nil {
				return "", fmt.Errorf("create model %s: %w", cfg.Model, err)
			}
		}
	}
	dir, searched, err := model.Resolve(cfg.Model, getenv)
	if err != nil {
		if len(searched) > 0 {
			return "", fmt.Errorf("model %q: %w (searched: %s)", cfg.Model, err, strings.Join(searched, ", "))
		}
		return "", fmt.Errorf("model %q: %w", cfg.Model, err)
	}
	return dir, nil
}

// LoadChat loads the tokenizer and chat template of a model directory with
// the configured tool-call format and template kwargs.
func LoadChat(dir string, cc config.ChatConfig) (rollout.ChatSpec, error) {
	tok, err := chat.LoadTokenizer(dir)
	if err != nil {
		return rollout.ChatSpec{}, fmt.Errorf("load tokenizer of %s: %w", dir, err)
	}
	tmpl, err := tok.Template("")
	if err != nil {
		return rollout.ChatSpec{}, fmt.Errorf("chat template of %s: %w (add chat_template to tokenizer_config.json or a chat_template.jinja file)", dir, err)
	}
	spec := rollout.ChatSpec{Tokenizer: tok, Template: tmpl, Kwargs: cc.TemplateKwargs, Policy: chat.KeepSampled, HideTools: !cc.RenderTools}
	if cc.ToolCallFormat != "" && cc.ToolCallFormat != "auto" {
		f, err := chat.ParseToolCallFormat(cc.ToolCallFormat)
		if err != nil {
			return spec, &config.FieldError{Field: "chat.tool_call_format", Value: cc.ToolCallFormat, Allowed: err.Error()}
		}
		spec.Format = &f
		return spec, nil
	}
	// A template whose tool-call format is unknown would leave every call
	// the model writes in its content, silently: refuse at startup.
	f, err := chat.DetectToolCallFormat(tmpl.Source())
	if err != nil {
		return spec, &config.FieldError{Field: "chat.tool_call_format", Value: cc.ToolCallFormat,
			Allowed: fmt.Sprintf("a format set explicitly: the chat template of %s matches none (%v)", dir, err)}
	}
	spec.Format = &f
	return spec, nil
}
