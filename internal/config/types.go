package config

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"go.yaml.in/yaml/v3"
)

// TypeError is a config value of the wrong type. It names where the value
// came from, the field, and the expected type in words, never a parser's
// message (no strconv.ParseInt, no "time: invalid duration").
type TypeError struct {
	// Source is the config file, the ORTRAIN_* variable or the --flag that
	// gave the value; empty when it is not known.
	Source string
	// Field is the dotted key, list items indexed: envs[0].num_tasks.
	Field string
	Value any
	// Want is the expected type in words: "a whole number".
	Want string
}

func (e *TypeError) Error() string {
	msg := fmt.Sprintf("%s: %s is not %s", e.Field, describeValue(e.Value), e.Want)
	if e.Source != "" {
		msg = e.Source + ": " + msg
	}
	return msg
}

// describeValue renders a value as the user wrote it: strings quoted,
// numbers plain, long values cut.
func describeValue(v any) string {
	var s string
	switch x := v.(type) {
	case string:
		s = strconv.Quote(x)
	case float64:
		s = strconv.FormatFloat(x, 'g', -1, 64)
	case map[string]any, map[any]any:
		return "a mapping"
	case []any:
		return "a list"
	case nil:
		return "null"
	default:
		s = fmt.Sprint(x)
	}
	if len(s) > 60 {
		s = s[:60] + "…"
	}
	return s
}

var durationType = reflect.TypeOf(time.Duration(0))

// isStruct reports whether t is a nested section of keys.
func isStruct(t reflect.Type) bool { return t.Kind() == reflect.Struct }

// isScalar reports whether values of t are written as one YAML scalar.
func isScalar(t reflect.Type) bool {
	if t == durationType {
		return true
	}
	switch t.Kind() {
	case reflect.String, reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Float32, reflect.Float64:
		return true
	}
	return false
}

// normalize converts a value read from YAML, an ORTRAIN_* variable or a
// flag (strings) to the Go value of a field of type t, or says what type
// was expected. It never truncates or guesses: 1.5 is not an int, 30 is not
// a duration. Lists may be written as "a,b" (as in variables and flags).
// On failure the TypeError holds the offending value and, for a list item
// or map entry, the path suffix ("[2]", ".KEY") in Field; the caller puts
// the key and the source in front.
func normalize(t reflect.Type, v any) (out any, bad *TypeError) {
	if t.Kind() == reflect.Pointer {
		if v == nil {
			return nil, nil
		}
		return normalize(t.Elem(), v)
	}
	if t == durationType {
		return normalizeDuration(v)
	}
	switch t.Kind() {
	case reflect.String:
		switch x := v.(type) {
		case string:
			return x, nil
		case int, int64, uint64:
			return fmt.Sprint(x), nil // split: 2024 means the text 2024
		}
		return nil, &TypeError{Value: v, Want: "text (quote it if it looks like a number or true/false)"}
	case reflect.Bool:
		switch x := v.(type) {
		case bool:
			return x, nil
		case string:
			if b, err := strconv.ParseBool(strings.TrimSpace(x)); err == nil {
				return b, nil
			}
		}
		return nil, &TypeError{Value: v, Want: "true or false"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return normalizeInt(v, t.Bits())
	case reflect.Float32, reflect.Float64:
		return normalizeFloat(v)
	case reflect.Slice:
		return normalizeList(t, v)
	case reflect.Map:
		return normalizeMap(t, v)
	}
	return v, nil
}

func normalizeDuration(v any) (any, *TypeError) {
	const want = "a duration like 30s or 5m"
	switch x := v.(type) {
	case time.Duration:
		return x, nil
	case string:
		if d, err := time.ParseDuration(strings.TrimSpace(x)); err == nil {
			return d, nil
		}
	case int, int64:
		if fmt.Sprint(x) == "0" {
			return time.Duration(0), nil // 0 needs no unit
		}
		return nil, &TypeError{Value: v, Want: want + " (a number needs a unit)"}
	}
	return nil, &TypeError{Value: v, Want: want}
}

func normalizeInt(v any, bits int) (any, *TypeError) {
	lo, hi := -math.Ldexp(1, bits-1), math.Ldexp(1, bits-1)
	whole := func(f float64) (any, *TypeError) {
		switch {
		case math.IsNaN(f) || math.IsInf(f, 0) || f != math.Trunc(f):
			return nil, &TypeError{Value: v, Want: "a whole number"}
		case f < lo || f >= hi:
			return nil, &TypeError{Value: v, Want: fmt.Sprintf("a whole number of at most %d bits", bits)}
		}
		return int64(f), nil
	}
	inRange := func(n int64) (any, *TypeError) {
		if bits < 64 && (n < -(1<<(bits-1)) || n >= 1<<(bits-1)) {
			return nil, &TypeError{Value: v, Want: fmt.Sprintf("a whole number of at most %d bits", bits)}
		}
		return n, nil // exact: a float64 would round large seeds
	}
	switch x := v.(type) {
	case int:
		return inRange(int64(x))
	case int64:
		return inRange(x)
	case uint64:
		if x > math.MaxInt64 {
			return nil, &TypeError{Value: v, Want: fmt.Sprintf("a whole number of at most %d bits", bits)}
		}
		return normalizeInt(int64(x), bits)
	case float64:
		return whole(x)
	case string:
		s := strings.TrimSpace(x)
		if n, err := strconv.ParseInt(s, 10, bits); err == nil {
			return n, nil
		}
		if f, err := strconv.ParseFloat(s, 64); err == nil {
			if _, bad := whole(f); bad != nil {
				bad.Value = v
				return nil, bad
			}
			return int64(f), nil // 1e3
		}
	}
	return nil, &TypeError{Value: v, Want: "an integer"}
}

func normalizeFloat(v any) (any, *TypeError) {
	switch x := v.(type) {
	case float64:
		return x, nil
	case int:
		return float64(x), nil
	case int64:
		return float64(x), nil
	case uint64:
		return float64(x), nil
	case string:
		// YAML 1.2 reads 1e-5 as a float, but quoted or from a variable it is text.
		if f, err := strconv.ParseFloat(strings.TrimSpace(x), 64); err == nil {
			return f, nil
		}
	}
	return nil, &TypeError{Value: v, Want: "a number"}
}

func normalizeList(t reflect.Type, v any) (any, *TypeError) {
	var items []any
	switch x := v.(type) {
	case nil:
		return nil, nil
	case []any:
		items = x
	case string:
		s := strings.TrimSpace(x)
		if s == "" {
			return []any{}, nil
		}
		if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
			// A JSON or YAML flow list (ORTRAIN_ENGINE_VLLM_URLS='["http://a:8000"]'):
			// splitting it at commas would keep the brackets and quotes.
			if err := yaml.Unmarshal([]byte(s), &items); err != nil {
				return nil, &TypeError{Value: x, Want: "a list: a,b,c or [\"a\", \"b\"]"}
			}
			break
		}
		for _, p := range strings.Split(s, ",") {
			items = append(items, strings.TrimSpace(p))
		}
	default:
		if rv := reflect.ValueOf(v); rv.Kind() == reflect.Slice {
			for i := range rv.Len() {
				items = append(items, rv.Index(i).Interface())
			}
			break
		}
		return nil, &TypeError{Value: v, Want: "a list"}
	}
	if !isScalar(t.Elem()) {
		return items, nil // lists of sections are walked key by key
	}
	out := make([]any, len(items))
	for i, it := range items {
		n, bad := normalize(t.Elem(), it)
		if bad != nil {
			bad.Field = fmt.Sprintf("[%d]", i) + bad.Field
			return nil, bad
		}
		out[i] = n
	}
	return out, nil
}

func normalizeMap(t reflect.Type, v any) (any, *TypeError) {
	m, ok := asMap(v)
	if !ok {
		if v == nil {
			return nil, nil
		}
		return nil, &TypeError{Value: v, Want: "a mapping of keys (set it in the config file)"}
	}
	if !isScalar(t.Elem()) {
		return m, nil
	}
	out := make(map[string]any, len(m))
	for k, x := range m {
		n, bad := normalize(t.Elem(), x)
		if bad != nil {
			bad.Field = "." + k + bad.Field
			return nil, bad
		}
		out[k] = n
	}
	return out, nil
}

// strictDecodeHook is the last line of defence at decode time, for every
// layer: mapstructure converts a float to an int by truncation even with
// weak typing off (max_steps: 1.5 became 1), and its parse errors leak
// strconv text. Scalars and lists of scalars go through normalize; its
// TypeError gets the field name from mapstructure's DecodeError (see
// decodeErrors).
func strictDecodeHook(from, to reflect.Value) (any, error) {
	if !from.IsValid() || !from.CanInterface() {
		return nil, nil
	}
	v := from.Interface()
	t := to.Type()
	if !isScalar(t) && !(t.Kind() == reflect.Slice && from.Kind() == reflect.String) {
		return v, nil
	}
	out, bad := normalize(t, v)
	if bad != nil {
		return nil, bad
	}
	return out, nil
}

// decodeErrors turns mapstructure's error into TypeErrors naming the field
// (DecodeError carries its dotted name) and anything else into its own
// sentence, without mapstructure's "decoding failed" preamble.
func decodeErrors(err error, source string) error {
	var out []error
	var walk func(error)
	walk = func(e error) {
		switch x := e.(type) {
		case *mapstructure.DecodeError:
			var te *TypeError
			if errors.As(x, &te) {
				te.Source, te.Field = source, x.Name()+te.Field
				out = append(out, te)
				return
			}
			out = append(out, x)
			return
		case interface{ Unwrap() []error }:
			for _, y := range x.Unwrap() {
				walk(y)
			}
			return
		}
		if u := errors.Unwrap(e); u != nil {
			walk(u)
			return
		}
		out = append(out, e)
	}
	walk(err)
	return joinErrors(out)
}

// joinErrors returns nil, the one error, or errors.Join of several (each
// still reachable with errors.As).
func joinErrors(errs []error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return errors.Join(errs...)
}
