package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestUnknownKeysReportedAtOnce(t *testing.T) {
	type want struct{ source, key, suggestion string }
	tests := []struct {
		name    string
		body    string // "" means no file
		environ []string
		want    []want
	}{
		{
			name: "every key of a file",
			body: "modle: x\ngrpo:\n  learnig_rate: 1\n  num_generatons: 4\nenvs:\n  - target: a\n    splt: train\n",
			want: []want{
				{"cfg.yaml", "envs[0].splt", "envs[0].split"},
				{"cfg.yaml", "grpo.learnig_rate", "grpo.learning_rate"},
				{"cfg.yaml", "grpo.num_generatons", "grpo.num_generations"},
				{"cfg.yaml", "modle", "model"},
			},
		},
		{
			name:    "misspelled variable",
			environ: []string{"PATH=/bin", "ORTRAIN_GRPO_LEARNIN_RATE=1e-5"},
			want:    []want{{EnvironmentSource, "ORTRAIN_GRPO_LEARNIN_RATE", "ORTRAIN_GRPO_LEARNING_RATE"}},
		},
		{
			name:    "variable missing its section",
			environ: []string{"ORTRAIN_LEARNING_RATE=1e-5"},
			want:    []want{{EnvironmentSource, "ORTRAIN_LEARNING_RATE", "ORTRAIN_GRPO_LEARNING_RATE"}},
		},
		{
			name: "file and environment together",
			body: "seeed: 1\n",
			// The scripts' own settings (ORTRAIN_FORKY_*, ORTRAIN_HF_*) are not config keys, nor misspellings.
			environ: []string{"ORTRAIN_ROLLOUT_CALL_TIMEOUTS=5s", "ORTRAIN_WORKER_LIB=/lib.so", "ORTRAIN_SEED=3", "ORTRAIN_FORKY_ROOT=/r", "ORTRAIN_HF_REFERENCE=/h"},
			want: []want{
				{"cfg.yaml", "seeed", "seed"},
				{EnvironmentSource, "ORTRAIN_ROLLOUT_CALL_TIMEOUTS", "ORTRAIN_ROLLOUT_CALL_TIMEOUT"},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := Source{Environ: tc.environ, Getenv: envOf(nil)}
			if tc.body != "" {
				src.File = writeFile(t, tc.body)
			}
			_, err := Load(src)
			var uks *UnknownKeysError
			require.ErrorAs(t, err, &uks)
			require.Len(t, uks.Keys, len(tc.want))
			for i, w := range tc.want {
				got := uks.Keys[i]
				if w.source == "cfg.yaml" {
					assert.Equal(t, src.File, got.Source)
				} else {
					assert.Equal(t, w.source, got.Source)
				}
				assert.Equal(t, w.key, got.Key)
				assert.Equal(t, w.suggestion, got.Suggestion)
				assert.Contains(t, err.Error(), w.key, "the message lists every key")
				assert.Contains(t, err.Error(), w.suggestion)
			}
			var one *UnknownKeyError
			require.ErrorAs(t, err, &one, "each key is reachable on its own")
			assert.Equal(t, tc.want[0].key, one.Key)
		})
	}
}

func TestKnownVariablesAreNotUnknown(t *testing.T) {
	environ := []string{"ORTRAIN_WORKER_LIB=/x.so", "ORTRAIN_REQUIRE_WORKER=1", "ORTRAIN_GRPO_LEARNING_RATE=1e-5",
		"ORTRAIN_ROLLOUT_MAX_RETRIES=3", "HOME=/root", "ORTRAIN_ENGINE_VLLM_GPUS=0,1"}
	cfg, err := Load(Source{Environ: environ, Getenv: func(k string) string {
		for _, kv := range environ {
			if name, v, _ := strings.Cut(kv, "="); name == k {
				return v
			}
		}
		return ""
	}})
	require.NoError(t, err)
	assert.Equal(t, 3, cfg.Rollout.MaxRetries)
	assert.Equal(t, []int{0, 1}, cfg.Engine.VLLMGPUs)
}

// stringFlags registers each name as a string flag (so the value reaches
// the loader unparsed) and sets it.
func stringFlags(t *testing.T, set map[string]string, keys map[string]string) map[string]*pflag.Flag {
	t.Helper()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	out := map[string]*pflag.Flag{}
	for name, key := range keys {
		fs.String(name, "", "")
		out[key] = fs.Lookup(name)
	}
	var args []string
	for name, v := range set {
		args = append(args, "--"+name+"="+v)
	}
	require.NoError(t, fs.Parse(args))
	return out
}

func TestTypeErrorsNameFieldAndType(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		env    map[string]string
		flags  map[string]string // flag name → value; keys below
		source string            // "file" for the test's file
		field  string
		msg    string
	}{
		{name: "fraction for an int", body: "grpo:\n  max_steps: 1.5\n", source: "file", field: "grpo.max_steps",
			msg: "grpo.max_steps: 1.5 is not a whole number"},
		{name: "bad duration", body: "rollout:\n  call_timeout: 5x\n", source: "file", field: "rollout.call_timeout",
			msg: `rollout.call_timeout: "5x" is not a duration like 30s or 5m`},
		{name: "duration without unit", body: "rollout:\n  call_timeout: 30\n", source: "file", field: "rollout.call_timeout",
			msg: "rollout.call_timeout: 30 is not a duration like 30s or 5m (a number needs a unit)"},
		{name: "word for an int", body: "grpo:\n  num_generations: eight\n", source: "file", field: "grpo.num_generations",
			msg: `grpo.num_generations: "eight" is not an integer`},
		{name: "word for a float", body: "grpo:\n  learning_rate: fast\n", source: "file", field: "grpo.learning_rate",
			msg: `grpo.learning_rate: "fast" is not a number`},
		{name: "word for a bool", body: "grpo:\n  shuffle_dataset: maybe\n", source: "file", field: "grpo.shuffle_dataset",
			msg: `grpo.shuffle_dataset: "maybe" is not true or false`},
		{name: "list for text", body: "model: [a, b]\n", source: "file", field: "model",
			msg: "model: a list is not text"},
		{name: "scalar for a section", body: "grpo: 3\n", source: "file", field: "grpo",
			msg: "grpo: 3 is not a mapping of keys"},
		{name: "env item field", body: "envs:\n  - target: a\n    num_tasks: 2.5\n", source: "file", field: "envs[0].num_tasks",
			msg: "envs[0].num_tasks: 2.5 is not a whole number"},
		{name: "list item", body: "envs:\n  - target: a\n    indices: [1, 2.5]\n", source: "file", field: "envs[0].indices[1]",
			msg: "envs[0].indices[1]: 2.5 is not a whole number"},
		{name: "env override", body: "envs:\n  - target: a\n    chat: {render_tools: sometimes}\n", source: "file",
			field: "envs[0].chat.render_tools", msg: `envs[0].chat.render_tools: "sometimes" is not true or false`},
		{name: "variable fraction", env: map[string]string{"ORTRAIN_GRPO_MAX_STEPS": "1.5"}, source: "ORTRAIN_GRPO_MAX_STEPS",
			field: "grpo.max_steps", msg: `ORTRAIN_GRPO_MAX_STEPS: grpo.max_steps: "1.5" is not a whole number`},
		{name: "variable duration", env: map[string]string{"ORTRAIN_ROLLOUT_CALL_TIMEOUT": "5x"}, source: "ORTRAIN_ROLLOUT_CALL_TIMEOUT",
			field: "rollout.call_timeout", msg: `rollout.call_timeout: "5x" is not a duration like 30s or 5m`},
		{name: "variable mapping", env: map[string]string{"ORTRAIN_CHAT_TEMPLATE_KWARGS": "a=1"}, source: "ORTRAIN_CHAT_TEMPLATE_KWARGS",
			field: "chat.template_kwargs", msg: "is not a mapping of keys (set it in the config file)"},
		{name: "flag fraction", flags: map[string]string{"max-steps": "1.5"}, source: "--max-steps",
			field: "grpo.max_steps", msg: `--max-steps: grpo.max_steps: "1.5" is not a whole number`},
		{name: "flag duration", flags: map[string]string{"call-timeout": "5x"}, source: "--call-timeout",
			field: "rollout.call_timeout", msg: `--call-timeout: rollout.call_timeout: "5x" is not a duration like 30s or 5m`},
	}
	flagKeys := map[string]string{"max-steps": "grpo.max_steps", "call-timeout": "rollout.call_timeout"}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := Source{Getenv: envOf(tc.env), Flags: stringFlags(t, tc.flags, flagKeys)}
			if tc.body != "" {
				src.File = writeFile(t, tc.body)
			}
			_, err := Load(src)
			var te *TypeError
			require.ErrorAs(t, err, &te)
			want := tc.source
			if want == "file" {
				want = src.File
			}
			assert.Equal(t, want, te.Source)
			assert.Equal(t, tc.field, te.Field)
			assert.Contains(t, err.Error(), tc.msg)
			for _, leak := range []string{"strconv", "ParseInt", "time: invalid duration", "mapstructure", "expected type"} {
				assert.NotContains(t, err.Error(), leak)
			}
		})
	}
}

func TestEveryTypeErrorReported(t *testing.T) {
	file := writeFile(t, "grpo:\n  max_steps: 1.5\n  num_generations: x\nrollout:\n  call_timeout: 5x\n")
	_, err := Load(Source{File: file, Getenv: envOf(map[string]string{"ORTRAIN_SEED": "one"})})
	require.Error(t, err)
	for _, field := range []string{"grpo.max_steps", "grpo.num_generations", "rollout.call_timeout", "ORTRAIN_SEED"} {
		assert.Contains(t, err.Error(), field)
	}
}

func TestValuesConvertedWithoutGuessing(t *testing.T) {
	tests := []struct {
		name  string
		body  string
		env   map[string]string
		check func(*testing.T, *Config)
	}{
		{"whole float is an int", "grpo:\n  max_steps: 2.0\n", nil, func(t *testing.T, c *Config) { assert.Equal(t, 2, c.GRPO.MaxSteps) }},
		{"exponent int", "grpo:\n  max_steps: 1e3\n", nil, func(t *testing.T, c *Config) { assert.Equal(t, 1000, c.GRPO.MaxSteps) }},
		{"quoted float", "grpo:\n  learning_rate: \"1e-5\"\n", nil, func(t *testing.T, c *Config) { assert.InDelta(t, 1e-5, c.GRPO.LearningRate, 1e-18) }},
		{"int for a float", "grpo:\n  beta: 1\n", nil, func(t *testing.T, c *Config) { assert.Equal(t, 1.0, c.GRPO.Beta) }},
		{"number for text", "envs:\n  - target: a\n    split: 2024\n", nil, func(t *testing.T, c *Config) { assert.Equal(t, "2024", c.Envs[0].Split) }},
		{"comma list", "grpo:\n  lora:\n    target_modules: q_proj, v_proj\n", nil, func(t *testing.T, c *Config) {
			assert.Equal(t, []string{"q_proj", "v_proj"}, c.GRPO.LoRA.TargetModules)
		}},
		{"duration from a variable", "grpo:\n  beta: 0\n", map[string]string{"ORTRAIN_ROLLOUT_RETRY_BACKOFF": "250ms"}, func(t *testing.T, c *Config) {
			assert.Equal(t, 250*time.Millisecond, c.Rollout.RetryBackoff)
		}},
		{"large seed exact", "seed: 9007199254740993\n", nil, func(t *testing.T, c *Config) { assert.Equal(t, int64(9007199254740993), c.Seed) }},
		{"secret number", "envs:\n  - target: a\n    secrets: {PORT: 8080}\n", nil, func(t *testing.T, c *Config) {
			assert.Equal(t, "8080", c.Envs[0].Secrets["PORT"])
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Load(Source{File: writeFile(t, tc.body), Getenv: envOf(tc.env)})
			require.NoError(t, err)
			tc.check(t, cfg)
		})
	}
}

// mapstructure turns 1.5 into 1 when decoding into an int, weak typing or
// not; strictDecodeHook is what refuses it at decode time, for any layer.
func TestDecodeHookRefusesTruncation(t *testing.T) {
	tests := []struct {
		name  string
		input map[string]any
		field string
		want  string
	}{
		{"float to int", map[string]any{"max_steps": 1.5}, "max_steps", "a whole number"},
		{"word to a nested int", map[string]any{"lora": map[string]any{"r": "x"}}, "lora.r", "an integer"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var plain GRPOConfig
			require.NoError(t, mapstructure.Decode(map[string]any{"max_steps": 1.5}, &plain))
			assert.Equal(t, 1, plain.MaxSteps, "without the hook mapstructure truncates")

			var g GRPOConfig
			dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{Result: &g, DecodeHook: strictDecodeHook})
			require.NoError(t, err)
			err = decodeErrors(dec.Decode(tc.input), "")
			var te *TypeError
			require.ErrorAs(t, err, &te)
			assert.Equal(t, tc.field, te.Field)
			assert.Equal(t, tc.want, te.Want)
		})
	}
}

func TestUnknownKeysErrorMessage(t *testing.T) {
	err := &UnknownKeysError{Keys: []*UnknownKeyError{
		{Source: "a.yaml", Key: "modle", Suggestion: "model"},
		{Source: EnvironmentSource, Key: "ORTRAIN_SEEED"},
	}}
	assert.Equal(t, "2 unknown settings (run 'ortrain run --print-config' to see every valid key):\n"+
		"  a.yaml: unknown key \"modle\" (did you mean \"model\"?)\n"+
		"  environment: unknown variable \"ORTRAIN_SEEED\"", err.Error())
	assert.True(t, errors.Is(err, err.Keys[1]))
}

// TestListVariables: a list-valued variable takes a,b,c or a JSON/YAML
// flow list (as copied from a manifest); a broken flow list is refused.
func TestListVariables(t *testing.T) {
	tests := []struct {
		name, value string
		want        []string
		err         string
	}{
		{"commas", "http://a:1, http://b:2", []string{"http://a:1", "http://b:2"}, ""},
		{"json", `["http://a:1","http://b:2"]`, []string{"http://a:1", "http://b:2"}, ""},
		{"yaml flow", "[http://a:1, http://b:2]", []string{"http://a:1", "http://b:2"}, ""},
		{"empty", "", []string{}, ""},
		{"broken flow list", `[http://a:1, "b]`, nil, "is not a list"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			environ := []string{"ORTRAIN_ENGINE_VLLM_URLS=" + tc.value}
			cfg, err := Load(Source{Environ: environ, Getenv: func(k string) string {
				if k == "ORTRAIN_ENGINE_VLLM_URLS" {
					return tc.value
				}
				return ""
			}})
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				assert.Contains(t, err.Error(), "engine.vllm_urls")
				return
			}
			require.NoError(t, err)
			if len(tc.want) == 0 {
				assert.Empty(t, cfg.Engine.VLLMURLs)
				return
			}
			assert.Equal(t, tc.want, cfg.Engine.VLLMURLs)
		})
	}
}
