package jinja

import (
	"fmt"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
)

func sortedKeys(m map[string]Value) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (r *renderer) evalFilter(e filterExpr, sc *scope) (Value, error) {
	v, err := r.eval(e.x, sc)
	if err != nil {
		return nil, err
	}
	args, kwargs, err := r.evalArgs(e.args, e.kwargs, sc)
	if err != nil {
		return nil, err
	}
	out, err := applyFilter(e.name, v, args, kwargs)
	if err != nil {
		return nil, fmt.Errorf("filter %s: %w", e.name, err)
	}
	return out, nil
}

func arg(args []Value, kwargs map[string]Value, i int, name string) (Value, bool) {
	if i < len(args) {
		return args[i], true
	}
	v, ok := kwargs[name]
	return v, ok
}

func applyFilter(name string, v Value, args []Value, kwargs map[string]Value) (Value, error) {
	switch name {
	case "tojson":
		return tojsonFilter(v, args, kwargs)
	case "length", "count":
		return length(v)
	case "list":
		return iterate(v)
	case "items":
		switch x := v.(type) {
		case *Dict:
			return dictItems(x), nil
		case Undefined:
			return []Value{}, nil
		}
		return nil, fmt.Errorf("can only get item pairs from a mapping, not %s", typeName(v))
	case "join":
		return joinFilter(v, args, kwargs)
	case "first", "last":
		items, err := iterate(v)
		if err != nil || len(items) == 0 {
			return Undefined{Name: name}, err
		}
		if name == "first" {
			return items[0], nil
		}
		return items[len(items)-1], nil
	case "default", "d":
		def, _ := arg(args, kwargs, 0, "default_value")
		boolean, _ := arg(args, kwargs, 1, "boolean")
		if _, undef := v.(Undefined); undef || truthy(boolean) && !truthy(v) {
			if def == nil && len(args) == 0 {
				return "", nil
			}
			return def, nil
		}
		return v, nil
	case "select", "reject", "selectattr", "rejectattr":
		return selectFilter(name, v, args)
	case "map":
		return mapFilter(v, args, kwargs)
	case "sort", "dictsort", "reverse", "sum", "min", "max":
		return listFilter(name, v, args, kwargs)
	case "unique":
		return uniqueFilter(v, args, kwargs)
	}
	if out, ok, err := moreFilter(name, v, args, kwargs); ok {
		return out, err
	}
	return scalarFilter(name, v, args, kwargs)
}

// scalarFilter implements the filters on strings and numbers.
func scalarFilter(name string, v Value, args []Value, kwargs map[string]Value) (Value, error) {
	switch name {
	case "trim":
		return pyStrip(toStr(v), args, true, true)
	case "string":
		return toStr(v), nil
	case "lower":
		return pyLower(toStr(v)), nil
	case "upper":
		return pyUpper(toStr(v)), nil
	case "title":
		return jinjaTitle(toStr(v)), nil
	case "capitalize":
		return pyCapitalize(toStr(v)), nil
	case "replace":
		if len(args) < 2 {
			return nil, fmt.Errorf("needs old and new")
		}
		return strings.ReplaceAll(toStr(v), toStr(args[0]), toStr(args[1])), nil
	case "safe":
		return v, nil // autoescape is off in transformers' environment
	case "abs":
		if i, ok := v.(int64); ok {
			return max(i, -i), nil
		}
		f, ok := toFloat(v)
		if !ok {
			return nil, fmt.Errorf("bad operand type for abs(): %s", typeName(v))
		}
		return math.Abs(f), nil
	case "float":
		if f, ok := toFloat(v); ok {
			return f, nil
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(toStr(v)), 64)
		if err != nil {
			return 0.0, nil
		}
		return f, nil
	case "round":
		return roundFilter(v, args, kwargs)
	case "indent":
		return indentFilter(v, args, kwargs)
	}
	return nil, fmt.Errorf("no filter named %q", name)
}

// uniqueFilter is unique(case_sensitive=False, attribute=None): the first
// item of each key.
func uniqueFilter(v Value, args []Value, kwargs map[string]Value) (Value, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	cs, _ := arg(args, kwargs, 0, "case_sensitive")
	key := func(it Value) (Value, error) { return sortKey(it, truthy(cs)), nil }
	if a, ok := arg(args, kwargs, 1, "attribute"); ok && a != nil {
		key = attrGetter(toStr(a), nil, truthy(cs))
	}
	out := []Value{}
	var seen []Value
	for _, it := range items {
		k, err := key(it)
		if err != nil {
			return nil, err
		}
		if ok, _ := contains(seen, k); !ok {
			seen = append(seen, k)
			out = append(out, it)
		}
	}
	return out, nil
}

func length(v Value) (Value, error) {
	switch x := asList(v).(type) {
	case string:
		return int64(len([]rune(x))), nil
	case []Value:
		return int64(len(x)), nil
	case *Dict:
		return int64(x.Len()), nil
	case Undefined:
		return int64(0), nil
	}
	return nil, fmt.Errorf("object of type '%s' has no len()", typeName(v))
}

func joinFilter(v Value, args []Value, kwargs map[string]Value) (Value, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	sep := ""
	if s, ok := arg(args, kwargs, 0, "d"); ok {
		sep = toStr(s)
	}
	attr, hasAttr := arg(args, kwargs, 1, "attribute")
	parts := make([]string, len(items))
	for i, it := range items {
		if hasAttr {
			if it, err = getAttr(it, toStr(attr)); err != nil {
				return nil, err
			}
		}
		parts[i] = toStr(it)
	}
	return strings.Join(parts, sep), nil
}

// selectFilter implements select/reject(test, args...) and
// selectattr/rejectattr(attr, test, args...).
func selectFilter(name string, v Value, args []Value) (Value, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	byAttr := strings.HasSuffix(name, "attr")
	keep := strings.HasPrefix(name, "select")
	attr := ""
	if byAttr {
		if len(args) == 0 {
			return nil, fmt.Errorf("needs an attribute name")
		}
		attr, args = toStr(args[0]), args[1:]
	}
	out := []Value{}
	for _, it := range items {
		subject := it
		if byAttr {
			if subject, err = getAttr(it, attr); err != nil {
				return nil, err
			}
		}
		var ok bool
		if len(args) == 0 {
			ok = truthy(subject)
		} else {
			if ok, err = applyTest(toStr(args[0]), subject, args[1:]); err != nil {
				return nil, err
			}
		}
		if ok == keep {
			out = append(out, it)
		}
	}
	return out, nil
}

func mapFilter(v Value, args []Value, kwargs map[string]Value) (Value, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	out := make([]Value, len(items))
	for i, it := range items {
		switch attr, ok := kwargs["attribute"]; {
		case ok:
			got, err := getAttr(it, toStr(attr))
			if err != nil {
				return nil, err
			}
			if _, undef := got.(Undefined); undef {
				if def, ok := kwargs["default"]; ok {
					got = def
				}
			}
			out[i] = got
		case len(args) > 0:
			got, err := applyFilter(toStr(args[0]), it, args[1:], nil)
			if err != nil {
				return nil, err
			}
			out[i] = got
		default:
			return nil, fmt.Errorf("map needs a filter name or attribute=")
		}
	}
	return out, nil
}

func (r *renderer) evalTest(e testExpr, sc *scope) (Value, error) {
	v, err := r.eval(e.x, sc)
	if err != nil {
		return nil, err
	}
	args, _, err := r.evalArgs(e.args, nil, sc)
	if err != nil {
		return nil, err
	}
	ok, err := applyTest(e.name, v, args)
	if err != nil {
		return nil, err
	}
	return ok != e.negate, nil
}

func applyTest(name string, v Value, args []Value) (bool, error) {
	argAt := func(i int) Value {
		if i < len(args) {
			return args[i]
		}
		return Undefined{}
	}
	if ok, known := typeTest(name, v); known {
		return ok, nil
	}
	switch name {
	case "equalto", "eq", "==":
		return equal(v, argAt(0)), nil
	case "sameas": // Python identity: only None, bools and equal scalars of one type
		w := argAt(0)
		return typeName(v) == typeName(w) && equal(v, w), nil
	case "ne", "!=":
		return !equal(v, argAt(0)), nil
	case "in":
		return contains(argAt(0), v)
	case "lower", "upper":
		s := toStr(v) // jinja2: str(value).islower()
		return pyIsCase(s, name == "upper"), nil
	case "odd", "even", "divisibleby":
		n, ok := toInt(v)
		if !ok {
			return false, fmt.Errorf("test %s needs an integer, got %s", name, typeName(v))
		}
		switch name {
		case "odd":
			return n%2 != 0, nil
		case "even":
			return n%2 == 0, nil
		}
		d, ok := toInt(argAt(0))
		if !ok || d == 0 {
			return false, fmt.Errorf("divisibleby needs a non-zero integer")
		}
		return n%d == 0, nil
	case "gt", ">", "lt", "<", "ge", ">=", "le", "<=":
		c, err := compare(v, argAt(0))
		if err != nil {
			return false, err
		}
		switch name {
		case "gt", ">":
			return c > 0, nil
		case "lt", "<":
			return c < 0, nil
		case "ge", ">=":
			return c >= 0, nil
		}
		return c <= 0, nil
	}
	return false, fmt.Errorf("no test named %q", name)
}

// jinjaTitle is Jinja's title filter (not str.title): each word, split at
// runs of "-", whitespace, "(", "{", "[" or "<", gets an upper-case first
// character and lower-case rest.
func jinjaTitle(s string) string {
	// jinja2: item[0].upper() + item[1:].lower() for each word, words
	// starting after spaces and -({[<.
	isSep := func(r rune) bool { return r == '-' || r == '(' || r == '{' || r == '[' || r == '<' || pyIsSpace(r) }
	var b strings.Builder
	rs := []rune(s)
	for i := 0; i < len(rs); {
		if isSep(rs[i]) {
			b.WriteRune(rs[i])
			i++
			continue
		}
		j := i + 1
		for j < len(rs) && !isSep(rs[j]) {
			j++
		}
		b.WriteString(pyUpper(string(rs[i])))
		b.WriteString(pyLower(string(rs[i+1 : j])))
		i = j
	}
	return b.String()
}

// typeTest implements the tests about a value's type; known is false for
// other test names.
func typeTest(name string, v Value) (ok, known bool) {
	switch name {
	case "defined":
		_, undef := v.(Undefined)
		return !undef, true
	case "undefined":
		_, undef := v.(Undefined)
		return undef, true
	case "none":
		return v == nil, true
	case "string":
		_, ok := v.(string)
		return ok, true
	case "mapping":
		_, ok := v.(*Dict)
		return ok, true
	case "iterable":
		switch v.(type) {
		case string, []Value, Tuple, *Dict, Undefined:
			return true, true
		}
		return false, true
	case "sequence":
		switch v.(type) {
		case string, []Value, Tuple, *Dict:
			return true, true
		}
		return false, true
	case "number":
		_, ok := toFloat(v)
		return ok, true
	case "integer":
		switch v.(type) {
		case int64, *big.Int:
			return true, true
		}
		return false, true
	case "float":
		_, ok := v.(float64)
		return ok, true
	case "boolean":
		_, ok := v.(bool)
		return ok, true
	case "true", "false":
		b, ok := v.(bool)
		return ok && b == (name == "true"), true
	case "callable":
		switch v.(type) {
		case builtinFunc, *macro:
			return true, true
		}
		return false, true
	}
	return false, false
}

// tojsonFilter is transformers' tojson(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False), which calls json.dumps.
func tojsonFilter(v Value, args []Value, kwargs map[string]Value) (Value, error) {
	ascii, _ := arg(args, kwargs, 0, "ensure_ascii")
	sortKeys, _ := arg(args, kwargs, 3, "sort_keys")
	var indent *string
	switch iv, _ := arg(args, kwargs, 1, "indent"); x := iv.(type) {
	case nil, Undefined:
	case string:
		indent = &x
	default:
		n, ok := toInt(x)
		if !ok {
			return nil, fmt.Errorf("indent must be an int or a string, not %s", typeName(iv))
		}
		pad := strings.Repeat(" ", int(max(n, 0)))
		indent = &pad
	}
	o := newJSONOptions(indent, truthy(sortKeys), truthy(ascii))
	if sv, ok := arg(args, kwargs, 2, "separators"); ok && sv != nil {
		seps, ok := asList(sv).([]Value)
		if !ok || len(seps) != 2 {
			return nil, fmt.Errorf("separators must be a pair of strings")
		}
		item, ok1 := seps[0].(string)
		key, ok2 := seps[1].(string)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("separators must be a pair of strings")
		}
		o.itemSep, o.keySep = item, key
	}
	return toJSON(v, o)
}
