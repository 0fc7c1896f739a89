package train

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/vllm"
)

// Check loads what a run would load — the model, its tokenizer and chat
// template, every env and the tools the config names, the worker with the
// model, vLLM (the command that launches replicas, or every server of
// engine.vllm_urls with the routes the run uses) — and checks output_dir as
// the run would, its lock included (for --dry-run). It creates nothing: a
// model the preset would create is made in a temporary directory. report
// is called after each part that passed; every part that can be checked is,
// and the error joins every problem found (errors.As finds each).
func Check(ctx context.Context, cfg *config.Config, ro RunOptions, report func(part, detail string)) error {
	var problems []error
	fail := func(part string, err error) { problems = append(problems, fmt.Errorf("%s: %w", part, err)) }
	if _, err := planRunChecks(cfg, ro); err != nil {
		fail("output", err)
	} else {
		report("output", cfg.OutputDir)
	}
	if set, err := compileRewards(cfg); err != nil {
		fail("rewards", err)
	} else {
		report("rewards", strings.Join(set.Names(), ", "))
	}
	dir, cleanup, err := checkModel(cfg, ro, report)
	defer cleanup()
	if err != nil {
		fail("model", err)
	} else if _, err := LoadChat(dir, cfg.Chat); err != nil {
		fail("tokenizer", err)
	} else {
		report("tokenizer", "and chat template")
	}
	if envList, err := connectEnvs(ctx, cfg.Envs, ro.Getenv, ro.Logger); err != nil {
		fail("envs", err)
	} else {
		if err := checkFinalAnswerTools(ctx, cfg, envList); err != nil {
			fail("envs", err)
		}
		for _, e := range envList {
			report("env", fmt.Sprintf("%s (%s over %s, split %s, %d tasks)", e.Key, e.Config.Target, e.Conn.Protocol(), e.Config.Split, len(e.Indices)))
		}
		closeEnvs(envList)
	}
	if err := checkVLLM(cfg, ro); err != nil {
		fail("vllm", err)
	} else if err := checkVLLMServers(ctx, cfg, report); err != nil {
		fail("vllm", err)
	}
	if err := checkAgent(cfg); err != nil {
		fail("agent", err)
	} else {
		switch {
		case cfg.Agent.URL != "":
			report("agent", cfg.Agent.URL)
		case cfg.Agent.Enabled():
			report("agent", strings.Join(absoluteArgs(cfg.Agent.Command), " "))
		}
	}
	if dir != "" {
		probe := *cfg
		probe.Model = dir
		if lib, p, err := loadPolicy(ctx, &probe, dir, "", false, ro.World, ro.Getenv, zerolog.Nop()); err != nil {
			fail("worker", err)
		} else {
			p.m.Close()
			if err := lib.Close(); err != nil {
				fail("worker", err)
			} else {
				report("worker", "loaded the model on "+p.device)
			}
		}
	}
	return errors.Join(problems...)
}

// checkModel finds (or, for init_model_preset, creates in a temporary
// directory) the model the run would load; cleanup removes what it made.
func checkModel(cfg *config.Config, ro RunOptions, report func(part, detail string)) (dir string, cleanup func(), err error) {
	cleanup = func() {}
	probe := *cfg
	if _, err := os.Stat(cfg.Model); cfg.InitModelPreset != "" && errors.Is(err, os.ErrNotExist) {
		tmp, err := os.MkdirTemp("", "ortrain-dry-run-")
		if err != nil {
			return "", cleanup, err
		}
		cleanup = func() { os.RemoveAll(tmp) }
		probe.Model = filepath.Join(tmp, "model")
	}
	dir, err = PrepareModel(&probe, ro.Getenv, zerolog.Nop())
	if err != nil {
		return "", cleanup, err
	}
	if probe.Model != cfg.Model {
		report("model", fmt.Sprintf("%s (would be created from init_model_preset %s)", cfg.Model, cfg.InitModelPreset))
	} else {
		report("model", dir)
	}
	return dir, cleanup, nil
}

// checkVLLMServers probes every server of engine.vllm_urls as a run would
// at start: it lists the model, answers a token-id completion with
// log-probs, and has the routes the weight sync needs. Nothing is paused
// or loaded.
func checkVLLMServers(ctx context.Context, cfg *config.Config, report func(part, detail string)) error {
	e := cfg.Engine
	if e.Kind != "vllm" || len(e.VLLMURLs) == 0 {
		return nil
	}
	needs := vllm.Needs{FullSync: !cfg.GRPO.LoRA.Enabled, LoRA: cfg.GRPO.LoRA.Enabled}
	var problems []error
	for _, u := range e.VLLMURLs {
		c, err := vllm.NewClient(u, nil)
		if err != nil {
			problems = append(problems, err)
			continue
		}
		c = c.WithAPIKey(e.VLLMAPIKey)
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		card, err := vllm.Probe(pctx, c, needs)
		ver, _ := c.Version(pctx)
		cancel()
		if err != nil {
			problems = append(problems, err)
			continue
		}
		if ver == "" {
			ver = "version unknown"
		}
		report("vllm", fmt.Sprintf("%s serves %s (%s)", u, card.ID, ver))
	}
	return errors.Join(problems...)
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
