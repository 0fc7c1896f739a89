package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// Change is one setting that differs between the config a run was started
// with (its saved config.yaml) and the config it is resumed with.
type Change struct {
	// Field is the dotted key: grpo.num_generations, envs[1].split, or
	// envs[2] for an entry added or removed.
	Field string
	// Old and New are the values as text; "(none)" for an absent entry.
	Old, New string
}

func (c Change) String() string { return fmt.Sprintf("%s: %s -> %s", c.Field, c.Old, c.New) }

// ResumeChangedError refuses to resume a run with settings that alter the
// batch or the model.
type ResumeChangedError struct {
	Changes []Change
}

func (e *ResumeChangedError) Error() string {
	var b strings.Builder
	b.WriteString("the run was started with other settings that change the batch or the model:")
	for _, c := range e.Changes {
		b.WriteString("\n  " + c.String())
	}
	b.WriteString("\nresume with the run's own settings, or pass --resume-with-changes to resume anyway (the change is recorded in the run directory)")
	return b.String()
}

// resumeKeys are the top-level settings that alter the batch or the model.
func resumeKeys() []string {
	return []string{
		"model", "init_model_preset", "seed",
		"grpo.num_generations", "grpo.per_device_train_batch_size", "grpo.gradient_accumulation_steps",
		"grpo.steps_per_generation", "grpo.num_iterations", "grpo.generation_batch_size", "grpo.loss_type",
		"grpo.lora.enabled", "async.max_off_policy_steps", "grpo.dynamic_sampling", "curriculum.enabled",
	}
}

// loraKeys alter the model only while LoRA is enabled on either side.
func loraKeys() []string {
	return []string{"grpo.lora.r", "grpo.lora.alpha", "grpo.lora.dropout", "grpo.lora.target_modules", "grpo.lora.modules_to_save"}
}

// envResumeKeys are the keys of an envs[] entry that alter which tasks the
// sampler draws (and so every later batch).
func envResumeKeys() []string {
	return []string{"target", "split", "indices", "num_tasks", "weight", "name"}
}

// ResumeChanges lists, in a fixed order, the settings that alter the batch
// or the model and differ between saved (the run directory's config.yaml,
// read with LoadFile) and now: model, init_model_preset, seed, the batch
// shape (num_generations, per_device_train_batch_size,
// gradient_accumulation_steps, steps_per_generation, num_iterations,
// generation_batch_size), loss_type, the LoRA settings,
// async.max_off_policy_steps (which weights generate each round), and each env
// entry's target, split, indices, num_tasks, weight and name. Settings that
// do not (learning rate, timeouts, logging, secrets) are not listed: env
// secrets are saved as <redacted>, so their values are never compared nor
// shown, and a rotated key must not block a resume.
func ResumeChanges(saved, now *Config) []Change {
	var out []Change
	add := func(field string, old, cur reflect.Value) {
		if o, n := settingText(old), settingText(cur); o != n {
			out = append(out, Change{Field: field, Old: o, New: n})
		}
	}
	sv, nv := reflect.ValueOf(*saved), reflect.ValueOf(*now)
	keys := resumeKeys()
	if saved.GRPO.LoRA.Enabled || now.GRPO.LoRA.Enabled {
		keys = append(keys, loraKeys()...)
	}
	for _, k := range keys {
		add(k, valueAt(sv, k), valueAt(nv, k))
	}
	for i := range max(len(saved.Envs), len(now.Envs)) {
		entry := fmt.Sprintf("envs[%d]", i)
		switch {
		case i >= len(saved.Envs):
			out = append(out, Change{Field: entry, Old: "(none)", New: envText(now.Envs[i])})
		case i >= len(now.Envs):
			out = append(out, Change{Field: entry, Old: envText(saved.Envs[i]), New: "(none)"})
		default:
			se, ne := reflect.ValueOf(saved.Envs[i]), reflect.ValueOf(now.Envs[i])
			for _, k := range envResumeKeys() {
				add(entry+"."+k, valueAt(se, k), valueAt(ne, k))
			}
		}
	}
	return out
}

// valueAt follows a dotted key through the mapstructure tags of v.
func valueAt(v reflect.Value, key string) reflect.Value {
	for _, p := range strings.Split(key, ".") {
		f, ok := fieldByTag(v.Type(), p)
		if !ok {
			panic(fmt.Sprintf("config: no key %q", key)) // the key lists above are wrong
		}
		v = v.FieldByIndex(f.Index)
	}
	return v
}

// envText names an env entry in a Change.
func envText(e EnvConfig) string {
	s := fmt.Sprintf("%s split %s", e.Target, e.Split)
	if e.Name != "" {
		s = e.Name + " (" + s + ")"
	}
	return s
}

// settingText renders a setting's value for a Change: strings quoted,
// numbers as written, lists in brackets.
func settingText(v reflect.Value) string {
	switch v.Kind() {
	case reflect.String:
		return strconv.Quote(v.String())
	case reflect.Float32, reflect.Float64:
		return strconv.FormatFloat(v.Float(), 'g', -1, 64)
	case reflect.Slice:
		items := make([]string, v.Len())
		for i := range items {
			items[i] = settingText(v.Index(i))
		}
		return "[" + strings.Join(items, ", ") + "]"
	}
	return fmt.Sprint(v.Interface())
}
