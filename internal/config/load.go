package config

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
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
	// Environ is the process environment as KEY=VALUE pairs (os.Environ()),
	// checked for ORTRAIN_* variables that set no key (misspellings); nil
	// skips the check.
	Environ []string
	// Flags maps config keys to the flags that set them; only flags the user
	// changed override lower layers.
	Flags map[string]*pflag.Flag
	// Sets are KEY=VALUE assignments of any config key (--set), each value
	// read as its ORTRAIN_* variable would be; above the environment,
	// below the named flags.
	Sets []string
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

// LoadFile parses a saved config.yaml (a run directory's) on the embedded
// defaults alone: no environment, no flags, and no validation (the rules
// may have grown since it was written). Unknown keys and type errors are
// still refused.
func LoadFile(path string) (*Config, error) {
	return Resolve(Source{File: path})
}

// Resolve merges the layers without validating (for --print-config of a
// config that does not validate yet). Every unknown key and variable and
// every value of the wrong type, in any layer, is reported in one error:
// an *UnknownKeysError and *TypeErrors, joined when there are several.
func Resolve(src Source) (*Config, error) {
	var unknown []*UnknownKeyError
	var problems []error
	var doc map[string]any
	fileName := ""
	if src.File != "" || src.Data != nil {
		raw, name, err := readYAML(src)
		if err != nil {
			return nil, err
		}
		p := &docProblems{source: name}
		doc = checkDoc(p, raw, reflect.TypeOf(Config{}), "", Keys())
		unknown, problems, fileName = p.unknown, p.types, name
	}
	unknown = append(unknown, unknownEnvVars(src.Environ)...)
	var envDoc map[string]any
	if src.Getenv != nil {
		var errs []error
		envDoc, errs = envLayer(src.Getenv)
		problems = append(problems, errs...)
	}
	setDoc, setUnknown, errs := setLayer(src.Sets)
	problems = append(problems, errs...)
	unknown = append(unknown, setUnknown...)
	flagDoc, errs := flagLayer(src.Flags)
	problems = append(problems, errs...)
	if len(unknown) > 0 {
		problems = append([]error{&UnknownKeysError{Keys: unknown}}, problems...)
	}
	if err := joinErrors(problems); err != nil {
		return nil, err
	}

	v := viper.New()
	for key, val := range flatten(reflect.ValueOf(Default()), "") {
		v.SetDefault(key, val)
	}
	layers := []struct {
		name string
		doc  map[string]any
	}{{"config file " + fileName, doc}, {EnvPrefix + "* environment", envDoc}, {"--set", setDoc}, {"flags", flagDoc}}
	for _, l := range layers {
		if len(l.doc) == 0 {
			continue
		}
		// MergeConfigMap lowercases keys in place: give it a copy.
		if err := v.MergeConfigMap(deepCopy(l.doc).(map[string]any)); err != nil {
			return nil, fmt.Errorf("merge %s: %w", l.name, err)
		}
	}
	var cfg Config
	err := v.Unmarshal(&cfg, func(dc *mapstructure.DecoderConfig) {
		dc.DecodeHook = strictDecodeHook
		dc.WeaklyTypedInput = false
	})
	if err != nil {
		return nil, decodeErrors(err, "")
	}
	if err := decodeCaseSensitive(doc, fileName, &cfg); err != nil {
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
func decodeCaseSensitive(doc map[string]any, fileName string, cfg *Config) error {
	if raw, ok := doc["envs"]; ok {
		var envs []EnvConfig
		dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
			Result: &envs, DecodeHook: strictDecodeHook,
		})
		if err != nil {
			return fmt.Errorf("decode envs: %w", err)
		}
		if err := dec.Decode(raw); err != nil {
			return decodeErrors(err, fileName)
		}
		cfg.Envs = envs
	}
	if chat, ok := asMap(doc["chat"]); ok {
		if raw, ok := chat["template_kwargs"]; ok {
			kw, _ := asMap(raw) // null stays nil (viper would make it {})
			cfg.Chat.TemplateKwargs = kw
		}
	}
	return nil
}

func readYAML(src Source) (doc map[string]any, name string, err error) {
	data := src.Data
	name = src.File
	if data == nil {
		b, err := os.ReadFile(src.File)
		if err != nil {
			return nil, "", fmt.Errorf("read config file: %w", err)
		}
		data = b
	}
	if name == "" {
		name = "embedded config"
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, "", yamlSyntaxError(name, data, err)
	}
	if doc == nil {
		doc = map[string]any{}
	}
	return doc, name, nil
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
// document. Values are parsed by the field's type so a bad value is named
// with its variable; every bad value is reported.
func envLayer(getenv func(string) string) (map[string]any, []error) {
	doc := map[string]any{}
	var errs []error
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
		val, bad := normalize(typeAt(t, strings.Split(key, ".")), raw)
		if bad != nil {
			bad.Source, bad.Field = name, key+bad.Field
			errs = append(errs, bad)
			continue
		}
		setPath(doc, strings.Split(key, "."), val)
	}
	return doc, errs
}

// SetSource is UnknownKeyError.Source for a --set assignment.
const SetSource = "--set"

// setLayer builds a nested document of --set KEY=VALUE assignments, each
// value parsed by its key's type (lists and maps as JSON or YAML, as for
// ORTRAIN_* variables). A key that is not one is an UnknownKeyError with
// the nearest key; list items (envs[].target) are set in the file.
func setLayer(sets []string) (map[string]any, []*UnknownKeyError, []error) {
	doc := map[string]any{}
	var unknown []*UnknownKeyError
	var errs []error
	t := reflect.TypeOf(Config{})
	all := Keys()
	for _, kv := range sets {
		key, raw, ok := strings.Cut(kv, "=")
		key = strings.TrimSpace(key)
		if !ok || key == "" {
			errs = append(errs, fmt.Errorf("--set %q: want KEY=VALUE, e.g. --set grpo.beta=0.04", kv))
			continue
		}
		ft := typeAt(t, strings.Split(key, "."))
		if ft == nil || !slices.Contains(all, key) {
			uk := &UnknownKeyError{Source: SetSource, Key: key}
			if trl, ok := TRLEquivalent(key); ok {
				uk.TRL = trl
			} else if i := strings.LastIndex(key, "."); i >= 0 {
				uk.Suggestion = suggestKey("", key[i+1:], t, all)
			} else {
				uk.Suggestion = suggestKey("", key, t, all)
			}
			unknown = append(unknown, uk)
			continue
		}
		val, bad := normalize(ft, raw)
		if bad != nil {
			bad.Source, bad.Field = "--set "+key, key+bad.Field
			errs = append(errs, bad)
			continue
		}
		setPath(doc, strings.Split(key, "."), val)
	}
	return doc, unknown, errs
}

// flagLayer builds a nested document of the flags the user changed, each
// value parsed by its key's type (a flag registered as a string can carry
// any key).
func flagLayer(flags map[string]*pflag.Flag) (map[string]any, []error) {
	doc := map[string]any{}
	var errs []error
	t := reflect.TypeOf(Config{})
	for _, key := range slices.Sorted(maps.Keys(flags)) {
		fl := flags[key]
		if fl == nil || !fl.Changed {
			continue
		}
		ft := typeAt(t, strings.Split(key, "."))
		if ft == nil || strings.Contains(key, "[]") {
			errs = append(errs, fmt.Errorf("flag --%s is bound to %q, which is not a config key", fl.Name, key))
			continue
		}
		var raw any = fl.Value.String()
		if sv, ok := fl.Value.(pflag.SliceValue); ok {
			items := sv.GetSlice()
			list := make([]any, len(items))
			for i, it := range items {
				list[i] = it
			}
			raw = list
		}
		val, bad := normalize(ft, raw)
		if bad != nil {
			bad.Source, bad.Field = "--"+fl.Name, key+bad.Field
			errs = append(errs, bad)
			continue
		}
		setPath(doc, strings.Split(key, "."), val)
	}
	return doc, errs
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
		if isStruct(f.Type) {
			for k, x := range flatten(fv, prefix+tag+".") {
				out[k] = x
			}
			continue
		}
		out[prefix+tag] = fv.Interface()
	}
	return out
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

// Redacted replaces every secret's value in rendered configs.
const Redacted = "<redacted>"

// YAML renders the configuration with its config-file keys, for
// --print-config and the run directory's config.yaml. Env secrets are shown
// as <redacted>, key by key, and so is engine.vllm_api_key: their values
// are never written.
func (c *Config) YAML() ([]byte, error) {
	shown := *c
	if shown.Engine.VLLMAPIKey != "" {
		shown.Engine.VLLMAPIKey = Redacted
	}
	shown.Envs = slices.Clone(c.Envs)
	for i, e := range shown.Envs {
		if e.Secrets == nil {
			continue
		}
		red := make(map[string]string, len(e.Secrets))
		for k := range e.Secrets {
			red[k] = Redacted
		}
		shown.Envs[i].Secrets = red
	}
	return yaml.Marshal(toDoc(reflect.ValueOf(shown)))
}

// toDoc turns a config value into nested maps keyed by mapstructure tags.
// Unset optional fields and maps render as null, so every key shows.
func toDoc(v reflect.Value) any {
	switch v.Kind() {
	case reflect.Struct:
		out := map[string]any{}
		for i := 0; i < v.NumField(); i++ {
			tag := v.Type().Field(i).Tag.Get("mapstructure")
			if tag == "" || tag == "-" {
				continue
			}
			out[tag] = toDoc(v.Field(i))
		}
		return out
	case reflect.Pointer:
		if v.IsNil() {
			return nil
		}
		return toDoc(v.Elem())
	case reflect.Map:
		if v.IsNil() {
			return nil
		}
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

// yamlLineRE matches the "yaml: line N: " prefix of the parser's errors.
var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): `)

// yamlSyntaxError names the line where a YAML syntax error is. The parser
// reports where the enclosing block began (an indentation error on line 4
// of a mapping opened on line 2 says "line 2"), so the error line is found
// as the first line whose prefix of the document fails with the same
// problem; if none does, the parser's own line stands.
func yamlSyntaxError(name string, data []byte, err error) error {
	msg := err.Error()
	m := yamlLineRE.FindStringSubmatch(msg)
	if m == nil {
		return fmt.Errorf("%s: not valid YAML: %w", name, err)
	}
	problem := msg[len(m[0]):]
	lines := bytes.SplitAfter(data, []byte("\n"))
	if len(lines) <= 2000 {
		var prefix []byte
		for i, l := range lines {
			prefix = append(prefix, l...)
			var v any
			perr := yaml.Unmarshal(prefix, &v)
			if perr == nil {
				continue
			}
			if pm := yamlLineRE.FindStringSubmatch(perr.Error()); pm != nil && perr.Error()[len(pm[0]):] == problem {
				return fmt.Errorf("%s:%d: not valid YAML: %s", name, i+1, problem)
			}
		}
	}
	return fmt.Errorf("%s:%s: not valid YAML: %s", name, m[1], problem)
}
