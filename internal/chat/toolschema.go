package chat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// objectSchema is the part of a tool's JSON Schema that types text
// argument values: the top-level properties, required and
// additionalProperties.
type objectSchema struct {
	properties map[string]json.RawMessage
	order      []string // property names as the schema lists them, for messages
	required   []string
	closed     bool // additionalProperties: false
}

// toolSchemas reads the schemas of the offered tools by name. A tool whose
// schema does not parse is left out (its arguments stay untyped).
func toolSchemas(tools []Tool) map[string]*objectSchema {
	if len(tools) == 0 {
		return nil
	}
	out := make(map[string]*objectSchema, len(tools))
	for _, t := range tools {
		s := &objectSchema{}
		if len(bytes.TrimSpace(t.Parameters)) > 0 && string(bytes.TrimSpace(t.Parameters)) != "null" {
			var raw struct {
				Properties           json.RawMessage `json:"properties"`
				Required             []string        `json:"required"`
				AdditionalProperties json.RawMessage `json:"additionalProperties"`
			}
			if json.Unmarshal(t.Parameters, &raw) != nil {
				continue
			}
			if len(raw.Properties) > 0 {
				if json.Unmarshal(raw.Properties, &s.properties) != nil {
					continue
				}
				s.order = objectKeys(raw.Properties)
			}
			s.required = raw.Required
			s.closed = string(bytes.TrimSpace(raw.AdditionalProperties)) == "false"
		}
		out[t.Name] = s
	}
	return out
}

// objectKeys lists a JSON object's keys in document order.
func objectKeys(raw json.RawMessage) []string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return keys
		}
		key, _ := tok.(string)
		keys = append(keys, key)
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return keys
		}
	}
	return keys
}

// typeArguments builds the arguments object from text values. With a
// schema, each value is typed by its property; the first mismatch is
// returned as a violation message for the model.
func typeArguments(schema *objectSchema, params []textParam) (json.RawMessage, string) {
	var b bytes.Buffer
	b.WriteByte('{')
	seen := make(map[string]bool, len(params))
	for i, prm := range params {
		if seen[prm.key] {
			return nil, fmt.Sprintf("parameter %q is given twice", prm.key)
		}
		seen[prm.key] = true
		value := prm.value
		if prm.trimNewline {
			value = strings.TrimSuffix(strings.TrimPrefix(value, "\n"), "\n")
		}
		var typed []byte
		prop, known := json.RawMessage(nil), false
		if schema != nil {
			prop, known = schema.properties[prm.key]
		}
		switch {
		case known:
			v, err := typeValue(prop, value)
			if err != nil {
				return nil, fmt.Sprintf("parameter %q: %v", prm.key, err)
			}
			typed = v
		case schema != nil && schema.closed:
			return nil, fmt.Sprintf("unknown parameter %q (the tool takes: %s)", prm.key, strings.Join(schema.order, ", "))
		default:
			typed = untypedValue(value)
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.Write(jsonString(prm.key))
		b.WriteString(": ")
		b.Write(typed)
	}
	b.WriteByte('}')
	if schema != nil {
		for _, r := range schema.required {
			if !seen[r] {
				return nil, fmt.Sprintf("missing required parameter %q", r)
			}
		}
	}
	return json.RawMessage(b.Bytes()), ""
}

// untypedValue is a value without a schema: the JSON it spells when it is
// JSON, else a string.
func untypedValue(value string) []byte {
	if trimmed := strings.TrimSpace(value); trimmed != "" && json.Valid([]byte(trimmed)) {
		return []byte(trimmed)
	}
	return jsonString(value)
}

// propertySchema is what typeValue reads of one property's schema.
type propertySchema struct {
	Type  json.RawMessage   `json:"type"`
	Enum  []json.RawMessage `json:"enum"`
	AnyOf []propertySchema  `json:"anyOf"`
	OneOf []propertySchema  `json:"oneOf"`
}

func (s propertySchema) types() []string {
	var out []string
	var one string
	var many []string
	switch {
	case json.Unmarshal(s.Type, &one) == nil && one != "":
		out = append(out, one)
	case json.Unmarshal(s.Type, &many) == nil:
		out = append(out, many...)
	}
	for _, branch := range append(slices.Clone(s.AnyOf), s.OneOf...) {
		for _, t := range branch.types() {
			if !slices.Contains(out, t) {
				out = append(out, t)
			}
		}
	}
	return out
}

// typeValue types one text value by its property schema. Types other than
// string are tried first (in schema order); string takes any text. The
// typed value must be in the enum when there is one.
func typeValue(prop json.RawMessage, value string) ([]byte, error) {
	var s propertySchema
	if err := json.Unmarshal(prop, &s); err != nil {
		return untypedValue(value), nil // not an object schema (true, {}): anything goes
	}
	types := s.types()
	var candidates [][]byte
	if len(types) == 0 {
		candidates = [][]byte{untypedValue(value), jsonString(value)}
	} else {
		trimmed := strings.TrimSpace(value)
		for _, t := range types {
			if v, ok := convertText(t, trimmed); ok {
				candidates = append(candidates, v)
			}
		}
		if slices.Contains(types, "string") {
			candidates = append(candidates, jsonString(value))
		}
		if len(candidates) == 0 {
			return nil, fmt.Errorf("want %s, got %q", strings.Join(types, " or "), truncate(value))
		}
	}
	if len(s.Enum) == 0 {
		return candidates[0], nil
	}
	for _, c := range candidates {
		if inEnum(c, s.Enum) {
			return c, nil
		}
	}
	allowed := make([]string, len(s.Enum))
	for i, e := range s.Enum {
		allowed[i] = string(bytes.TrimSpace(e))
	}
	return nil, fmt.Errorf("want one of %s, got %q", strings.Join(allowed, ", "), truncate(value))
}

// convertText parses trimmed text as a JSON Schema type other than string
// (Python spellings of booleans and None are accepted, as templates print
// them with |string).
func convertText(typ, text string) ([]byte, bool) {
	switch typ {
	case "null":
		if text == "null" || text == "None" {
			return []byte("null"), true
		}
	case "boolean":
		switch text {
		case "true", "True":
			return []byte("true"), true
		case "false", "False":
			return []byte("false"), true
		}
	case "integer":
		// JSON Schema counts 3.0 as an integer; it is passed on as 3.
		if whole, frac, ok := strings.Cut(text, "."); ok && frac != "" && strings.Trim(frac, "0") == "" {
			text = whole
		}
		if isJSONNumber(text) && !strings.ContainsAny(text, ".eE") {
			return []byte(text), true
		}
	case "number":
		if isJSONNumber(text) {
			return []byte(text), true
		}
	case "object", "array":
		open := byte('{')
		if typ == "array" {
			open = '['
		}
		if text != "" && text[0] == open && json.Valid([]byte(text)) {
			return []byte(text), true
		}
	}
	return nil, false
}

func isJSONNumber(s string) bool {
	return s != "" && (s[0] == '-' || s[0] >= '0' && s[0] <= '9') && json.Valid([]byte(s))
}

func inEnum(value []byte, enum []json.RawMessage) bool {
	var v any
	if json.Unmarshal(value, &v) != nil {
		return false
	}
	for _, e := range enum {
		var ev any
		if json.Unmarshal(e, &ev) == nil && reflect.DeepEqual(v, ev) {
			return true
		}
	}
	return false
}
