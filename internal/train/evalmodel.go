package train

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ortrain/ortrain/internal/config"
)

// evalModel is what an eval loads: a model, and for a LoRA run the PEFT
// adapter over it.
type evalModel struct {
	model   string // model directory or Hugging Face repo id
	adapter string // PEFT adapter directory ("" for full weights)
}

// peftConfig is the part of a PEFT adapter_config.json an eval needs.
type peftConfig struct {
	Base          string   `json:"base_model_name_or_path"`
	R             int      `json:"r"`
	Alpha         float64  `json:"lora_alpha"`
	Dropout       float64  `json:"lora_dropout"`
	TargetModules []string `json:"target_modules"`
	ModulesToSave []string `json:"modules_to_save"`
}

// resolveEvalModel reads what cfg.Model names: a run checkpoint
// (RUN/checkpoints/step-N: its model/ or its adapter/), a PEFT adapter
// directory, or a model. A LoRA config whose model is the base evaluates
// the run's latest checkpoint, never the untrained base silently.
func resolveEvalModel(cfg *config.Config) (evalModel, error) {
	path := cfg.Model
	switch {
	case isDir(filepath.Join(path, ckptModelDir)):
		return evalModel{model: filepath.Join(path, ckptModelDir)}, nil
	case isDir(filepath.Join(path, ckptAdapterDir)):
		return evalModel{adapter: filepath.Join(path, ckptAdapterDir)}, nil
	case isFile(filepath.Join(path, "adapter_config.json")):
		return evalModel{adapter: path}, nil
	case cfg.GRPO.LoRA.Enabled:
		ck, _, err := LatestCheckpoint(cfg.OutputDir)
		if errors.Is(err, ErrNoCheckpoint) {
			return evalModel{}, &config.FieldError{Field: "model", Value: path,
				Allowed: fmt.Sprintf("a checkpoint to evaluate: the config trains a LoRA adapter but %s has no checkpoint, so the base model would be evaluated untrained; pass --model RUN/checkpoints/step-N (or turn grpo.lora.enabled off to evaluate the base on purpose)", cfg.OutputDir)}
		}
		if err != nil {
			return evalModel{}, err
		}
		return evalModel{adapter: filepath.Join(ck, ckptAdapterDir)}, nil
	}
	return evalModel{model: path}, nil
}

// configFor returns the config that loads m: the adapter's base model with
// the adapter's LoRA settings, or m's model with LoRA off.
func (m evalModel) configFor(cfg *config.Config) (*config.Config, error) {
	out := *cfg
	out.GRPO.LoRA = cfg.GRPO.LoRA
	if m.adapter == "" {
		out.Model, out.GRPO.LoRA.Enabled = m.model, false
		if m.model != cfg.Model {
			out.InitModelPreset = ""
		}
		return &out, nil
	}
	b, err := os.ReadFile(filepath.Join(m.adapter, "adapter_config.json"))
	if err != nil {
		return nil, fmt.Errorf("read PEFT adapter %s: %w", m.adapter, err)
	}
	var pc peftConfig
	if err := json.Unmarshal(b, &pc); err != nil {
		return nil, fmt.Errorf("read %s: %w", filepath.Join(m.adapter, "adapter_config.json"), err)
	}
	if pc.Base == "" || pc.R <= 0 {
		return nil, fmt.Errorf("PEFT adapter %s: adapter_config.json names no base_model_name_or_path or r", m.adapter)
	}
	out.Model, out.InitModelPreset = pc.Base, ""
	out.GRPO.LoRA = config.LoRAConfig{Enabled: true, Rank: pc.R, Alpha: pc.Alpha, Dropout: pc.Dropout,
		TargetModules: pc.TargetModules, ModulesToSave: pc.ModulesToSave}
	return &out, nil
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}
