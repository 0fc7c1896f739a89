package orsserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/ortrain/ortrain/internal/ors"
)

// paramField describes one field of a tool's parameter struct.
type paramField struct {
	name     string // JSON key
	kind     string // JSON Schema type
	required bool
}

// SchemaFor returns the JSON Schema the kit derives for the parameter
// struct P, in pydantic's layout: sorted top-level keys, properties in field
// order, titles from names ("max_len" → "Max Len"), required = fields that
// are neither pointers nor `omitempty`. A `desc:"..."` tag adds a
// description; the struct's name is the title.
func SchemaFor[P any]() (json.RawMessage, error) {
	s, _, err := schemaFor[P]()
	return s, err
}

func schemaFor[P any]() (json.RawMessage, []paramField, error) {
	t := reflect.TypeFor[P]()
	if t.Kind() != reflect.Struct {
		return nil, nil, fmt.Errorf("parameters must be a struct, got %s", t)
	}
	var props bytes.Buffer
	var fields []paramField
	var required []string
	props.WriteByte('{')
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, omitempty := jsonName(f)
		if name == "-" {
			continue
		}
		ft := f.Type
		optional := omitempty || ft.Kind() == reflect.Pointer
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		kind := jsonKind(ft)
		if len(fields) > 0 {
			props.WriteByte(',')
		}
		key, _ := ors.MarshalJSON(name)
		props.Write(key)
		props.WriteByte(':')
		props.Write(propertySchema(f, ft, kind, optional))
		fields = append(fields, paramField{name: name, kind: kind, required: !optional})
		if !optional {
			required = append(required, name)
		}
	}
	props.WriteByte('}')

	var out bytes.Buffer
	out.WriteString(`{"properties":`)
	out.Write(props.Bytes())
	if len(required) > 0 {
		req, _ := ors.MarshalJSON(required)
		out.WriteString(`,"required":`)
		out.Write(req)
	}
	title, _ := ors.MarshalJSON(t.Name())
	out.WriteString(`,"title":`)
	out.Write(title)
	out.WriteString(`,"type":"object"}`)
	return out.Bytes(), fields, nil
}

func propertySchema(f reflect.StructField, ft reflect.Type, kind string, optional bool) []byte {
	// Keys in sorted order, as pydantic emits them.
	var parts []string
	add := func(k string, v any) {
		b, _ := ors.MarshalJSON(v)
		parts = append(parts, strconv.Quote(k)+":"+string(b))
	}
	typeSchema := map[string]any{"type": kind}
	if kind == "array" {
		typeSchema["items"] = map[string]any{"type": jsonKind(ft.Elem())}
	}
	if optional && f.Type.Kind() == reflect.Pointer {
		add("anyOf", []any{typeSchema, map[string]any{"type": "null"}})
		add("default", nil)
	} else if optional {
		add("default", reflect.Zero(ft).Interface())
	}
	if d := f.Tag.Get("desc"); d != "" {
		add("description", d)
	}
	if it, ok := typeSchema["items"]; ok && !(optional && f.Type.Kind() == reflect.Pointer) {
		add("items", it)
	}
	name, _ := jsonName(f)
	add("title", titleOf(name))
	if !(optional && f.Type.Kind() == reflect.Pointer) {
		add("type", kind)
	}
	return []byte("{" + strings.Join(parts, ",") + "}")
}

func jsonName(f reflect.StructField) (string, bool) {
	tag := f.Tag.Get("json")
	name, opts, _ := strings.Cut(tag, ",")
	if name == "" {
		name = f.Name
	}
	return name, strings.Contains(opts, "omitempty")
}

func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice, reflect.Array:
		return "array"
	}
	return "object"
}

// titleOf mirrors pydantic's default field title: words split on "_",
// first letter of each upper-cased.
func titleOf(name string) string {
	words := strings.Split(name, "_")
	for i, w := range words {
		if w == "" {
			continue
		}
		r := []rune(w)
		r[0] = unicode.ToUpper(r[0])
		words[i] = string(r)
	}
	return strings.Join(words, " ")
}

// decodeParams validates input against fields (required keys present, no
// number for a string, numeric strings accepted for numbers as pydantic's
// lax mode does) and decodes it into dst. Unknown keys are ignored.
func decodeParams(input json.RawMessage, fields []paramField, dst any) error {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(input, &obj); err != nil || obj == nil {
		return &InputError{Detail: pyErrors([]pyError{{"model_type", "", "Input should be an object", string(input)}})}
	}
	var errs []pyError
	for _, f := range fields {
		raw, ok := obj[f.name]
		if !ok {
			if f.required {
				errs = append(errs, pyError{"missing", f.name, "Field required", string(input)})
			}
			continue
		}
		if string(raw) == "null" && !f.required {
			continue
		}
		fixed, e := checkKind(f, raw)
		if e != nil {
			errs = append(errs, *e)
			continue
		}
		obj[f.name] = fixed
	}
	if len(errs) > 0 {
		return &InputError{Detail: pyErrors(errs)}
	}
	norm, _ := json.Marshal(obj)
	if err := json.Unmarshal(norm, dst); err != nil {
		return &InputError{Detail: pyErrors([]pyError{{"value_error", "", err.Error(), string(input)}})}
	}
	return nil
}

func checkKind(f paramField, raw json.RawMessage) (json.RawMessage, *pyError) {
	c := firstByte(raw)
	bad := func(typ, msg string) *pyError { return &pyError{typ, f.name, msg, string(raw)} }
	switch f.kind {
	case "string":
		if c != '"' {
			return nil, bad("string_type", "Input should be a valid string")
		}
	case "boolean":
		if c != 't' && c != 'f' {
			return nil, bad("bool_type", "Input should be a valid boolean")
		}
	case "integer", "number":
		if c == '"' {
			var s string
			_ = json.Unmarshal(raw, &s)
			if _, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err != nil {
				return nil, bad(f.kind+"_parsing", "Input should be a valid "+f.kind)
			}
			raw = json.RawMessage(strings.TrimSpace(s))
			c = firstByte(raw)
		}
		if c != '-' && (c < '0' || c > '9') {
			return nil, bad(f.kind+"_type", "Input should be a valid "+f.kind)
		}
		if f.kind == "integer" {
			v, err := strconv.ParseFloat(string(raw), 64)
			if err != nil || v != float64(int64(v)) {
				return nil, bad("int_from_float", "Input should be a valid integer, got a number with a fractional part")
			}
			raw = json.RawMessage(strconv.FormatInt(int64(v), 10))
		}
	case "array":
		if c != '[' {
			return nil, bad("list_type", "Input should be a valid list")
		}
	case "object":
		if c != '{' {
			return nil, bad("dict_type", "Input should be a valid dictionary")
		}
	}
	return raw, nil
}

func firstByte(b []byte) byte {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return 0
	}
	return b[0]
}

// pyError is one pydantic-style validation error.
type pyError struct{ typ, loc, msg, input string }

// pyErrors renders errors like the repr of pydantic's error list, which is
// what the reference puts after "Tool input validation error: ".
func pyErrors(errs []pyError) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, e := range errs {
		if i > 0 {
			b.WriteString(", ")
		}
		loc := "()"
		if e.loc != "" {
			loc = "(" + pyQuote(e.loc) + ",)"
		}
		fmt.Fprintf(&b, "{'type': %s, 'loc': %s, 'msg': %s, 'input': %s}", pyQuote(e.typ), loc, pyQuote(e.msg), echoRepr(e.input))
	}
	b.WriteByte(']')
	return b.String()
}

func pyQuote(s string) string {
	if strings.Contains(s, "'") && !strings.Contains(s, `"`) {
		return `"` + s + `"`
	}
	return "'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", `\'`) + "'"
}

// echoRepr is pyRepr of an echoed input, capped as validation items are
// (the input is repeated per error, so a large one would multiply).
func echoRepr(raw string) string {
	if len(raw) > maxEchoBytes {
		return pyQuote(truncateText(raw, maxEchoBytes) + truncatedMark)
	}
	return pyRepr(raw)
}

// pyRepr renders a JSON value as Python's repr of the decoded value.
func pyRepr(raw string) string {
	var v any
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		return pyQuote(raw)
	}
	return reprValue(v)
}

func reprValue(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case bool:
		if x {
			return "True"
		}
		return "False"
	case float64:
		if x == float64(int64(x)) {
			return strconv.FormatInt(int64(x), 10)
		}
		return ors.FormatFloat(x)
	case string:
		return pyQuote(x)
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = reprValue(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case map[string]any:
		parts := make([]string, 0, len(x))
		for _, k := range slices.Sorted(maps.Keys(x)) {
			parts = append(parts, pyQuote(k)+": "+reprValue(x[k]))
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return fmt.Sprint(v)
}
