// Package jsonschema probes JSON Schemas the way a conformance check or a
// smoke run needs: the least value a schema admits, to call a tool or step
// an env with an input it should accept without knowing the env.
package jsonschema

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
)

// Minimal is the least value schema admits (see minimal), with schema as
// the root its $refs resolve against. Numbers in schema are json.Number
// (decode with UseNumber, as MinimalInput does).
func Minimal(schema map[string]any) any { return minimal(schema, schema, 0) }

// MinimalInput is the least object a tool's raw input schema admits: its
// required properties filled, nothing else; {} for an empty, invalid or
// non-object schema.
func MinimalInput(raw json.RawMessage) map[string]any {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var s map[string]any
	if len(raw) == 0 || dec.Decode(&s) != nil || s == nil {
		return map[string]any{}
	}
	if m, ok := Minimal(s).(map[string]any); ok {
		return m
	}
	return map[string]any{}
}

// intValue is v as an integer when it is a JSON integer.
func intValue(v any) (int64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	i, err := n.Int64()
	return i, err == nil
}

// minimal is the least value schema admits as far as a probe can
// tell: const, the first enum value, else per type "" / 0 / false / [] /
// {} (required properties filled), raised to minimum, minLength or
// minItems. root resolves $ref; depth stops reference cycles.
func minimal(root, s map[string]any, depth int) any {
	if s == nil || depth > 16 {
		return nil
	}
	if ref, ok := s["$ref"].(string); ok {
		return minimal(root, resolveRef(root, ref), depth+1)
	}
	if v, ok := s["const"]; ok {
		return v
	}
	if e, ok := s["enum"].([]any); ok && len(e) > 0 {
		return e[0]
	}
	for _, k := range []string{"anyOf", "oneOf", "allOf"} {
		alts, _ := s[k].([]any)
		for _, a := range alts {
			if m, ok := a.(map[string]any); ok && m["type"] != "null" {
				return minimal(root, m, depth+1)
			}
		}
	}
	switch schemaType(s) {
	case "string":
		n, _ := intValue(s["minLength"])
		return strings.Repeat("a", int(min(max(n, 0), 1<<10)))
	case "integer":
		return int64(math.Ceil(bounded(s, 0, 1)))
	case "number":
		return bounded(s, 0, 0.5)
	case "boolean":
		return false
	case "null":
		return nil
	case "array":
		n, _ := intValue(s["minItems"])
		items, _ := s["items"].(map[string]any)
		out := make([]any, 0, min(max(n, 0), 64))
		for range cap(out) {
			out = append(out, minimal(root, items, depth+1))
		}
		return out
	case "object":
		out := map[string]any{}
		props, _ := s["properties"].(map[string]any)
		req, _ := s["required"].([]any)
		for _, r := range req {
			name, _ := r.(string)
			ps, _ := props[name].(map[string]any)
			out[name] = minimal(root, ps, depth+1)
		}
		return out
	}
	return nil
}

// schemaType is s's type: the first non-null one of a list, "object" for
// an untyped schema with properties.
func schemaType(s map[string]any) string {
	switch t := s["type"].(type) {
	case string:
		return t
	case []any:
		for _, v := range t {
			if str, _ := v.(string); str != "" && str != "null" {
				return str
			}
		}
	}
	if _, ok := s["properties"]; ok {
		return "object"
	}
	return ""
}

// bounded moves v into s's minimum/maximum bounds; step is how far past
// an exclusive bound to go.
func bounded(s map[string]any, v, step float64) float64 {
	num := func(k string) (float64, bool) {
		n, ok := s[k].(json.Number)
		if !ok {
			return 0, false
		}
		f, err := n.Float64()
		return f, err == nil
	}
	if m, ok := num("minimum"); ok && v < m {
		v = m
	}
	if m, ok := num("exclusiveMinimum"); ok && v <= m {
		v = m + step
	}
	if m, ok := num("maximum"); ok && v > m {
		v = m
	}
	if m, ok := num("exclusiveMaximum"); ok && v >= m {
		v = m - step
	}
	return v
}

// resolveRef follows a local JSON pointer ("#/$defs/Name").
func resolveRef(root map[string]any, ref string) map[string]any {
	if !strings.HasPrefix(ref, "#") {
		return nil
	}
	var cur any = root
	for _, seg := range strings.Split(strings.TrimPrefix(ref, "#"), "/") {
		if seg == "" {
			continue
		}
		seg = strings.ReplaceAll(strings.ReplaceAll(seg, "~1", "/"), "~0", "~")
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[seg]
	}
	m, _ := cur.(map[string]any)
	return m
}
