package train

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/chat"
	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/model"
	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
	"github.com/ortrain/ortrain/internal/rollout"
)

// Env is one configured environment, connected.
type Env struct {
	Config  config.EnvConfig
	Name    string // for metrics: the built-in name, the catalog name or the URL host
	URL     string
	Client  *ors.Client
	Indices []int
	// Server is set for builtin: targets served in-process (its Stats count sessions).
	Server *orsserver.Server
	stop   func(context.Context) error
}

// BuiltinPrefix marks a built-in env served in-process on loopback.
const BuiltinPrefix = "builtin:"

// ConnectEnvs resolves every env target, serves builtin ones on loopback,
// and discovers each env's task indices. Close the returned envs.
func ConnectEnvs(ctx context.Context, cfgs []config.EnvConfig, getenv func(string) string, log zerolog.Logger) ([]*Env, error) {
	var out []*Env
	fail := func(err error) ([]*Env, error) {
		CloseEnvs(out)
		return nil, err
	}
	for i, ec := range cfgs {
		e := &Env{Config: ec, Name: ec.Target}
		if name, ok := strings.CutPrefix(ec.Target, BuiltinPrefix); ok {
			// The server outlives ctx (setup's), so it is stopped by Close.
			url, srv, stop, err := envs.ServeLocal(context.WithoutCancel(ctx), name, orsserver.Options{Logger: log.With().Str("env", name).Logger()})
			if err != nil {
				return fail(fmt.Errorf("envs[%d]: serve built-in env %q: %w (built-ins: %s)", i, name, err, strings.Join(envs.Names(), ", ")))
			}
			e.Name, e.URL, e.Server, e.stop = name, url, srv, stop
		} else {
			e.URL = ec.Target
		}
		out = append(out, e)
		c, err := ors.NewClient(e.URL, ors.Options{Getenv: getenv, Logger: log.With().Str("env", e.Name).Logger()})
		if err != nil {
			return fail(fmt.Errorf("envs[%d] target %q: %w", i, ec.Target, err))
		}
		e.Client = c
		if e.Server == nil {
			if d := c.Deployment(); d != "" {
				e.Name = d
			}
		}
		if e.Indices, err = discoverIndices(ctx, c, ec); err != nil {
			return fail(fmt.Errorf("envs[%d] %s: %w", i, e.Name, err))
		}
	}
	return out, nil
}

// discoverIndices returns the task indices to draw from: the configured
// indices (checked against the split size), the first num_tasks, or all.
func discoverIndices(ctx context.Context, c *ors.Client, ec config.EnvConfig) ([]int, error) {
	n, err := c.NumTasks(ctx, ec.Split)
	if err != nil {
		return nil, fmt.Errorf("count tasks of split %q: %w", ec.Split, err)
	}
	if len(ec.Indices) > 0 {
		for _, idx := range ec.Indices {
			if idx >= n {
				return nil, fmt.Errorf("task index %d is out of range: split %q has %d tasks (0..%d)", idx, ec.Split, n, n-1)
			}
		}
		return append([]int(nil), ec.Indices...), nil
	}
	if ec.NumTasks > 0 {
		n = min(n, ec.NumTasks)
	}
	if n == 0 {
		return nil, fmt.Errorf("split %q has no tasks", ec.Split)
	}
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out, nil
}

// CloseEnvs stops in-process env servers.
func CloseEnvs(es []*Env) {
	for _, e := range es {
		if e.Client != nil {
			e.Client.CloseIdleConnections()
		}
		if e.stop != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_ = e.stop(ctx)
			cancel()
		}
	}
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
	}
	return spec, nil
}
