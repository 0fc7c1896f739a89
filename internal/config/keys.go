package config

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
)

// The schema of config keys is derived from the mapstructure tags of Config,
// so the struct is the single source of truth for valid keys.

// keyPaths lists every valid dotted key of t ("grpo.learning_rate",
// "envs[].target"). Maps are leaves: any sub-key is accepted under them.
func keyPaths(t reflect.Type, prefix string) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("mapstructure")
		if tag == "" || tag == "-" {
			continue
		}
		key := prefix + tag
		switch {
		case isStruct(f.Type):
			out = append(out, keyPaths(f.Type, key+".")...)
		case f.Type.Kind() == reflect.Slice && isStruct(f.Type.Elem()):
			out = append(out, keyPaths(f.Type.Elem(), key+"[].")...)
		default:
			out = append(out, key)
		}
	}
	return out
}

// fieldByTag finds the struct field carrying mapstructure tag name.
func fieldByTag(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		if f := t.Field(i); f.Tag.Get("mapstructure") == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// UnknownKeyError is a key in a config file, or an ORTRAIN_* environment
// variable, that ortrain does not know.
type UnknownKeyError struct {
	// Source is the config file's name, or "environment" for a variable.
	Source string
	// Key is the dotted path as written (envs[0].splt) or the variable's
	// name (ORTRAIN_GRPO_LEARNIN_RATE).
	Key string
	// Suggestion is the nearest valid key or variable, or "".
	Suggestion string
	// TRL is what does the job of a TRL setting of that name here, or "".
	TRL string
}

// EnvironmentSource is UnknownKeyError.Source for an ORTRAIN_* variable.
const EnvironmentSource = "environment"

func (e *UnknownKeyError) line() string {
	what := "key"
	if e.Source == EnvironmentSource {
		what = "variable"
	}
	msg := fmt.Sprintf("%s: unknown %s %q", e.Source, what, e.Key)
	if e.TRL != "" {
		return msg + " (a TRL setting; in ortrain: " + e.TRL + ")"
	}
	if e.Suggestion != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", e.Suggestion)
	}
	return msg
}

const listKeysHint = "run 'ortrain run --print-config' to see every valid key"

func (e *UnknownKeyError) Error() string { return e.line() + "; " + listKeysHint }

// UnknownKeysError reports every unknown key of a file and every unknown
// ORTRAIN_* variable at once. errors.As also finds each *UnknownKeyError.
type UnknownKeysError struct {
	Keys []*UnknownKeyError
}

func (e *UnknownKeysError) Error() string {
	if len(e.Keys) == 1 {
		return e.Keys[0].Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d unknown settings (%s):", len(e.Keys), listKeysHint)
	for _, k := range e.Keys {
		b.WriteString("\n  " + k.line())
	}
	return b.String()
}

// Unwrap gives errors.As and errors.Is each unknown key.
func (e *UnknownKeysError) Unwrap() []error {
	out := make([]error, len(e.Keys))
	for i, k := range e.Keys {
		out[i] = k
	}
	return out
}

// docProblems collects what is wrong with a config document, so that one
// error can report all of it.
type docProblems struct {
	source  string
	unknown []*UnknownKeyError
	types   []error
}

func (p *docProblems) typeError(field string, bad *TypeError) {
	bad.Source, bad.Field = p.source, field+bad.Field
	p.types = append(p.types, bad)
}

// checkDoc walks a decoded YAML document against the schema of t (keys in
// sorted order, so reports are stable), records every unknown key and every
// value of the wrong type, and returns the document with values converted
// to their fields' Go types (durations parsed, lists split).
func checkDoc(p *docProblems, doc map[string]any, t reflect.Type, prefix string, all []string) map[string]any {
	out := make(map[string]any, len(doc))
	for _, k := range slices.Sorted(maps.Keys(doc)) {
		f, ok := fieldByTag(t, k)
		if !ok {
			uk := &UnknownKeyError{Source: p.source, Key: prefix + k}
			if trl, ok := TRLEquivalent(k); ok {
				uk.TRL = trl
			} else {
				uk.Suggestion = suggestKey(prefix, k, t, all)
			}
			p.unknown = append(p.unknown, uk)
			continue
		}
		v, key := doc[k], prefix+k
		switch {
		case v == nil && isStruct(f.Type):
			// an empty section sets nothing
		case v == nil:
			out[k] = nil
		case isStruct(f.Type):
			m, ok := asMap(v)
			if !ok {
				p.typeError(key, &TypeError{Value: v, Want: "a mapping of keys"})
				continue
			}
			out[k] = checkDoc(p, m, f.Type, key+".", all)
		case f.Type.Kind() == reflect.Slice && isStruct(f.Type.Elem()):
			items, ok := v.([]any)
			if !ok {
				p.typeError(key, &TypeError{Value: v, Want: "a list"})
				continue
			}
			list := make([]any, len(items))
			for i, it := range items {
				item := fmt.Sprintf("%s[%d]", key, i)
				m, ok := asMap(it)
				if !ok {
					p.typeError(item, &TypeError{Value: it, Want: "a mapping of keys"})
					continue
				}
				list[i] = checkDoc(p, m, f.Type.Elem(), item+".", all)
			}
			out[k] = list
		default:
			n, bad := normalize(f.Type, v)
			if bad != nil {
				p.typeError(key, bad)
				continue
			}
			out[k] = n
		}
	}
	return out
}

func asMap(v any) (map[string]any, bool) {
	switch m := v.(type) {
	case map[string]any:
		return m, true
	case map[any]any:
		out := make(map[string]any, len(m))
		for k, x := range m {
			out[fmt.Sprint(k)] = x
		}
		return out, true
	}
	return nil, false
}

// suggestKey proposes the nearest valid key: first a sibling at the same
// level with a small edit distance, then any key in the schema whose last
// segment matches closely (a top-level learning_rate → grpo.learning_rate).
func suggestKey(prefix, bad string, t reflect.Type, all []string) string {
	best, bestD := "", 1<<30
	for i := 0; i < t.NumField(); i++ {
		tag := t.Field(i).Tag.Get("mapstructure")
		if tag == "" {
			continue
		}
		if d := levenshtein(bad, tag); d < bestD {
			best, bestD = prefix+tag, d
		}
	}
	if bestD <= maxDistance(bad) {
		return best
	}
	best, bestD = "", 1<<30
	for _, k := range all {
		leaf := k[strings.LastIndex(k, ".")+1:]
		if d := levenshtein(bad, leaf); d < bestD {
			best, bestD = strings.ReplaceAll(k, "[]", "[0]"), d
		}
	}
	if bestD <= maxDistance(bad) {
		return best
	}
	return ""
}

func maxDistance(s string) int {
	if d := len(s) / 3; d > 2 {
		return d
	}
	return 2
}

// levenshtein is the edit distance between a and b (bytes; keys are ASCII).
func levenshtein(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// envKeys maps each ORTRAIN_* variable that sets a config key to its key.
// Keys inside list items (envs[].target) have no variable.
func envKeys() map[string]string {
	out := map[string]string{}
	for _, k := range Keys() {
		if !strings.Contains(k, "[]") {
			out[EnvVarFor(k)] = k
		}
	}
	return out
}

// OtherEnvVars lists the ORTRAIN_* variables that are not config keys but
// are read elsewhere (the worker library path, test and build switches), so
// they are not reported as misspelled.
func OtherEnvVars() []string {
	return []string{"ORTRAIN_WORKER_LIB", "ORTRAIN_REQUIRE_WORKER", "ORTRAIN_BUILD_DIR", "ORTRAIN_PROBE_CHILD", "ORTRAIN_SKIP_TEST_TOOLS", "ORTRAIN_LAUNCHER",
		"ORTRAIN_CACHE_DIR", "ORTRAIN_WORKER_ONEDNN"}
}

// toolEnvPrefixes are the ORTRAIN_* prefixes of the scripts' own settings
// (the forky and CUDA roots, the Hugging Face parity check, apt logs): a
// shell that exported one for a script can still run ortrain.
var toolEnvPrefixes = []string{"ORTRAIN_FORKY_", "ORTRAIN_CUDA_", "ORTRAIN_HF_", "ORTRAIN_APT_"}

func isToolEnvVar(name string) bool {
	for _, p := range toolEnvPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// unknownEnvVars reports every ORTRAIN_* variable in environ (KEY=VALUE
// pairs) that sets no config key, each with the nearest valid variable.
func unknownEnvVars(environ []string) []*UnknownKeyError {
	valid := envKeys()
	var out []*UnknownKeyError
	seen := map[string]bool{}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, EnvPrefix) || seen[name] {
			continue
		}
		seen[name] = true
		if _, ok := valid[name]; ok || slices.Contains(OtherEnvVars(), name) || isToolEnvVar(name) {
			continue
		}
		out = append(out, &UnknownKeyError{Source: EnvironmentSource, Key: name, Suggestion: suggestEnvVar(name, valid)})
	}
	slices.SortFunc(out, func(a, b *UnknownKeyError) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// suggestEnvVar proposes the nearest valid variable: first by edit
// distance of the whole name, then by the last segment of the key
// (ORTRAIN_LEARNING_RATE → ORTRAIN_GRPO_LEARNING_RATE).
func suggestEnvVar(name string, valid map[string]string) string {
	// A key written without its section (ORTRAIN_LEARNING_RATE) names a
	// leaf exactly: the first section holding it (grpo before sft) wins
	// over a nearer whole name.
	for _, v := range slices.Sorted(maps.Keys(valid)) {
		k := valid[v]
		if strings.EqualFold(k[strings.LastIndex(k, ".")+1:], strings.TrimPrefix(name, EnvPrefix)) {
			return v
		}
	}
	best, bestD := "", 1<<30
	for _, v := range slices.Sorted(maps.Keys(valid)) {
		if d := levenshtein(name, v); d < bestD {
			best, bestD = v, d
		}
	}
	if bestD <= maxDistance(strings.TrimPrefix(name, EnvPrefix)) {
		return best
	}
	bare := strings.ToLower(strings.TrimPrefix(name, EnvPrefix))
	best, bestD = "", 1<<30
	for _, v := range slices.Sorted(maps.Keys(valid)) {
		k := valid[v]
		leaf := k[strings.LastIndex(k, ".")+1:]
		if d := levenshtein(bare, leaf); d < bestD {
			best, bestD = v, d
		}
	}
	if bestD <= maxDistance(bare) {
		return best
	}
	return ""
}

// DefaultText is key's embedded default as --help shows it: strings bare,
// numbers as written, lists in brackets ("" for an empty string or list).
func DefaultText(key string) string {
	v := valueAt(reflect.ValueOf(Default()), key)
	switch {
	case v.Kind() == reflect.String:
		return v.String()
	case v.Kind() == reflect.Slice && v.Len() == 0:
		return ""
	}
	return settingText(v)
}
