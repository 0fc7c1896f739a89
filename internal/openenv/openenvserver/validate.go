package openenvserver

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"

	"github.com/ortrain/ortrain/internal/openenv"
	"github.com/ortrain/ortrain/internal/ors"
)

// FieldType is a JSON Schema type of an action field.
type FieldType string

// Field types.
const (
	Integer FieldType = "integer"
	Number  FieldType = "number"
	String  FieldType = "string"
	Boolean FieldType = "boolean"
	Object  FieldType = "object"
	Array   FieldType = "array"
)

// Field is one field of an action model.
type Field struct {
	Name        string
	Type        FieldType
	Description string
	Required    bool
	// Default is reported in the schema for optional fields.
	Default any
	// Minimum and Maximum are inclusive bounds for numbers (ge / le).
	Minimum, Maximum *float64
	// Const, when set, is the only string accepted (a Literal).
	Const string
}

// Bound returns a pointer to v, for Minimum and Maximum.
func Bound(v float64) *float64 { return &v }

const pydanticURL = "https://errors.pydantic.dev/2.13/v/"

func issue(typ string, loc []any, msg string, input json.RawMessage, ctx any) openenv.ValidationIssue {
	v := openenv.ValidationIssue{Type: typ, Loc: loc, Msg: msg, Input: input, URL: pydanticURL + typ}
	if v.Input == nil {
		v.Input = json.RawMessage("null")
	}
	if ctx != nil {
		v.Ctx, _ = json.Marshal(ctx)
	}
	return v
}

// metadataField is the base Action's optional metadata object.
var metadataSchema = `{"additionalProperties":true,"description":"Additional metadata for the action","title":"Metadata","type":"object"}`

// actionSchema renders the action model's JSON Schema as pydantic does.
func actionSchema(title, description string, fields []Field) json.RawMessage {
	var b bytes.Buffer
	b.WriteString(`{"additionalProperties":false`)
	if description != "" {
		b.WriteString(`,"description":`)
		b.Write(mustMarshal(description))
	}
	b.WriteString(`,"properties":{"metadata":`)
	b.WriteString(metadataSchema)
	var required []string
	for _, f := range fields {
		b.WriteByte(',')
		b.Write(mustMarshal(f.Name))
		b.WriteByte(':')
		b.Write(fieldSchema(f))
		if f.Required {
			required = append(required, f.Name)
		}
	}
	b.WriteByte('}')
	if len(required) > 0 {
		b.WriteString(`,"required":`)
		b.Write(mustMarshal(required))
	}
	b.WriteString(`,"title":`)
	b.Write(mustMarshal(title))
	b.WriteString(`,"type":"object"}`)
	return b.Bytes()
}

func fieldSchema(f Field) []byte {
	var parts []string
	add := func(k string, v any) { parts = append(parts, strconv.Quote(k)+":"+string(mustMarshal(v))) }
	if f.Const != "" {
		add("const", f.Const)
	}
	if !f.Required {
		add("default", f.Default)
	}
	if f.Description != "" {
		add("description", f.Description)
	}
	if f.Maximum != nil {
		add("maximum", jsonNumber(*f.Maximum))
	}
	if f.Minimum != nil {
		add("minimum", jsonNumber(*f.Minimum))
	}
	add("title", titleOf(f.Name))
	add("type", string(f.Type))
	return []byte("{" + strings.Join(parts, ",") + "}")
}

func titleOf(name string) string {
	words := strings.Split(name, "_")
	for i, w := range words {
		if w != "" {
			words[i] = strings.ToUpper(w[:1]) + w[1:]
		}
	}
	return strings.Join(words, " ")
}

// jsonNumber keeps integral bounds integral in JSON (1, not 1.0).
func jsonNumber(v float64) any {
	if v == math.Trunc(v) && math.Abs(v) < 1<<53 {
		return int64(v)
	}
	return v
}

func mustMarshal(v any) []byte {
	b, err := ors.MarshalJSON(v)
	if err != nil {
		panic(err) // only called on plain values
	}
	return b
}

// validateAction checks data (a JSON object) against fields in pydantic's
// lax mode: field order, then extra keys; numeric strings and integral
// floats pass as integers. It returns the normalised action.
func validateAction(data json.RawMessage, fields []Field) (json.RawMessage, []openenv.ValidationIssue) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil || obj == nil {
		return nil, []openenv.ValidationIssue{issue("model_type", []any{}, "Input should be a valid dictionary", data, nil)}
	}
	var issues []openenv.ValidationIssue
	known := map[string]bool{"metadata": true}
	for _, f := range fields {
		known[f.Name] = true
		raw, ok := obj[f.Name]
		if !ok {
			if f.Required {
				issues = append(issues, issue("missing", []any{f.Name}, "Field required", data, nil))
			}
			continue
		}
		fixed, bad := checkField(f, raw)
		if bad != nil {
			issues = append(issues, *bad)
			continue
		}
		obj[f.Name] = fixed
	}
	if md, ok := obj["metadata"]; ok && firstByte(md) != '{' {
		issues = append(issues, issue("dict_type", []any{"metadata"}, "Input should be a valid dictionary", md, nil))
	}
	for _, k := range sortedKeys(obj) {
		if !known[k] {
			issues = append(issues, issue("extra_forbidden", []any{k}, "Extra inputs are not permitted", obj[k], nil))
		}
	}
	if len(issues) > 0 {
		return nil, issues
	}
	out, _ := json.Marshal(obj)
	return out, nil
}

func checkField(f Field, raw json.RawMessage) (json.RawMessage, *openenv.ValidationIssue) {
	loc := []any{f.Name}
	bad := func(typ, msg string, ctx any) *openenv.ValidationIssue {
		v := issue(typ, loc, msg, raw, ctx)
		return &v
	}
	c := firstByte(raw)
	switch f.Type {
	case String:
		if c != '"' {
			return nil, bad("string_type", "Input should be a valid string", nil)
		}
		if f.Const != "" {
			var s string
			_ = json.Unmarshal(raw, &s)
			if s != f.Const {
				return nil, bad("literal_error", "Input should be '"+f.Const+"'", map[string]string{"expected": "'" + f.Const + "'"})
			}
		}
		return raw, nil
	case Boolean:
		if c != 't' && c != 'f' {
			return nil, bad("bool_type", "Input should be a valid boolean", nil)
		}
		return raw, nil
	case Object:
		if c != '{' {
			return nil, bad("dict_type", "Input should be a valid dictionary", nil)
		}
		return raw, nil
	case Array:
		if c != '[' {
			return nil, bad("list_type", "Input should be a valid list", nil)
		}
		return raw, nil
	}
	// integer or number
	kind := "integer"
	typPrefix := "int"
	if f.Type == Number {
		kind, typPrefix = "number", "float"
	}
	num := raw
	if c == '"' {
		var s string
		_ = json.Unmarshal(raw, &s)
		if _, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err != nil {
			msg := "Input should be a valid number, unable to parse string as a number"
			if f.Type == Integer {
				msg = "Input should be a valid integer, unable to parse string as an integer"
			}
			return nil, bad(typPrefix+"_parsing", msg, nil)
		}
		num = json.RawMessage(strings.TrimSpace(s))
		c = firstByte(num)
	}
	if c != '-' && (c < '0' || c > '9') {
		return nil, bad(typPrefix+"_type", "Input should be a valid "+kind, nil)
	}
	v, err := strconv.ParseFloat(string(num), 64)
	if err != nil {
		return nil, bad(typPrefix+"_type", "Input should be a valid "+kind, nil)
	}
	if f.Type == Integer {
		if v != math.Trunc(v) {
			return nil, bad("int_from_float", "Input should be a valid integer, got a number with a fractional part", nil)
		}
		num = json.RawMessage(strconv.FormatFloat(v, 'f', -1, 64))
	}
	if f.Minimum != nil && v < *f.Minimum {
		return nil, bad("greater_than_equal", "Input should be greater than or equal to "+numText(*f.Minimum), map[string]any{"ge": jsonNumber(*f.Minimum)})
	}
	if f.Maximum != nil && v > *f.Maximum {
		return nil, bad("less_than_equal", "Input should be less than or equal to "+numText(*f.Maximum), map[string]any{"le": jsonNumber(*f.Maximum)})
	}
	return num, nil
}

func firstByte(b []byte) byte {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return 0
	}
	return b[0]
}

// numText writes a bound as pydantic's message does: 1, not 1.0.
func numText(v float64) string { return string(mustMarshal(jsonNumber(v))) }
