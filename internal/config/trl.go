package config

import "strings"

// trlNames are TRL GRPOConfig/TrainingArguments names that have no key of
// the same name here, with what does their job in ortrain. Names that
// match a key's last segment (beta, learning_rate, …) need no entry: the
// key suggestion finds them.
var trlNames = map[string]string{
	"use_vllm":         "engine.kind: vllm",
	"vllm_mode":        "engine.kind: vllm, with engine.vllm_colocate: true (TRL's colocate) or engine.vllm_urls (TRL's server)",
	"vllm_server_host": "engine.vllm_urls (http://HOST:PORT)",
	"vllm_server_port": "engine.vllm_urls (http://HOST:PORT), or engine.vllm_port for replicas ortrain launches",
	"bf16":             "worker.dtype: bfloat16",
	"fp16":             "worker.dtype: float16",
	"report_to":        "logging.tensorboard: true (metrics.jsonl is always written; `ortrain report` draws it)",
	"reward_weights":   "rewards[].weight, one per entry of rewards:",
	"reward_funcs":     "rewards: (kind env, agent, expression, length or http)",
	"max_prompt_length": "no key: prompts are the env's; grpo.max_completion_length bounds what is sampled, " +
		"engine.vllm_max_model_len the context",
	"per_device_eval_batch_size": "no key: `ortrain eval` measures a checkpoint (-n, --num-tasks)",
	"save_strategy":              "grpo.save_steps",
	"logging_strategy":           "grpo.logging_steps",
	"seed":                       "seed (top level)",
}

// TRLEquivalent says what does the job of TRL's setting name in ortrain
// (name as a config key's last segment or a flag, dashes or underscores).
func TRLEquivalent(name string) (string, bool) {
	name = strings.ReplaceAll(strings.TrimLeft(name, "-"), "-", "_")
	if i := strings.LastIndex(name, "."); i >= 0 {
		name = name[i+1:]
	}
	s, ok := trlNames[name]
	return s, ok
}

// KeyForLeaf is the config key whose last segment is leaf (dashes read as
// underscores), preferring grpo's over sft's; "" when none is.
func KeyForLeaf(leaf string) string {
	leaf = strings.ReplaceAll(strings.TrimLeft(leaf, "-"), "-", "_")
	found := ""
	for _, k := range Keys() {
		if k[strings.LastIndex(k, ".")+1:] != leaf {
			continue
		}
		if found == "" || strings.HasPrefix(k, "grpo.") {
			found = k
		}
	}
	return found
}
