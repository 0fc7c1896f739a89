package jinja

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// percentFormat is Python's "fmt % args" for the conversions templates
// use: %s %r %d %i %f %x %%, with optional (name), flags, width, precision.
func percentFormat(format string, args Value) (string, error) {
	var list []Value
	mapping, _ := args.(*Dict)
	if t, ok := args.(Tuple); ok {
		list = t
	} else if mapping == nil {
		list = []Value{args}
	}
	var b strings.Builder
	next := 0
	for i := 0; i < len(format); i++ {
		if format[i] != '%' {
			b.WriteByte(format[i])
			continue
		}
		i++
		if i < len(format) && format[i] == '%' {
			b.WriteByte('%')
			continue
		}
		var arg Value
		if i < len(format) && format[i] == '(' && mapping != nil {
			end := strings.IndexByte(format[i:], ')')
			if end < 0 {
				return "", fmt.Errorf("incomplete format key")
			}
			arg, _ = mapping.Get(format[i+1 : i+end])
			i += end + 1
		}
		j := i
		for j < len(format) && strings.IndexByte("-+ #0123456789.", format[j]) >= 0 {
			j++
		}
		if j >= len(format) {
			return "", fmt.Errorf("incomplete format")
		}
		spec, conv := format[i:j], format[j]
		i = j
		if arg == nil && mapping == nil {
			if next >= len(list) {
				return "", fmt.Errorf("not enough arguments for format string")
			}
			arg = list[next]
			next++
		}
		s, err := formatOne(spec, conv, arg)
		if err != nil {
			return "", err
		}
		b.WriteString(s)
	}
	if mapping == nil && next < len(list) {
		return "", fmt.Errorf("not all arguments converted during string formatting")
	}
	return b.String(), nil
}

func formatOne(spec string, conv byte, arg Value) (string, error) {
	switch conv {
	case 's':
		return fmt.Sprintf("%"+spec+"s", toStr(arg)), nil
	case 'r':
		return fmt.Sprintf("%"+spec+"s", repr(arg)), nil
	case 'd', 'i':
		if f, ok := arg.(float64); ok {
			arg = int64(f)
		}
		n, ok := toInt(arg)
		if !ok {
			return "", fmt.Errorf("%%%c format: a number is required, not %s", conv, typeName(arg))
		}
		return fmt.Sprintf("%"+spec+"d", n), nil
	case 'f', 'F', 'e', 'g', 'x', 'X', 'o':
		if conv == 'x' || conv == 'X' || conv == 'o' {
			n, ok := toInt(arg)
			if !ok {
				return "", fmt.Errorf("%%%c format: an integer is required, not %s", conv, typeName(arg))
			}
			return fmt.Sprintf("%"+spec+string(conv), n), nil
		}
		f, ok := toFloat(arg)
		if !ok {
			return "", fmt.Errorf("%%%c format: a real number is required, not %s", conv, typeName(arg))
		}
		if !strings.Contains(spec, ".") {
			spec += ".6"
		}
		return fmt.Sprintf("%"+spec+string(conv), f), nil
	}
	return "", fmt.Errorf("unsupported format character %q", conv)
}

// strFormat is str.format with positional ({} {0}) and keyword ({name})
// fields, optional !r/!s, and the format specs [width][.precision][f|d].
func strFormat(format string, args []Value, kwargs map[string]Value) (string, error) {
	var b strings.Builder
	auto := 0
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c == '}' {
			if i+1 < len(format) && format[i+1] == '}' {
				i++
			}
			b.WriteByte('}')
			continue
		}
		if c != '{' {
			b.WriteByte(c)
			continue
		}
		if i+1 < len(format) && format[i+1] == '{' {
			b.WriteByte('{')
			i++
			continue
		}
		end := strings.IndexByte(format[i:], '}')
		if end < 0 {
			return "", fmt.Errorf("single '{' encountered in format string")
		}
		field := format[i+1 : i+end]
		i += end
		field, spec, _ := strings.Cut(field, ":")
		field, conv, _ := strings.Cut(field, "!")
		var arg Value
		switch n, err := strconv.Atoi(field); {
		case field == "":
			if auto >= len(args) {
				return "", fmt.Errorf("replacement index %d out of range", auto)
			}
			arg = args[auto]
			auto++
		case err == nil:
			if n >= len(args) {
				return "", fmt.Errorf("replacement index %d out of range", n)
			}
			arg = args[n]
		default:
			v, ok := kwargs[field]
			if !ok {
				return "", fmt.Errorf("format key %q missing", field)
			}
			arg = v
		}
		s := toStr(arg)
		if conv == "r" {
			s = repr(arg)
		}
		if spec != "" {
			typ := spec[len(spec)-1]
			if typ == 'f' || typ == 'd' || typ == 's' {
				spec = spec[:len(spec)-1]
			} else {
				typ = 's'
			}
			var err error
			if s, err = formatOne(spec, typ, arg); err != nil {
				return "", err
			}
		}
		b.WriteString(s)
	}
	return b.String(), nil
}

// sortKey compares like Jinja's sort filter: strings case-insensitively
// unless caseSensitive.
func sortKey(v Value, caseSensitive bool) Value {
	if s, ok := v.(string); ok && !caseSensitive {
		return pyLower(s)
	}
	return v
}

func sortValues(items []Value, key func(Value) (Value, error), reverse bool) ([]Value, error) {
	keys := make([]Value, len(items))
	for i, it := range items {
		k, err := key(it)
		if err != nil {
			return nil, err
		}
		keys[i] = k
	}
	idx := make([]int, len(items))
	for i := range idx {
		idx[i] = i
	}
	var cmpErr error
	sort.SliceStable(idx, func(a, b int) bool {
		c, err := compare(keys[idx[a]], keys[idx[b]])
		if err != nil {
			cmpErr = err
		}
		if reverse {
			return c > 0
		}
		return c < 0
	})
	out := make([]Value, len(items))
	for i, j := range idx {
		out[i] = items[j]
	}
	return out, cmpErr
}

// listFilter implements sort, dictsort, reverse, sum, min and max.
func listFilter(name string, v Value, args []Value, kwargs map[string]Value) (Value, error) {
	csPos := 0 // case_sensitive's position: sort(reverse, case_sensitive), others first
	if name == "sort" {
		csPos = 1
	}
	caseSensitive := false
	if cs, ok := arg(args, kwargs, csPos, "case_sensitive"); ok {
		caseSensitive = truthy(cs)
	}
	attrKey := func(it Value) (Value, error) { return sortKey(it, caseSensitive), nil }
	if a, ok := kwargs["attribute"]; ok && a != nil {
		attrKey = attrGetter(toStr(a), nil, caseSensitive)
	}
	switch name {
	case "reverse":
		return reverseFilter(v)
	case "dictsort":
		d, ok := v.(*Dict)
		if !ok {
			return nil, fmt.Errorf("dictsort needs a mapping, not %s", typeName(v))
		}
		by := 0
		if b, ok := kwargs["by"]; ok && toStr(b) == "value" {
			by = 1
		}
		rev, _ := kwargs["reverse"]
		return sortValues(dictItems(d), func(it Value) (Value, error) {
			return sortKey(it.(Tuple)[by], caseSensitive), nil
		}, truthy(rev))
	}
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	switch name {
	case "sort":
		rev, _ := arg(args, kwargs, 0, "reverse")
		return sortValues(items, attrKey, truthy(rev))
	case "sum":
		var total Value = int64(0)
		if s, ok := kwargs["start"]; ok {
			total = s
		}
		for _, it := range items {
			k, err := attrKey(it)
			if err != nil {
				return nil, err
			}
			if total, err = arith("+", total, k); err != nil {
				return nil, err
			}
		}
		return total, nil
	}
	// min, max
	if len(items) == 0 {
		return Undefined{Name: name}, nil
	}
	sorted, err := sortValues(items, attrKey, name == "max")
	if err != nil {
		return nil, err
	}
	return sorted[0], nil
}

// roundFilter is Jinja's round(precision=0, method='common'|'ceil'|'floor').
func roundFilter(v Value, args []Value, kwargs map[string]Value) (Value, error) {
	precision := int64(0)
	if p, ok := arg(args, kwargs, 0, "precision"); ok {
		precision, _ = toInt(p)
	}
	method := "common"
	if m, ok := arg(args, kwargs, 1, "method"); ok {
		method = toStr(m)
	}
	if i, ok := v.(int64); ok && method == "common" {
		return i, nil
	}
	f, ok := toFloat(v)
	if !ok {
		return nil, fmt.Errorf("round needs a number, not %s", typeName(v))
	}
	scale := math.Pow(10, float64(precision))
	switch method {
	case "common":
		r, err := strconv.ParseFloat(strconv.FormatFloat(f, 'f', int(precision), 64), 64)
		return r, err
	case "ceil":
		return math.Ceil(f*scale) / scale, nil
	case "floor":
		return math.Floor(f*scale) / scale, nil
	}
	return nil, fmt.Errorf("round method must be common, ceil or floor")
}

// indentFilter is Jinja 3.1's indent(width=4, first=False, blank=False).
func indentFilter(v Value, args []Value, kwargs map[string]Value) (Value, error) {
	indent := "    "
	if w, ok := arg(args, kwargs, 0, "width"); ok {
		if s, isStr := w.(string); isStr {
			indent = s
		} else if n, isInt := toInt(w); isInt {
			indent = strings.Repeat(" ", int(n))
		}
	}
	first, _ := arg(args, kwargs, 1, "first")
	blank, _ := arg(args, kwargs, 2, "blank")
	lines := strings.Split(normalizeNewlines(toStr(v)+"\n"), "\n")
	var out string
	if truthy(blank) {
		out = strings.Join(lines, "\n"+indent)
	} else {
		out = lines[0]
		for _, l := range lines[1:] {
			out += "\n"
			if l != "" {
				out += indent + l
			}
		}
	}
	if truthy(first) {
		out = indent + out
	}
	return out, nil
}

func reverseFilter(v Value) (Value, error) {
	if s, ok := v.(string); ok {
		rs := []rune(s)
		for i, j := 0, len(rs)-1; i < j; i, j = i+1, j-1 {
			rs[i], rs[j] = rs[j], rs[i]
		}
		return string(rs), nil
	}
	items, err := iterate(v)
	out := make([]Value, len(items))
	for i, it := range items {
		out[len(items)-1-i] = it
	}
	return out, err
}
