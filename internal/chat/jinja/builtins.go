package jinja

import (
	"fmt"
	"strings"
	"time"
	"unicode"
)

// getAttr is jinja2's environment.getattr: a Python attribute (dict and
// str methods) first, then the item of that name.
func getAttr(obj Value, name string) (Value, error) {
	switch x := obj.(type) {
	case Undefined:
		return nil, fmt.Errorf("'%s' is undefined (reading attribute %q)", x.Name, name)
	case *Dict:
		if m := dictMethod(x, name); m != nil {
			return m, nil
		}
		if v, ok := x.m[name]; ok {
			return v, nil
		}
		return Undefined{Name: name}, nil
	case *Namespace:
		if v, ok := x.attrs.m[name]; ok {
			return v, nil
		}
		return Undefined{Name: name}, nil
	case string:
		if m := stringMethod(x, name); m != nil {
			return m, nil
		}
	case GroupTuple:
		if v := pyGetattr(x, name); v != nil {
			if _, undef := v.(Undefined); !undef {
				return v, nil
			}
		}
	}
	return getItem(obj, name)
}

// getItem is jinja2's environment.getitem: obj[key], then the attribute.
func getItem(obj Value, key Value) (Value, error) {
	switch x := asList(obj).(type) {
	case Undefined:
		return nil, fmt.Errorf("'%s' is undefined (reading item %s)", x.Name, repr(key))
	case *Dict:
		if k, ok := key.(string); ok {
			if v, ok := x.m[k]; ok {
				return v, nil
			}
			if m := dictMethod(x, k); m != nil {
				return m, nil
			}
		}
	case *Namespace:
		if k, ok := key.(string); ok {
			if v, ok := x.attrs.m[k]; ok {
				return v, nil
			}
		}
	case []Value:
		if i, ok := toInt(key); ok {
			if i < 0 {
				i += int64(len(x))
			}
			if i >= 0 && i < int64(len(x)) {
				return x[i], nil
			}
		}
	case string:
		if i, ok := toInt(key); ok {
			rs := []rune(x)
			if i < 0 {
				i += int64(len(rs))
			}
			if i >= 0 && i < int64(len(rs)) {
				return string(rs[i]), nil
			}
		}
	}
	return Undefined{Name: toStr(key)}, nil
}

func dictMethod(d *Dict, name string) Value {
	switch name {
	case "items":
		return builtinFunc(func([]Value, map[string]Value) (Value, error) { return dictItems(d), nil })
	case "keys":
		return builtinFunc(func([]Value, map[string]Value) (Value, error) { return iterate(d) })
	case "values":
		return builtinFunc(func([]Value, map[string]Value) (Value, error) {
			out := make([]Value, len(d.keys))
			for i, k := range d.keys {
				out[i] = d.m[k]
			}
			return out, nil
		})
	case "get":
		return builtinFunc(func(args []Value, _ map[string]Value) (Value, error) {
			if len(args) == 0 {
				return nil, fmt.Errorf("get expected at least 1 argument")
			}
			if k, ok := args[0].(string); ok {
				if v, ok := d.m[k]; ok {
					return v, nil
				}
			}
			if len(args) > 1 {
				return args[1], nil
			}
			return nil, nil
		})
	}
	return nil
}

func dictItems(d *Dict) []Value {
	out := make([]Value, len(d.keys))
	for i, k := range d.keys {
		out[i] = Tuple{k, d.m[k]}
	}
	return out
}

// pyIsSpace is Python's str.isspace for one character.
func pyIsSpace(r rune) bool { return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f }

// pyStrip is str.strip/lstrip/rstrip with optional chars.
func pyStrip(s string, args []Value, left, right bool) (string, error) {
	cut := pyIsSpace
	if len(args) > 0 && args[0] != nil {
		chars, ok := args[0].(string)
		if !ok {
			return "", fmt.Errorf("strip arg must be None or str")
		}
		cut = func(r rune) bool { return strings.ContainsRune(chars, r) }
	}
	if left {
		s = strings.TrimLeftFunc(s, cut)
	}
	if right {
		s = strings.TrimRightFunc(s, cut)
	}
	return s, nil
}

func stringMethod(s string, name string) Value {
	str := func(f func(args []Value) (Value, error)) Value {
		return builtinFunc(func(args []Value, _ map[string]Value) (Value, error) { return f(args) })
	}
	switch name {
	case "strip", "lstrip", "rstrip":
		return str(func(args []Value) (Value, error) {
			return pyStrip(s, args, name != "rstrip", name != "lstrip")
		})
	case "startswith", "endswith":
		return str(func(args []Value) (Value, error) {
			if len(args) == 0 {
				return nil, fmt.Errorf("%s takes at least 1 argument", name)
			}
			cands := []Value{args[0]}
			if l, ok := asList(args[0]).([]Value); ok {
				cands = l
			}
			for _, c := range cands {
				p, ok := c.(string)
				if !ok {
					return nil, fmt.Errorf("%s arg must be str or a tuple of str", name)
				}
				if name == "startswith" && strings.HasPrefix(s, p) || name == "endswith" && strings.HasSuffix(s, p) {
					return true, nil
				}
			}
			return false, nil
		})
	case "split", "rsplit":
		return str(func(args []Value) (Value, error) { return pySplit(s, args, name == "rsplit") })
	case "upper":
		return str(func([]Value) (Value, error) { return pyUpper(s), nil })
	case "lower":
		return str(func([]Value) (Value, error) { return pyLower(s), nil })
	case "title":
		return str(func([]Value) (Value, error) { return pyTitle(s), nil })
	case "capitalize":
		return str(func([]Value) (Value, error) { return pyCapitalize(s), nil })
	}
	return stringEditMethod(s, name)
}

// stringEditMethod implements replace, find, count, join and format.
func stringEditMethod(s string, name string) Value {
	str := func(f func(args []Value) (Value, error)) Value {
		return builtinFunc(func(args []Value, _ map[string]Value) (Value, error) { return f(args) })
	}
	switch name {
	case "replace":
		return str(func(args []Value) (Value, error) {
			if len(args) < 2 {
				return nil, fmt.Errorf("replace takes 2 arguments")
			}
			n := int64(-1)
			if len(args) > 2 {
				n, _ = toInt(args[2])
			}
			return strings.Replace(s, toStr(args[0]), toStr(args[1]), int(n)), nil
		})
	case "count":
		return str(func(args []Value) (Value, error) {
			if len(args) == 0 {
				return nil, fmt.Errorf("count takes 1 argument")
			}
			return int64(strings.Count(s, toStr(args[0]))), nil
		})
	case "format":
		return builtinFunc(func(args []Value, kwargs map[string]Value) (Value, error) {
			return strFormat(s, args, kwargs)
		})
	case "join":
		return str(func(args []Value) (Value, error) {
			if len(args) == 0 {
				return nil, fmt.Errorf("join takes 1 argument")
			}
			items, err := iterate(args[0])
			if err != nil {
				return nil, err
			}
			parts := make([]string, len(items))
			for i, it := range items {
				parts[i] = toStr(it)
			}
			return strings.Join(parts, s), nil
		})
	}
	return moreStringMethod(s, name)
}

func pySplit(s string, args []Value, fromRight bool) (Value, error) {
	maxSplit := int64(-1)
	if len(args) > 1 {
		maxSplit, _ = toInt(args[1])
	}
	var parts []string
	if len(args) == 0 || args[0] == nil {
		parts = strings.FieldsFunc(s, pyIsSpace)
		if maxSplit >= 0 && int64(len(parts)) > maxSplit+1 {
			// Rare with chat templates: keep Python's rule approximately
			// by re-joining the tail with single spaces.
			parts = append(parts[:maxSplit], strings.Join(parts[maxSplit:], " "))
		}
	} else {
		sep, ok := args[0].(string)
		if !ok || sep == "" {
			return nil, fmt.Errorf("split separator must be a non-empty string")
		}
		switch {
		case maxSplit < 0:
			parts = strings.Split(s, sep)
		case fromRight:
			parts = rsplitN(s, sep, int(maxSplit))
		default:
			parts = strings.SplitN(s, sep, int(maxSplit)+1)
		}
	}
	out := make([]Value, len(parts))
	for i, p := range parts {
		out[i] = p
	}
	return out, nil
}

func rsplitN(s, sep string, n int) []string {
	var tail []string
	for len(tail) < n {
		i := strings.LastIndex(s, sep)
		if i < 0 {
			break
		}
		tail = append([]string{s[i+len(sep):]}, tail...)
		s = s[:i]
	}
	return append([]string{s}, tail...)
}

// globalFunctions are the globals transformers' environment defines, plus
// jinja2's namespace, range and dict.
func globalFunctions(now func() time.Time) map[string]Value {
	return map[string]Value{
		"raise_exception": builtinFunc(func(args []Value, _ map[string]Value) (Value, error) {
			msg := ""
			if len(args) > 0 {
				msg = toStr(args[0])
			}
			return nil, &TemplateError{Message: msg}
		}),
		"strftime_now": builtinFunc(func(args []Value, _ map[string]Value) (Value, error) {
			if len(args) == 0 {
				return nil, fmt.Errorf("strftime_now takes a format argument")
			}
			return strftime(now(), toStr(args[0])), nil
		}),
		"namespace": builtinFunc(func(args []Value, kwargs map[string]Value) (Value, error) {
			ns := &Namespace{attrs: NewDict()}
			if len(args) > 0 {
				if d, ok := args[0].(*Dict); ok {
					for _, k := range d.keys {
						ns.attrs.Set(k, d.m[k])
					}
				}
			}
			for _, k := range sortedKeys(kwargs) {
				ns.attrs.Set(k, kwargs[k])
			}
			return ns, nil
		}),
		"range": builtinFunc(pyRange),
		"dict": builtinFunc(func(_ []Value, kwargs map[string]Value) (Value, error) {
			d := NewDict()
			for _, k := range sortedKeys(kwargs) {
				d.Set(k, kwargs[k])
			}
			return d, nil
		}),
	}
}

func pyRange(args []Value, _ map[string]Value) (Value, error) {
	var nums []int64
	for _, a := range args {
		n, ok := toInt(a)
		if !ok {
			return nil, fmt.Errorf("range arguments must be integers")
		}
		nums = append(nums, n)
	}
	start, stop, step := int64(0), int64(0), int64(1)
	switch len(nums) {
	case 1:
		stop = nums[0]
	case 2:
		start, stop = nums[0], nums[1]
	case 3:
		start, stop, step = nums[0], nums[1], nums[2]
	default:
		return nil, fmt.Errorf("range expected 1 to 3 arguments")
	}
	if step == 0 {
		return nil, fmt.Errorf("range step must not be zero")
	}
	var out []Value
	for i := start; step > 0 && i < stop || step < 0 && i > stop; i += step {
		out = append(out, i)
		if len(out) > 1_000_000 {
			return nil, fmt.Errorf("range too large")
		}
	}
	return out, nil
}

// strftime formats t with C strftime directives (the common subset).
func strftime(t time.Time, format string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		if format[i] != '%' || i+1 == len(format) {
			b.WriteByte(format[i])
			continue
		}
		i++
		switch format[i] {
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'e':
			fmt.Fprintf(&b, "%2d", t.Day())
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'Y':
			fmt.Fprintf(&b, "%d", t.Year())
		case 'y':
			fmt.Fprintf(&b, "%02d", t.Year()%100)
		case 'b', 'h':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'I':
			fmt.Fprintf(&b, "%02d", (t.Hour()+11)%12+1)
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case 'p':
			b.WriteString(map[bool]string{true: "AM", false: "PM"}[t.Hour() < 12])
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(format[i])
		}
	}
	return b.String()
}
