package train

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/config"
)

// Check loads what a run would load — the model, its tokenizer and chat
// template, every env and the tools the config names, the worker with the
// model, vLLM when engine.kind is vllm — and checks output_dir as the run
// would (for --dry-run). It creates nothing: a model the preset would
// create is made in a temporary directory. report is called after each
// part that passed.
func Check(ctx context.Context, cfg *config.Config, ro RunOptions, report func(part, detail string)) error {
	if _, err := planRunChecks(cfg, ro); err != nil {
		return err
	}
	report("output", cfg.OutputDir)
	set, err := compileRewards(cfg)
	if err != nil {
		return err
	}
	report("rewards", strings.Join(set.Names(), ", "))
	probe := *cfg
	if _, err := os.Stat(cfg.Model); cfg.InitModelPreset != "" && errors.Is(err, os.ErrNotExist) {
		tmp, err := os.MkdirTemp("", "ortrain-dry-run-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		probe.Model = filepath.Join(tmp, "model")
	}
	dir, err := PrepareModel(&probe, ro.Getenv, zerolog.Nop())
	if err != nil {
		return err
	}
	if probe.Model != cfg.Model {
		report("model", fmt.Sprintf("%s (would be created from init_model_preset %s)", cfg.Model, cfg.InitModelPreset))
	} else {
		report("model", dir)
	}
	if _, err := LoadChat(dir, cfg.Chat); err != nil {
		return err
	}
	report("tokenizer", "and chat template")
	envList, err := connectEnvs(ctx, cfg.Envs, ro.Getenv, ro.Logger)
	if err != nil {
		return err
	}
	defer closeEnvs(envList)
	if err := checkFinalAnswerTools(ctx, cfg, envList); err != nil {
		return err
	}
	for _, e := range envList {
		report("env", fmt.Sprintf("%s (%s over %s, split %s, %d tasks)", e.Key, e.Config.Target, e.Conn.Protocol(), e.Config.Split, len(e.Indices)))
	}
	if err := checkVLLM(cfg, ro); err != nil {
		return err
	}
	if err := checkAgent(cfg); err != nil {
		return err
	}
	switch {
	case cfg.Agent.URL != "":
		report("agent", cfg.Agent.URL)
	case cfg.Agent.Enabled():
		report("agent", strings.Join(absoluteArgs(cfg.Agent.Command), " "))
	}
	lib, p, err := loadPolicy(ctx, &probe, dir, "", false, ro.Getenv, zerolog.Nop())
	if err != nil {
		return err
	}
	p.m.Close()
	if err := lib.Close(); err != nil {
		return err
	}
	report("worker", "loaded the model on "+cfg.Worker.Device)
	return nil
}

// checkVLLM: with engine.kind vllm and no vllm_urls, the command that
// launches replicas must exist.
func checkVLLM(cfg *config.Config, ro RunOptions) error {
	e := cfg.Engine
	if e.Kind != "vllm" || len(e.VLLMURLs) > 0 {
		return nil
	}
	cmd := e.VLLMCommand
	if len(cmd) == 0 {
		cmd = []string{"vllm"}
	}
	if cmd[0] == "ortrain" || cmd[0] == ro.Executable {
		return nil
	}
	if _, err := exec.LookPath(cmd[0]); err != nil {
		return &config.FieldError{Field: "engine.vllm_command", Value: strings.Join(cmd, " "),
			Allowed: fmt.Sprintf("a command on PATH (%v): install vLLM (pip install vllm), give engine.vllm_urls, or use [ortrain, serve-engine]", err)}
	}
	return nil
}
