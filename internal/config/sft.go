package config

import (
	"math"
	"reflect"
	"slices"
)

// SFTConfig is `ortrain sft`'s section: supervised fine-tuning on chat data
// with TRL's SFTConfig names where they apply. The model, output_dir, seed,
// chat, worker and logging sections are shared with `ortrain run`.
type SFTConfig struct {
	// Data is a JSONL file in TRL's conversational ({"messages", "tools"})
	// or prompt-completion ({"prompt", "completion"}) form (--data).
	Data string `mapstructure:"data"`
	// EvalData is a held-out JSONL file; without it EvalSplit of Data is
	// held out (0: no evaluation).
	EvalData  string  `mapstructure:"eval_data"`
	EvalSplit float64 `mapstructure:"eval_split"`
	// EvalSteps evaluates the held-out rows every that many optimizer steps
	// and after the last (0: only after the last, when there are any).
	EvalSteps int `mapstructure:"eval_steps"`

	LearningRate              float64 `mapstructure:"learning_rate"`
	LRSchedulerType           string  `mapstructure:"lr_scheduler_type"` // constant, linear, cosine
	WarmupSteps               int     `mapstructure:"warmup_steps"`
	WarmupRatio               float64 `mapstructure:"warmup_ratio"`
	NumTrainEpochs            float64 `mapstructure:"num_train_epochs"`
	MaxSteps                  int     `mapstructure:"max_steps"` // > 0 overrides num_train_epochs
	PerDeviceTrainBatchSize   int     `mapstructure:"per_device_train_batch_size"`
	GradientAccumulationSteps int     `mapstructure:"gradient_accumulation_steps"`
	// MaxLength bounds a row's tokens; TruncationMode says what happens to a
	// longer row: keep_start (cut, and counted) or refuse (an error).
	MaxLength      int    `mapstructure:"max_length"`
	TruncationMode string `mapstructure:"truncation_mode"`
	// AssistantOnlyLoss trains on the assistant's tokens only (conversational
	// rows: the turns' text, tool-call syntax and end-of-turn token; never
	// system, user or tool tokens). CompletionOnlyLoss does the same for the
	// completion of prompt-completion rows.
	AssistantOnlyLoss  bool `mapstructure:"assistant_only_loss"`
	CompletionOnlyLoss bool `mapstructure:"completion_only_loss"`
	// SkipBadRows skips (and counts) rows that cannot be used instead of
	// stopping at the first with an error naming file, line and field.
	SkipBadRows bool `mapstructure:"skip_bad_rows"`

	WeightDecay           float64    `mapstructure:"weight_decay"`
	AdamBeta1             float64    `mapstructure:"adam_beta1"`
	AdamBeta2             float64    `mapstructure:"adam_beta2"`
	AdamEpsilon           float64    `mapstructure:"adam_epsilon"`
	MaxGradNorm           float64    `mapstructure:"max_grad_norm"`
	GradientCheckpointing bool       `mapstructure:"gradient_checkpointing"`
	LoggingSteps          int        `mapstructure:"logging_steps"`
	SaveSteps             int        `mapstructure:"save_steps"` // 0: only the final checkpoint
	LoRA                  LoRAConfig `mapstructure:"lora"`
}

// TruncationModes are the accepted sft.truncation_mode values.
func TruncationModes() []string { return []string{"keep_start", "refuse"} }

// defaultSFT is TRL's SFTConfig defaults where they apply.
func defaultSFT() SFTConfig {
	return SFTConfig{
		LearningRate:              2e-5,
		LRSchedulerType:           "linear",
		NumTrainEpochs:            3,
		PerDeviceTrainBatchSize:   8,
		GradientAccumulationSteps: 1,
		MaxLength:                 1024,
		TruncationMode:            "keep_start",
		AssistantOnlyLoss:         true,
		CompletionOnlyLoss:        true,
		AdamBeta1:                 0.9,
		AdamBeta2:                 0.999,
		AdamEpsilon:               1e-8,
		MaxGradNorm:               1.0,
		LoggingSteps:              1,
		SaveSteps:                 500,
		LoRA: LoRAConfig{
			Rank: 16, Alpha: 32, Dropout: 0.05,
			TargetModules: []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
		},
	}
}

// ValidateSFT checks the sft section (and what `ortrain sft` needs of the
// shared ones); `ortrain run` does not look at it.
func (c *Config) ValidateSFT() error {
	if err := c.validateTop(); err != nil {
		return err
	}
	if err := c.validateRuntime(); err != nil {
		return err
	}
	s := c.SFT
	positive := func(v float64) bool { return v > 0 && !math.IsInf(v, 0) }
	switch {
	case s.Data == "":
		return bad("sft.data", s.Data, "a JSONL file of conversations (--data FILE; `ortrain env demos` writes one)")
	case !(s.EvalSplit >= 0 && s.EvalSplit < 1):
		return bad("sft.eval_split", s.EvalSplit, "a fraction in [0, 1): the share of the data held out for eval_loss")
	case s.EvalData != "" && s.EvalSplit > 0:
		return bad("sft.eval_split", s.EvalSplit, "0 when sft.eval_data is set (one held-out source)")
	case s.EvalSteps < 0:
		return bad("sft.eval_steps", s.EvalSteps, "0 (evaluate after the last step) or a positive number of steps")
	case !positive(s.LearningRate):
		return bad("sft.learning_rate", s.LearningRate, "a positive number such as 2e-5")
	case !slices.Contains([]string{"constant", "linear", "cosine"}, s.LRSchedulerType):
		return bad("sft.lr_scheduler_type", s.LRSchedulerType, "constant, linear or cosine")
	case s.WarmupSteps < 0:
		return bad("sft.warmup_steps", s.WarmupSteps, "0 or more")
	case !(s.WarmupRatio >= 0 && s.WarmupRatio < 1):
		return bad("sft.warmup_ratio", s.WarmupRatio, "a fraction in [0, 1)")
	case s.MaxSteps < 0:
		return bad("sft.max_steps", s.MaxSteps, "0 (num_train_epochs decides) or a positive number of steps")
	case s.MaxSteps == 0 && !positive(s.NumTrainEpochs):
		return bad("sft.num_train_epochs", s.NumTrainEpochs, "a positive number of passes over the data (or set max_steps)")
	case s.PerDeviceTrainBatchSize < 1:
		return bad("sft.per_device_train_batch_size", s.PerDeviceTrainBatchSize, "1 or more rows per micro-batch")
	case s.GradientAccumulationSteps < 1:
		return bad("sft.gradient_accumulation_steps", s.GradientAccumulationSteps, "1 or more micro-batches per optimizer step")
	case s.MaxLength < 2:
		return bad("sft.max_length", s.MaxLength, "2 or more tokens per row")
	case !slices.Contains(TruncationModes(), s.TruncationMode):
		return bad("sft.truncation_mode", s.TruncationMode, "keep_start (cut rows longer than max_length and count them) or refuse (stop with an error naming the row)")
	case s.WeightDecay < 0:
		return bad("sft.weight_decay", s.WeightDecay, "0 or more")
	case !(s.AdamBeta1 >= 0 && s.AdamBeta1 < 1):
		return bad("sft.adam_beta1", s.AdamBeta1, "a number in [0, 1)")
	case !(s.AdamBeta2 >= 0 && s.AdamBeta2 < 1):
		return bad("sft.adam_beta2", s.AdamBeta2, "a number in [0, 1)")
	case !positive(s.AdamEpsilon):
		return bad("sft.adam_epsilon", s.AdamEpsilon, "a small positive number such as 1e-8")
	case s.MaxGradNorm < 0:
		return bad("sft.max_grad_norm", s.MaxGradNorm, "0 (no clipping) or a positive norm")
	case s.LoggingSteps < 1:
		return bad("sft.logging_steps", s.LoggingSteps, "1 or more")
	case s.SaveSteps < 0:
		return bad("sft.save_steps", s.SaveSteps, "0 (only the final checkpoint) or a positive number of steps")
	}
	return s.LoRA.validate("sft.lora")
}

// SFTResumeChanges lists what changed between a saved SFT run's config and
// now in the settings that decide which rows a step trains on and what the
// model is: a resume with any of them would not continue the same run.
func SFTResumeChanges(saved, now *Config) []Change {
	keys := []string{
		"model", "init_model_preset", "seed", "sft.data", "sft.eval_data", "sft.eval_split",
		"sft.per_device_train_batch_size", "sft.gradient_accumulation_steps", "sft.max_length",
		"sft.truncation_mode", "sft.assistant_only_loss", "sft.completion_only_loss", "sft.skip_bad_rows",
		"sft.lora.enabled", "chat.system_prompt", "chat.render_tools", "chat.tool_call_format",
		"chat.template_path",
	}
	if saved.SFT.LoRA.Enabled || now.SFT.LoRA.Enabled {
		keys = append(keys, "sft.lora.r", "sft.lora.alpha", "sft.lora.dropout", "sft.lora.target_modules", "sft.lora.modules_to_save")
	}
	sv, nv := reflect.ValueOf(*saved), reflect.ValueOf(*now)
	var out []Change
	for _, k := range keys {
		if o, n := settingText(valueAt(sv, k)), settingText(valueAt(nv, k)); o != n {
			out = append(out, Change{Field: k, Old: o, New: n})
		}
	}
	return out
}
