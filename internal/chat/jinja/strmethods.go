package jinja

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The str methods Python templates call beyond the common ones, with
// CPython's semantics (indexes count characters, not bytes).

func moreStringMethod(s string, name string) Value {
	fn := func(f func(args []Value) (Value, error)) Value {
		return builtinFunc(func(args []Value, _ map[string]Value) (Value, error) { return f(args) })
	}
	pred := func(f func(string) bool) Value {
		return fn(func([]Value) (Value, error) { return f(s), nil })
	}
	switch name {
	case "splitlines":
		return fn(func(args []Value) (Value, error) {
			keep := len(args) > 0 && truthy(args[0])
			lines := pySplitLines(s, keep)
			out := make([]Value, len(lines))
			for i, l := range lines {
				out[i] = l
			}
			return out, nil
		})
	case "find", "rfind", "index", "rindex":
		return fn(func(args []Value) (Value, error) {
			if len(args) == 0 {
				return nil, fmt.Errorf("%s takes at least 1 argument", name)
			}
			i := pyFind(s, toStr(args[0]), args[1:], strings.HasPrefix(name, "r"))
			if i < 0 && strings.HasSuffix(name, "index") {
				return nil, fmt.Errorf("substring not found")
			}
			return int64(i), nil
		})
	case "isdigit", "isdecimal", "isnumeric":
		return pred(func(s string) bool { return s != "" && all(s, unicode.IsDigit) })
	case "isalpha":
		return pred(func(s string) bool { return s != "" && all(s, unicode.IsLetter) })
	case "isalnum":
		return pred(func(s string) bool {
			return s != "" && all(s, func(r rune) bool { return unicode.IsLetter(r) || unicode.IsNumber(r) })
		})
	case "isspace":
		return pred(func(s string) bool { return s != "" && all(s, pyIsSpace) })
	case "islower", "isupper":
		return pred(func(s string) bool { return pyIsCase(s, name == "isupper") })
	case "istitle":
		return pred(pyIsTitle)
	case "zfill":
		return fn(func(args []Value) (Value, error) {
			width, _ := toInt(argOr(args, 0, int64(0)))
			if width > maxStringLen {
				return nil, fmt.Errorf("zfill width %d is too large", width)
			}
			n := utf8.RuneCountInString(s)
			if int(width) <= n {
				return s, nil
			}
			pad := strings.Repeat("0", int(width)-n)
			if s != "" && (s[0] == '+' || s[0] == '-') {
				return s[:1] + pad + s[1:], nil
			}
			return pad + s, nil
		})
	case "ljust", "rjust", "center":
		return fn(func(args []Value) (Value, error) {
			width, _ := toInt(argOr(args, 0, int64(0)))
			if width > maxStringLen {
				return nil, fmt.Errorf("%s width %d is too large", name, width)
			}
			fill := toStr(argOr(args, 1, " "))
			if utf8.RuneCountInString(fill) != 1 {
				return nil, fmt.Errorf("the fill character must be exactly one character long")
			}
			pad := int(width) - utf8.RuneCountInString(s)
			switch {
			case pad <= 0:
				return s, nil
			case name == "ljust":
				return s + strings.Repeat(fill, pad), nil
			case name == "rjust":
				return strings.Repeat(fill, pad) + s, nil
			}
			return pyCenter(s, int(width), fill), nil
		})
	case "partition", "rpartition":
		return fn(func(args []Value) (Value, error) {
			sep := toStr(argOr(args, 0, ""))
			if sep == "" {
				return nil, fmt.Errorf("empty separator")
			}
			i := strings.Index(s, sep)
			if name == "rpartition" {
				i = strings.LastIndex(s, sep)
			}
			switch {
			case i >= 0:
				return Tuple{s[:i], sep, s[i+len(sep):]}, nil
			case name == "partition":
				return Tuple{s, "", ""}, nil
			}
			return Tuple{"", "", s}, nil
		})
	case "removeprefix":
		return fn(func(args []Value) (Value, error) { return strings.TrimPrefix(s, toStr(argOr(args, 0, ""))), nil })
	case "removesuffix":
		return fn(func(args []Value) (Value, error) { return strings.TrimSuffix(s, toStr(argOr(args, 0, ""))), nil })
	case "casefold":
		return fn(func([]Value) (Value, error) { return pyCasefold(s), nil })
	case "swapcase":
		return fn(func([]Value) (Value, error) { return pySwapcase(s), nil })
	}
	return nil
}

func argOr(args []Value, i int, def Value) Value {
	if i < len(args) {
		return args[i]
	}
	return def
}

func all(s string, f func(rune) bool) bool {
	for _, r := range s {
		if !f(r) {
			return false
		}
	}
	return true
}

// pyFind is str.find/rfind(sub[, start[, end]]) in characters.
func pyFind(s, sub string, bounds []Value, fromRight bool) int {
	rs := []rune(s)
	start, end := 0, len(rs)
	norm := func(v Value, def int) int {
		i64, ok := toInt(v)
		if !ok {
			return def
		}
		i := int(i64)
		if i < 0 {
			i = max(i+len(rs), 0)
		}
		return min(i, len(rs))
	}
	if len(bounds) > 0 {
		start = norm(bounds[0], 0)
	}
	if len(bounds) > 1 {
		end = norm(bounds[1], len(rs))
	}
	if start > end {
		return -1
	}
	window := string(rs[start:end])
	i := strings.Index(window, sub)
	if fromRight {
		i = strings.LastIndex(window, sub)
	}
	if i < 0 {
		return -1
	}
	return start + utf8.RuneCountInString(window[:i])
}

// pySplitLines is str.splitlines: every line boundary Python knows.
func pySplitLines(s string, keepEnds bool) []string {
	var out []string
	for len(s) > 0 {
		i, n := lineBreak(s)
		if i < 0 {
			out = append(out, s)
			break
		}
		if keepEnds {
			out = append(out, s[:i+n])
		} else {
			out = append(out, s[:i])
		}
		s = s[i+n:]
	}
	return out
}

// lineBreak finds the first line boundary: its index and byte length.
func lineBreak(s string) (int, int) {
	for i, r := range s {
		switch r {
		case '\r':
			if strings.HasPrefix(s[i:], "\r\n") {
				return i, 2
			}
			return i, 1
		case '\n', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x85, 0x2028, 0x2029:
			return i, utf8.RuneLen(r)
		}
	}
	return -1, 0
}

func pyIsTitle(s string) bool {
	cased, prevCased := false, false
	for _, r := range s {
		switch {
		case unicode.IsUpper(r) || unicode.IsTitle(r):
			if prevCased {
				return false
			}
			prevCased, cased = true, true
		case unicode.IsLower(r):
			if !prevCased {
				return false
			}
			prevCased, cased = true, true
		default:
			prevCased = false
		}
	}
	return cased
}

// pyIsCase is str.isupper (upper) or str.islower: some cased character,
// and none of the other case.
func pyIsCase(s string, upper bool) bool {
	cased := false
	for _, r := range s {
		switch {
		case unicode.IsTitle(r):
			return false // CPython: a title-case letter is neither
		case unicode.IsUpper(r):
			if !upper {
				return false
			}
			cased = true
		case unicode.IsLower(r):
			if upper {
				return false
			}
			cased = true
		}
	}
	return cased
}
