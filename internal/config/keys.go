package config

import (
	"fmt"
	"reflect"
	"sort"
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
		case f.Type.Kind() == reflect.Struct && f.Type.String() != "time.Duration":
			out = append(out, keyPaths(f.Type, key+".")...)
		case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct:
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

// UnknownKeyError is a key in a config file that ortrain does not know.
type UnknownKeyError struct {
	File       string
	Key        string // dotted path as written
	Suggestion string // nearest valid key, or ""
}

func (e *UnknownKeyError) Error() string {
	msg := fmt.Sprintf("%s: unknown key %q", e.File, e.Key)
	if e.Suggestion != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", e.Suggestion)
	}
	return msg + "; run 'ortrain run --print-config' to see every valid key"
}

// checkKeys walks a decoded YAML document against the schema of t and
// returns the first unknown key (in sorted order, so errors are stable).
func checkKeys(file string, doc map[string]any, t reflect.Type, prefix string, all []string) error {
	keys := make([]string, 0, len(doc))
	for k := range doc {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		f, ok := fieldByTag(t, k)
		if !ok {
			return &UnknownKeyError{File: file, Key: prefix + k, Suggestion: suggestKey(prefix, k, t, all)}
		}
		v := doc[k]
		switch {
		case f.Type.Kind() == reflect.Struct && f.Type.String() != "time.Duration":
			m, ok := asMap(v)
			if !ok {
				if v == nil {
					continue
				}
				return fmt.Errorf("%s: %s must be a mapping of keys, got %v", file, prefix+k, describe(v))
			}
			if err := checkKeys(file, m, f.Type, prefix+k+".", all); err != nil {
				return err
			}
		case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct:
			items, ok := v.([]any)
			if !ok {
				if v == nil {
					continue
				}
				return fmt.Errorf("%s: %s must be a list, got %v", file, prefix+k, describe(v))
			}
			for i, it := range items {
				m, ok := asMap(it)
				if !ok {
					return fmt.Errorf("%s: %s[%d] must be a mapping of keys, got %v", file, prefix+k, i, describe(it))
				}
				if err := checkKeys(file, m, f.Type.Elem(), fmt.Sprintf("%s%s[%d].", prefix, k, i), all); err != nil {
					return err
				}
			}
		}
	}
	return nil
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

func describe(v any) string {
	s := fmt.Sprintf("%v", v)
	if len(s) > 40 {
		s = s[:40] + "…"
	}
	return fmt.Sprintf("%T %q", v, s)
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
