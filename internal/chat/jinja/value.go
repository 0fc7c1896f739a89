package jinja

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Value is a template value with Python semantics. The dynamic types are:
// nil (None), bool, int64, float64, string, []Value (list or tuple),
// *Dict, *Namespace, Undefined, and callables (*macro, builtinFunc).
type Value = any

// Tuple is a Python tuple: like a list, but printed with parentheses.
type Tuple []Value

// asList views tuples as lists for the operations that treat them alike.
func asList(v Value) Value {
	switch t := v.(type) {
	case Tuple:
		return []Value(t)
	case GroupTuple:
		return []Value(t)
	}
	return v
}

// Undefined is a missing variable, attribute or item. It prints as "",
// is falsy and iterates as empty, like jinja2's default Undefined.
type Undefined struct{ Name string }

// Dict is an insertion-ordered string-keyed mapping (Python dict).
type Dict struct {
	keys []string
	m    map[string]Value
}

// NewDict returns an empty Dict.
func NewDict() *Dict { return &Dict{m: map[string]Value{}} }

// Set stores v under k, keeping k's first insertion position.
func (d *Dict) Set(k string, v Value) {
	if _, ok := d.m[k]; !ok {
		d.keys = append(d.keys, k)
	}
	d.m[k] = v
}

// Get returns the value under k.
func (d *Dict) Get(k string) (Value, bool) {
	v, ok := d.m[k]
	return v, ok
}

// Keys returns the keys in insertion order.
func (d *Dict) Keys() []string { return d.keys }

// Len is the number of entries.
func (d *Dict) Len() int { return len(d.keys) }

// Namespace is the mutable object namespace() returns.
type Namespace struct{ attrs *Dict }

// FromJSON decodes JSON into template values, keeping object key order and
// telling integers (int64) from floats (float64) as Python's json does.
func FromJSON(data []byte) (Value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeJSONValue(dec)
	if err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, fmt.Errorf("trailing data after JSON value")
	}
	return v, nil
}

func decodeJSONValue(dec *json.Decoder) (Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			list := []Value{}
			for dec.More() {
				v, err := decodeJSONValue(dec)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			_, err := dec.Token()
			return list, err
		}
		d := NewDict()
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return nil, err
			}
			v, err := decodeJSONValue(dec)
			if err != nil {
				return nil, err
			}
			d.Set(kt.(string), v)
		}
		_, err := dec.Token()
		return d, err
	case json.Number:
		if i, err := strconv.ParseInt(string(t), 10, 64); err == nil {
			return i, nil
		}
		return strconv.ParseFloat(string(t), 64)
	default:
		return t, nil // string, bool, nil
	}
}

// truthy is Python's bool().
func truthy(v Value) bool {
	switch x := asList(v).(type) {
	case nil, Undefined:
		return false
	case bool:
		return x
	case int64:
		return x != 0
	case *big.Int:
		return x.Sign() != 0
	case float64:
		return x != 0
	case string:
		return x != ""
	case []Value:
		return len(x) > 0
	case *Dict:
		return x.Len() > 0
	}
	return true
}

// toFloat converts numbers (and bools, which are ints in Python).
func toFloat(v Value) (float64, bool) {
	switch x := v.(type) {
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	case int64:
		return float64(x), true
	case *big.Int:
		return bigToFloat(x), true
	case float64:
		return x, true
	}
	return 0, false
}

func toInt(v Value) (int64, bool) {
	switch x := v.(type) {
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	case int64:
		return x, true
	}
	return 0, false
}

// equal is Python's ==.
func equal(a, b Value) bool {
	if isBig(a) || isBig(b) {
		ab, aok := asBig(a)
		bb, bok := asBig(b)
		if aok && bok {
			return ab.Cmp(bb) == 0
		}
	}
	if fa, ok := toFloat(a); ok {
		fb, ok := toFloat(b)
		return ok && fa == fb
	}
	switch x := a.(type) {
	case nil:
		return b == nil
	case Undefined:
		_, ok := b.(Undefined)
		return ok
	case string:
		y, ok := b.(string)
		return ok && x == y
	case Tuple:
		y, ok := b.(Tuple)
		return ok && equal([]Value(x), []Value(y))
	case []Value:
		y, ok := b.([]Value)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equal(x[i], y[i]) {
				return false
			}
		}
		return true
	case *Dict:
		y, ok := b.(*Dict)
		if !ok || x.Len() != y.Len() {
			return false
		}
		for _, k := range x.keys {
			yv, ok := y.m[k]
			if !ok || !equal(x.m[k], yv) {
				return false
			}
		}
		return true
	}
	return a == b
}

// compare orders numbers and strings (Python <, >).
func compare(a, b Value) (int, error) {
	if isBig(a) || isBig(b) {
		ab, aok := asBig(a)
		bb, bok := asBig(b)
		if aok && bok {
			return ab.Cmp(bb), nil
		}
	}
	if fa, ok := toFloat(a); ok {
		if fb, ok := toFloat(b); ok {
			switch {
			case fa < fb:
				return -1, nil
			case fa > fb:
				return 1, nil
			}
			return 0, nil
		}
	}
	if sa, ok := a.(string); ok {
		if sb, ok := b.(string); ok {
			return strings.Compare(sa, sb), nil
		}
	}
	// Lists and tuples compare item by item, as in Python.
	if la, ok := asList(a).([]Value); ok {
		if lb, ok := asList(b).([]Value); ok && typeName(a) == typeName(b) {
			for i := 0; i < len(la) && i < len(lb); i++ {
				if equal(la[i], lb[i]) {
					continue
				}
				return compare(la[i], lb[i])
			}
			return cmpInt(len(la), len(lb)), nil
		}
	}
	return 0, fmt.Errorf("'<' not supported between instances of '%s' and '%s'", typeName(a), typeName(b))
}

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func typeName(v Value) string {
	switch v.(type) {
	case nil:
		return "NoneType"
	case bool:
		return "bool"
	case int64, *big.Int:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []Value:
		return "list"
	case Tuple:
		return "tuple"
	case GroupTuple:
		return "_GroupTuple"
	case *Dict:
		return "dict"
	case Undefined:
		return "Undefined"
	case *Namespace:
		return "Namespace"
	}
	return "function"
}

// toStr is Python's str() as Jinja prints it.
func toStr(v Value) string {
	switch x := v.(type) {
	case string:
		return x
	case Undefined:
		return ""
	}
	return repr(v)
}

// repr is Python's repr().
func repr(v Value) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case bool:
		if x {
			return "True"
		}
		return "False"
	case int64:
		return strconv.FormatInt(x, 10)
	case *big.Int:
		return x.String()
	case float64:
		return pyFloat(x)
	case string:
		return reprString(x)
	case Undefined:
		return ""
	case []Value:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = repr(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case Tuple:
		if len(x) == 1 {
			return "(" + repr(x[0]) + ",)"
		}
		s := repr([]Value(x))
		return "(" + s[1:len(s)-1] + ")"
	case *Dict:
		parts := make([]string, len(x.keys))
		for i, k := range x.keys {
			parts[i] = reprString(k) + ": " + repr(x.m[k])
		}
		return "{" + strings.Join(parts, ", ") + "}"
	case *Namespace:
		return "<Namespace " + repr(x.attrs) + ">"
	}
	return fmt.Sprintf("<%s>", typeName(v))
}

func reprString(s string) string {
	quote := byte('\'')
	if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
		quote = '"'
	}
	var b strings.Builder
	b.WriteByte(quote)
	for _, r := range s {
		switch {
		case r == rune(quote) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == ' ' || unicode.IsPrint(r):
			b.WriteRune(r)
		case r < 0x100:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r < 0x10000:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
	}
	b.WriteByte(quote)
	return b.String()
}

// pyFloat is Python's float repr: shortest round-trip digits, fixed
// notation for exponents in [-4, 16), else d.ddde±XX.
func pyFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // -d.ddde±XX
	mant, expStr, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expStr)
	neg := strings.HasPrefix(mant, "-")
	digits := strings.Replace(strings.TrimPrefix(mant, "-"), ".", "", 1)
	var out string
	if exp >= -4 && exp < 16 {
		if exp >= 0 {
			if len(digits) <= exp+1 {
				out = digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
			} else {
				out = digits[:exp+1] + "." + digits[exp+1:]
			}
		} else {
			out = "0." + strings.Repeat("0", -exp-1) + digits
		}
	} else {
		out = digits[:1]
		if len(digits) > 1 {
			out += "." + digits[1:]
		}
		sign := "+"
		if exp < 0 {
			sign, exp = "-", -exp
		}
		out += fmt.Sprintf("e%s%02d", sign, exp)
	}
	if neg {
		out = "-" + out
	}
	return out
}

// toJSON is transformers' tojson: json.dumps(x, ensure_ascii=False,
// indent=indent, separators=None, sort_keys=sortKeys).
// jsonOptions are json.dumps's: indent (nil: one line), separators,
// sort_keys and ensure_ascii.
type jsonOptions struct {
	indent          *string
	itemSep, keySep string
	sortKeys, ascii bool
}

// newJSONOptions applies json.dumps's defaults: separators are (", ",
// ": "), or (",", ": ") when indenting.
func newJSONOptions(indent *string, sortKeys, ascii bool) jsonOptions {
	o := jsonOptions{indent: indent, itemSep: ", ", keySep: ": ", sortKeys: sortKeys, ascii: ascii}
	if indent != nil {
		o.itemSep = ","
	}
	return o
}

func toJSON(v Value, o jsonOptions) (string, error) {
	var b strings.Builder
	err := writeJSON(&b, v, o, 0)
	return b.String(), err
}

func writeJSON(b *strings.Builder, v Value, o jsonOptions, depth int) error {
	newline := func(d int) {
		if o.indent != nil {
			b.WriteByte('\n')
			b.WriteString(strings.Repeat(*o.indent, d))
		}
	}
	switch x := asList(v).(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(map[bool]string{true: "true", false: "false"}[x])
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case *big.Int:
		b.WriteString(x.String())
	case float64:
		switch {
		case math.IsInf(x, 1):
			b.WriteString("Infinity")
		case math.IsInf(x, -1):
			b.WriteString("-Infinity")
		case math.IsNaN(x):
			b.WriteString("NaN")
		default:
			b.WriteString(pyFloat(x))
		}
	case string:
		writeJSONString(b, x, o.ascii)
	case []Value:
		if len(x) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			newline(depth + 1)
			if err := writeJSON(b, e, o, depth+1); err != nil {
				return err
			}
		}
		newline(depth)
		b.WriteByte(']')
	case *Dict:
		if x.Len() == 0 {
			b.WriteString("{}")
			return nil
		}
		keys := x.keys
		if o.sortKeys {
			keys = append([]string(nil), keys...)
			sort.Strings(keys)
		}
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			newline(depth + 1)
			writeJSONString(b, k, o.ascii)
			b.WriteString(o.keySep)
			if err := writeJSON(b, x.m[k], o, depth+1); err != nil {
				return err
			}
		}
		newline(depth)
		b.WriteByte('}')
	case *Namespace:
		return writeJSON(b, x.attrs, o, depth)
	default:
		return fmt.Errorf("Object of type %s is not JSON serializable", typeName(v))
	}
	return nil
}

// writeJSONString escapes like Python's json: with ascii
// (ensure_ascii=True) every character outside space..~ is \\uXXXX
// (surrogate pairs above U+FFFF).
func writeJSONString(b *strings.Builder, s string, ascii bool) {
	b.WriteByte('"')
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r < 0x20, ascii && r > 0x7e && r < 0x10000:
			fmt.Fprintf(b, `\u%04x`, r)
		case ascii && r >= 0x10000:
			hi, lo := utf16.EncodeRune(r)
			fmt.Fprintf(b, `\u%04x\u%04x`, hi, lo)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	b.WriteByte('"')
}
