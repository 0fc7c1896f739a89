package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/ortrain/ortrain/internal/model"
)

// filesCopiedToCheckpoints are the non-weight files of a HF directory that a
// saved model keeps, so transformers and vLLM load it unchanged.
var filesCopiedToCheckpoints = []string{
	"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
	"chat_template.jinja", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json",
}

// chatTemplateFile is the template file transformers and LoadTokenizer
// prefer over tokenizer_config.json's chat_template.
const chatTemplateFile = "chat_template.jinja"

// SaveHF writes the full weights (LoRA merged in) as a Hugging Face
// directory: config.json (torch_dtype set to the saved dtype),
// model.safetensors and the source's tokenizer files (the configured chat
// template file as chat_template.jinja when one is set). The directory appears
// atomically: it is written under a temporary name and renamed.
func (m *Model) SaveHF(ctx context.Context, dir string) error {
	unlock, err := m.begin(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	return m.saveHF(ctx, dir, m.readTensor)
}

// tensorReader reads one tensor of a kind: Model.readTensor, or a stage-3
// group's, which gathers the tensor's unit first.
type tensorReader func(kind TensorKind, t TensorInfo) ([]byte, error)

func (m *Model) saveHF(ctx context.Context, dir string, read tensorReader) error {
	return writeDirAtomic(dir, func(tmp string) error {
		cfg := *m.cfg
		cfg.TorchDType = torchDTypeNames[m.dtype]
		b, err := cfg.Encode()
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(tmp, model.ConfigFile), b, 0o644); err != nil {
			return err
		}
		for _, name := range filesCopiedToCheckpoints {
			src := filepath.Join(m.opts.Dir, name)
			if name == chatTemplateFile && m.opts.ChatTemplatePath != "" {
				src = m.opts.ChatTemplatePath // the template the run rendered with
			}
			if err := copyFile(src, filepath.Join(tmp, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
		return m.writeSafetensorsWith(ctx, filepath.Join(tmp, model.SingleWeightsFile), KindWeight, nil, read)
	})
}

// SavePEFT writes the LoRA adapter as PEFT does: adapter_config.json and
// adapter_model.safetensors with keys
// base_model.model.<module>.lora_{A,B}.weight, and for modules_to_save the
// full weight under base_model.model.<HF name> (PEFT's
// get_peft_model_state_dict strips "modules_to_save.<adapter>." from the
// wrapper's parameter names), e.g. base_model.model.model.norm.weight.
func (m *Model) SavePEFT(ctx context.Context, dir string) error {
	unlock, err := m.begin(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	return m.savePEFT(ctx, dir, m.readTensor)
}

func (m *Model) savePEFT(ctx context.Context, dir string, read tensorReader) error {
	if m.opts.LoRA == nil {
		return fmt.Errorf("save PEFT adapter %s: the model was loaded without LoRA", dir)
	}
	l := m.opts.LoRA
	base, _ := filepath.Abs(m.opts.Dir)
	cfg := map[string]any{
		"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base,
		"r": l.Rank, "lora_alpha": l.Alpha, "lora_dropout": l.Dropout, "target_modules": l.TargetModules,
		"bias": "none", "fan_in_fan_out": false, "inference_mode": true, "init_lora_weights": true,
		"modules_to_save": peftModulesToSave(l.ModulesToSave, m.cfg.TieWordEmbeddings), "use_rslora": false, "use_dora": false,
	}
	return writeDirAtomic(dir, func(tmp string) error {
		b, err := json.MarshalIndent(cfg, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(tmp, "adapter_config.json"), append(b, '\n'), 0o644); err != nil {
			return err
		}
		return m.writeSafetensorsWith(ctx, filepath.Join(tmp, "adapter_model.safetensors"), KindLoRA, nil, read)
	})
}

// SaveHFFromShards writes, as SaveHF does, the full weights of a model
// whose parameters were sharded (ShardParameters), taken from every rank's
// optimizer shard file of the same step (shards[r] is rank r's; at stage 3
// SaveOptimizerShard writes the rank's slice of each parameter next to its
// AdamW state). It needs no collective, so a checkpoint survives a broken
// group, and holds one tensor whole at a time.
func (m *Model) SaveHFFromShards(ctx context.Context, dir string, shards []string) error {
	return m.saveFromShards(ctx, KindWeight, shards, func(read tensorReader) error { return m.saveHF(ctx, dir, read) })
}

// SavePEFTFromShards is SaveHFFromShards for the LoRA adapter (SavePEFT).
func (m *Model) SavePEFTFromShards(ctx context.Context, dir string, shards []string) error {
	return m.saveFromShards(ctx, KindLoRA, shards, func(read tensorReader) error { return m.savePEFT(ctx, dir, read) })
}

// tiedHeadPEFT is the PEFT name of a tied model's trained LM head, which
// is the embedding's copy under a second name.
const tiedHeadPEFT = "base_model.model.lm_head.weight"

func (m *Model) saveFromShards(ctx context.Context, kind TensorKind, shards []string, write func(tensorReader) error) error {
	unlock, err := m.begin(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	params, err := m.tensors(kind, maxTensorName, maxTensorDims)
	if err != nil {
		return err
	}
	sp, err := openShardedParams(shards, params)
	if err != nil {
		return fmt.Errorf("save from the ranks' shards: %w", err)
	}
	defer sp.close()
	return write(func(_ TensorKind, t TensorInfo) ([]byte, error) {
		holder := t.Name
		if t.Name == tiedHeadPEFT && m.cfg.TieWordEmbeddings {
			holder = "base_model.model.model.embed_tokens.weight"
		}
		return sp.read(t.Name, holder)
	})
}

// peftModulesToSave is adapter_config.json's modules_to_save: null when
// none, as PEFT writes it. A tied model's embedding and lm_head are one
// trained matrix, stored under both names, so both are listed: PEFT then
// wraps both modules and loads the same weights into each.
func peftModulesToSave(modules []string, tied bool) []string {
	if len(modules) == 0 {
		return nil
	}
	out := slices.Clone(modules)
	if tied {
		for _, pair := range [][2]string{{"embed_tokens", "lm_head"}, {"lm_head", "embed_tokens"}} {
			if slices.Contains(out, pair[0]) && !slices.Contains(out, pair[1]) {
				out = append(out, pair[1])
			}
		}
	}
	return out
}

// LoadPEFT loads adapter weights written by SavePEFT into a model loaded
// with the same LoRA options (for resume).
func (m *Model) LoadPEFT(ctx context.Context, dir string) error {
	unlock, err := m.begin(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	if m.opts.LoRA == nil {
		return fmt.Errorf("load PEFT adapter %s: the model was loaded without LoRA", dir)
	}
	_, tensors, err := model.ReadSafetensors(filepath.Join(dir, "adapter_model.safetensors"))
	if err != nil {
		return fmt.Errorf("load PEFT adapter: %w", err)
	}
	for _, t := range tensors {
		if err := m.writeTensor(KindLoRA, t); err != nil {
			return fmt.Errorf("load PEFT adapter %s: %w", dir, err)
		}
	}
	return nil
}

// SaveOptimizer writes the AdamW state (moments and step) to path as
// safetensors, atomically, for exact resume.
func (m *Model) SaveOptimizer(ctx context.Context, path string) error {
	unlock, err := m.begin(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	if m.shard != ShardNone {
		return fmt.Errorf("save optimizer state %s: it is sharded over a process group (%s): each rank writes its slice with Group.SaveOptimizerShard and one merges them with MergeOptimizerShards", path, m.shard)
	}
	return m.writeSafetensors(ctx, path, KindOptim, map[string]string{"format": optimizerFormat})
}

// LoadOptimizer restores state written by SaveOptimizer; tensors must match
// the model's trainable tensors by name and shape.
func (m *Model) LoadOptimizer(ctx context.Context, path string) error {
	unlock, err := m.begin(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	_, tensors, err := model.ReadSafetensors(path)
	if err != nil {
		return fmt.Errorf("load optimizer state: %w", err)
	}
	for _, t := range tensors {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := m.writeTensor(KindOptim, t); err != nil {
			return fmt.Errorf("load optimizer state %s: %w", path, err)
		}
	}
	return nil
}

func (m *Model) writeSafetensors(ctx context.Context, path string, kind TensorKind, meta map[string]string) error {
	return m.writeSafetensorsWith(ctx, path, kind, meta, m.readTensor)
}

func (m *Model) writeSafetensorsWith(ctx context.Context, path string, kind TensorKind, meta map[string]string, read tensorReader) error {
	return m.writeSafetensorsFiltered(ctx, path, kind, meta, read, nil)
}

// writeSafetensorsFiltered writes the tensors of kind that keep accepts
// (nil: all).
func (m *Model) writeSafetensorsFiltered(ctx context.Context, path string, kind TensorKind, meta map[string]string, read tensorReader, keep func(string) bool) error {
	all, err := m.tensors(kind, maxTensorName, maxTensorDims)
	if err != nil {
		return err
	}
	infos := all[:0:0]
	for _, t := range all {
		if keep == nil || keep(t.Name) {
			infos = append(infos, t)
		}
	}
	specs := make([]model.TensorSpec, len(infos))
	byName := map[string]TensorInfo{}
	for i, t := range infos {
		specs[i] = model.TensorSpec{Name: t.Name, DType: t.DType, Shape: t.Shape}
		byName[t.Name] = t
	}
	if meta == nil {
		meta = model.DefaultSafetensorsMetadata()
	}
	return model.WriteSafetensorsStream(path, specs, meta, func(s model.TensorSpec, w io.Writer) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		b, err := read(kind, byName[s.Name])
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	})
}

// writeDirAtomic fills a temporary sibling of dir, then swaps it into place,
// so dir is always either the old complete directory or the new one.
func writeDirAtomic(dir string, fill func(tmp string) error) error {
	dir = filepath.Clean(dir)
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("save %s: %w", dir, err)
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".tmp-")
	if err != nil {
		return fmt.Errorf("save %s: %w", dir, err)
	}
	defer os.RemoveAll(tmp)
	if err := fill(tmp); err != nil {
		return fmt.Errorf("save %s: %w", dir, err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("save %s: %w", dir, err)
	}
	var old string
	if _, err := os.Stat(dir); err == nil {
		old = tmp + ".old"
		if err := os.Rename(dir, old); err != nil {
			return fmt.Errorf("save %s: move the previous version aside: %w", dir, err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		if old != "" {
			_ = os.Rename(old, dir)
		}
		return fmt.Errorf("save %s: %w", dir, err)
	}
	if old != "" {
		_ = os.RemoveAll(old)
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
