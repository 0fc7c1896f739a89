package config

import (
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"
)

// EnvPrefix prefixes every environment variable that sets a config key:
// grpo.learning_rate is ORTRAIN_GRPO_LEARNING_RATE.
const EnvPrefix = "ORTRAIN_"

// Source says where the settings come from, lowest precedence first:
// the embedded defaults, File, the environment, then Flags.
type Source struct {
	// File is a YAML config file; empty means none.
	File string
	// Data, when non-nil, is used instead of reading File (embedded configs).
	Data []byte
	// Getenv reads ORTRAIN_* variables; nil means no environment layer.
	Getenv func(string) string
	// Flags maps config keys to the flags that set them; only flags the user
	// changed override lower layers.
	Flags map[string]*pflag.Flag
}

// EnvVarFor returns the environment variable that sets key.
func EnvVarFor(key string) string {
	return EnvPrefix + strings.ToUpper(strings.NewReplacer(".", "_").Replace(key))
}

// Keys lists every valid config key (dotted; list items as envs[].target).
func Keys() []string { return keyPaths(reflect.TypeOf(Config{}), "") }

// Load resolves the configuration once and validates it.
func Load(src Source) (*Config, error) {
	cfg, err := Resolve(src)
	if err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Resolve merges the layers without validating (for --print-config of a
// config that does not validate yet).
func Resolve(src Source) (*Config, error) {
	v := viper.New()
	def := Default()
	for key, val := range flatten(reflect.ValueOf(def), "") {
		v.SetDefault(key, val)
	}
	var doc map[string]any
	if src.File != "" || src.Data != nil {
		var err error
		doc, err = readYAML(src)
		if err != nil {
			return nil, err
		}
		// MergeConfigMap lowercases keys in place: give it a copy.
		if err := v.MergeConfigMap(deepCopy(doc).(map[string]any)); err != nil {
			return nil, fmt.Errorf("merge config file %s: %w", src.File, err)
		}
	}
	if src.Getenv != nil {
		envDoc, err := envLayer(src.Getenv)
		if err != nil {
			return nil, err
		}
		if len(envDoc) > 0 {
			if err := v.MergeConfigMap(envDoc); err != nil {
				return nil, fmt.Errorf("merge %s* environment: %w", EnvPrefix, err)
			}
		}
	}
	for key, fl := range src.Flags {
		if err := v.BindPFlag(key, fl); err != nil {
			return nil, fmt.Errorf("bind flag --%s to %s: %w", fl.Name, key, err)
		}
	}
	var cfg Config
	err := v.Unmarshal(&cfg, func(dc *mapstructure.DecoderConfig) {
		dc.DecodeHook = mapstructure.ComposeDecodeHookFunc(
			mapstructure.StringToTimeDurationHookFunc(),
			mapstructure.StringToSliceHookFunc(","),
		)
		dc.WeaklyTypedInput = true
	})
	if err != nil {
		return nil, fmt.Errorf("decode config: %w", cleanDecodeError(err))
	}
	if err := decodeCaseSensitive(doc, &cfg); err != nil {
		return nil, err
	}
	for i := range cfg.Envs {
		applyEnvDefaults(&cfg.Envs[i])
	}
	return &cfg, nil
}

// decodeCaseSensitive re-decodes, straight from the file, the parts whose
// map keys are case-sensitive (secrets, template kwargs): viper lowercases
// every key it stores.
func decodeCaseSensitive(doc map[string]any, cfg *Config) error {
	if raw, ok := doc["envs"]; ok {
		var envs []EnvConfig
		dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
			Result: &envs, WeaklyTypedInput: true,
			DecodeHook: mapstructure.StringToSliceHookFunc(","),
		})
		if err != nil {
			return err
		}
		if err := dec.Decode(raw); err != nil {
			return fmt.Errorf("decode envs: %w", cleanDecodeError(err))
		}
		cfg.Envs = envs
	}
	if chat, ok := asMap(doc["chat"]); ok {
		if kw, ok := asMap(chat["template_kwargs"]); ok {
			cfg.Chat.TemplateKwargs = kw
		}
	}
	return nil
}

func readYAML(src Source) (map[string]any, error) {
	data := src.Data
	name := src.File
	if data == nil {
		b, err := os.ReadFile(src.File)
		if err != nil {
			return nil, fmt.Errorf("read config file: %w", err)
		}
		data = b
	}
	if name == "" {
		name = "embedded config"
	}
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: not valid YAML: %w", name, err)
	}
	if doc == nil {
		doc = map[string]any{}
	}
	if err := checkKeys(name, doc, reflect.TypeOf(Config{}), "", Keys()); err != nil {
		return nil, err
	}
	return doc, nil
}

// applyEnvDefaults fills keys an env entry left out; list items get no
// viper defaults.
func applyEnvDefaults(e *EnvConfig) {
	d := DefaultEnv()
	if e.Split == "" {
		e.Split = d.Split
	}
	if e.Weight == 0 {
		e.Weight = d.Weight
	}
}

// envLayer reads ORTRAIN_<KEY> for every scalar key and builds a nested
// document. Values are parsed by the field's type so a bad value is named.
func envLayer(getenv func(string) string) (map[string]any, error) {
	doc := map[string]any{}
	t := reflect.TypeOf(Config{})
	for _, key := range Keys() {
		if strings.Contains(key, "[]") {
			continue // list-of-struct items are set in the file or by flags
		}
		name := EnvVarFor(key)
		raw := getenv(name)
		if raw == "" {
			continue
		}
		ft := typeAt(t, strings.Split(key, "."))
		val, err := parseScalar(ft, raw)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: %s %v", name, raw, key, err)
		}
		setPath(doc, strings.Split(key, "."), val)
	}
	return doc, nil
}

func typeAt(t reflect.Type, path []string) reflect.Type {
	for _, p := range path {
		f, ok := fieldByTag(t, p)
		if !ok {
			return nil
		}
		t = f.Type
	}
	return t
}

func parseScalar(t reflect.Type, raw string) (any, error) {
	if t == reflect.TypeOf(time.Duration(0)) {
		d, err := time.ParseDuration(raw)
		if err != nil {
			return nil, fmt.Errorf("must be a duration like 30s or 5m")
		}
		return d, nil
	}
	switch t.Kind() {
	case reflect.String:
		return raw, nil
	case reflect.Bool:
		b, err := strconv.ParseBool(raw)
		if err != nil {
			return nil, fmt.Errorf("must be true or false")
		}
		return b, nil
	case reflect.Int, reflect.Int32, reflect.Int64:
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("must be an integer")
		}
		return n, nil
	case reflect.Float32, reflect.Float64:
		f, err := strconv.ParseFloat(raw, 64)
		if err != nil {
			return nil, fmt.Errorf("must be a number")
		}
		return f, nil
	case reflect.Slice:
		parts := strings.Split(raw, ",")
		out := make([]any, 0, len(parts))
		for _, p := range parts {
			v, err := parseScalar(t.Elem(), strings.TrimSpace(p))
			if err != nil {
				return nil, fmt.Errorf("item %q %v", p, err)
			}
			out = append(out, v)
		}
		return out, nil
	case reflect.Map:
		return nil, fmt.Errorf("is a mapping and can only be set in the config file")
	}
	return raw, nil
}

func setPath(doc map[string]any, path []string, val any) {
	for _, p := range path[:len(path)-1] {
		next, ok := doc[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			doc[p] = next
		}
		doc = next
	}
	doc[path[len(path)-1]] = val
}

// flatten turns a config value into dotted-key defaults for viper. Slices of
// structs stay whole (viper cannot address their items).
func flatten(v reflect.Value, prefix string) map[string]any {
	out := map[string]any{}
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("mapstructure")
		if tag == "" {
			continue
		}
		fv := v.Field(i)
		if f.Type.Kind() == reflect.Struct && f.Type.String() != "time.Duration" {
			for k, x := range flatten(fv, prefix+tag+".") {
				out[k] = x
			}
			continue
		}
		out[prefix+tag] = fv.Interface()
	}
	return out
}

// cleanDecodeError trims mapstructure's wrapping to the useful sentence.
func cleanDecodeError(err error) error {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "decoding failed due to the following error(s):\n\n")
	return fmt.Errorf("%s", strings.TrimSpace(msg))
}

func deepCopy(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = deepCopy(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = deepCopy(e)
		}
		return out
	}
	return v
}

// YAML renders the configuration with its config-file keys, for
// --print-config and the run directory's config.yaml.
func (c *Config) YAML() ([]byte, error) {
	return yaml.Marshal(toDoc(reflect.ValueOf(*c)))
}

// toDoc turns a config value into nested maps keyed by mapstructure tags.
func toDoc(v reflect.Value) any {
	switch v.Kind() {
	case reflect.Struct:
		if d, ok := v.Interface().(time.Duration); ok {
			return d.String()
		}
		out := map[string]any{}
		for i := 0; i < v.NumField(); i++ {
			tag := v.Type().Field(i).Tag.Get("mapstructure")
			if tag == "" || tag == "-" {
				continue
			}
			out[tag] = toDoc(v.Field(i))
		}
		return out
	case reflect.Slice:
		if v.IsNil() {
			return nil
		}
		out := make([]any, v.Len())
		for i := range out {
			out[i] = toDoc(v.Index(i))
		}
		return out
	case reflect.Int64:
		if d, ok := v.Interface().(time.Duration); ok {
			return d.String()
		}
	}
	return v.Interface()
}
