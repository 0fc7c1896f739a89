package jinja

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode"
)

// The filters of jinja2 that chat templates in the wild use beyond the
// common ones (escape, int with a base, format, groupby, batch, slice,
// truncate, wordwrap, center, attr), with jinja2 3.1's semantics.

// moreFilter applies the filters of this file; ok is false for others.
func moreFilter(name string, v Value, args []Value, kwargs map[string]Value) (out Value, ok bool, err error) {
	switch name {
	case "e", "escape", "forceescape":
		return htmlEscape(toStr(v)), true, nil
	case "int":
		out, err = intFilter(v, args, kwargs)
	case "format":
		s, isStr := v.(string)
		if !isStr {
			return nil, true, fmt.Errorf("format needs a string, not %s", typeName(v))
		}
		if len(kwargs) > 0 {
			if len(args) > 0 {
				return nil, true, fmt.Errorf("can't handle positional and keyword arguments at the same time")
			}
			d := NewDict()
			for _, k := range sortedKeys(kwargs) {
				d.Set(k, kwargs[k])
			}
			out, err = percentFormat(s, d)
		} else {
			out, err = percentFormat(s, Tuple(args))
		}
	case "groupby":
		out, err = groupbyFilter(v, args, kwargs)
	case "batch":
		out, err = batchFilter(v, args, kwargs)
	case "slice":
		out, err = sliceFilter(v, args, kwargs)
	case "truncate":
		out, err = truncateFilter(v, args, kwargs)
	case "wordwrap":
		out, err = wordwrapFilter(v, args, kwargs)
	case "center":
		width := int64(80)
		if w, ok := arg(args, kwargs, 0, "width"); ok {
			width, _ = toInt(w)
		}
		if width > maxStringLen {
			return nil, true, fmt.Errorf("center width %d is too large", width)
		}
		out = pyCenter(toStr(v), int(width), " ")
	case "attr":
		nameV, _ := arg(args, kwargs, 0, "name")
		out = pyGetattr(v, toStr(nameV))
	default:
		return nil, false, nil
	}
	return out, true, err
}

// maxItems bounds the lists batch and slice build.
const maxItems = 1 << 20

var htmlEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;")

// htmlEscape is markupsafe.escape.
func htmlEscape(s string) string { return htmlEscaper.Replace(s) }

// intFilter is int(value, default=0, base=10): int(value, base) for
// strings, int(value) otherwise, then int(float(value)), then default.
func intFilter(v Value, args []Value, kwargs map[string]Value) (Value, error) {
	def, ok := arg(args, kwargs, 0, "default")
	if !ok {
		def = int64(0)
	}
	base := int64(10)
	if b, ok := arg(args, kwargs, 1, "base"); ok {
		base, _ = toInt(b)
	}
	switch x := v.(type) {
	case string:
		if n, ok := pyParseInt(x, int(base)); ok {
			return normInt(n), nil
		}
		f, err := strconv.ParseFloat(strings.TrimFunc(x, pyIsSpace), 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) || strings.ContainsAny(strings.ToLower(x), "xn") {
			return def, nil
		}
		return floatToInt(f), nil
	case bool, int64, *big.Int:
		b, _ := asBig(x)
		return normInt(b), nil
	case float64:
		if math.IsInf(x, 0) || math.IsNaN(x) {
			return def, nil
		}
		return floatToInt(x), nil
	}
	return def, nil
}

func floatToInt(f float64) Value {
	f = math.Trunc(f)
	if f >= -(1<<63) && f < 1<<63 {
		return int64(f)
	}
	b, _ := new(big.Float).SetFloat64(f).Int(nil)
	return b
}

// pyParseInt is Python's int(s, base): surrounding whitespace, a sign, a
// base prefix matching base (any with base 0), underscores between digits.
func pyParseInt(s string, base int) (*big.Int, bool) {
	s = strings.TrimFunc(s, pyIsSpace)
	neg := false
	if s != "" && (s[0] == '+' || s[0] == '-') {
		neg, s = s[0] == '-', s[1:]
	}
	if len(s) > 2 && s[0] == '0' {
		prefixBase := map[byte]int{'x': 16, 'X': 16, 'o': 8, 'O': 8, 'b': 2, 'B': 2}[s[1]]
		if prefixBase != 0 && (base == 0 || base == prefixBase) {
			base, s = prefixBase, strings.TrimPrefix(s[2:], "_")
		}
	}
	if base == 0 {
		if strings.TrimLeft(s, "0_") != "" && s[0] == '0' {
			return nil, false // Python refuses leading zeros in base 0
		}
		base = 10
	}
	if base < 2 || base > 36 || s == "" || s[0] == '_' || s[len(s)-1] == '_' || strings.Contains(s, "__") {
		return nil, false
	}
	for _, r := range s {
		if r > unicode.MaxASCII {
			return nil, false
		}
	}
	n, ok := new(big.Int).SetString(strings.ReplaceAll(s, "_", ""), base)
	if !ok || n.BitLen() > maxIntBits {
		return nil, false
	}
	if neg {
		n.Neg(n)
	}
	return n, true
}

// attrGetter is jinja2's make_attrgetter: "a.b" walks items, integer parts
// index lists, default replaces an undefined result, lower-case strings
// unless case-sensitive. "a,b" (make_multi_attrgetter) gives a tuple.
func attrGetter(attribute string, def Value, caseSensitive bool) func(Value) (Value, error) {
	one := func(path string) func(Value) (Value, error) {
		parts := strings.Split(path, ".")
		return func(it Value) (Value, error) {
			for _, p := range parts {
				var key Value = p
				if n, err := strconv.ParseInt(p, 10, 64); err == nil {
					key = n
				}
				var err error
				if it, err = getItem(it, key); err != nil {
					return nil, err
				}
			}
			if _, undef := it.(Undefined); undef && def != nil {
				it = def
			}
			return sortKey(it, caseSensitive), nil
		}
	}
	if !strings.Contains(attribute, ",") {
		return one(attribute)
	}
	var getters []func(Value) (Value, error)
	for _, part := range strings.Split(attribute, ",") {
		getters = append(getters, one(part))
	}
	return func(it Value) (Value, error) {
		out := make(Tuple, len(getters))
		for i, g := range getters {
			v, err := g(it)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	}
}

// GroupTuple is groupby's (grouper, list) pair.
type GroupTuple []Value

func groupbyFilter(v Value, args []Value, kwargs map[string]Value) (Value, error) {
	attrV, ok := arg(args, kwargs, 0, "attribute")
	if !ok {
		return nil, fmt.Errorf("groupby needs an attribute")
	}
	def, _ := arg(args, kwargs, 1, "default")
	cs, _ := arg(args, kwargs, 2, "case_sensitive")
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	key := attrGetter(toStr(attrV), def, truthy(cs))
	sorted, err := sortValues(items, key, false)
	if err != nil {
		return nil, err
	}
	realKey := attrGetter(toStr(attrV), def, true)
	var out []Value
	var lastKey Value
	for _, it := range sorted {
		k, err := key(it)
		if err != nil {
			return nil, err
		}
		if len(out) == 0 || !equal(k, lastKey) {
			grouper, err := realKey(it)
			if err != nil {
				return nil, err
			}
			out = append(out, GroupTuple{grouper, []Value{}})
			lastKey = k
		}
		g := out[len(out)-1].(GroupTuple)
		g[1] = append(g[1].([]Value), it)
	}
	if out == nil {
		out = []Value{}
	}
	return out, nil
}

func batchFilter(v Value, args []Value, kwargs map[string]Value) (Value, error) {
	countV, _ := arg(args, kwargs, 0, "linecount")
	count, ok := toInt(countV)
	if !ok || count <= 0 || count > maxItems {
		return nil, fmt.Errorf("batch needs a line count from 1 to %d", maxItems)
	}
	fill, hasFill := arg(args, kwargs, 1, "fill_with")
	hasFill = hasFill && fill != nil
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	out := []Value{}
	for i := 0; i < len(items); i += int(count) {
		end := min(i+int(count), len(items))
		batch := append([]Value{}, items[i:end]...)
		for hasFill && len(batch) < int(count) {
			batch = append(batch, fill)
		}
		out = append(out, batch)
	}
	return out, nil
}

func sliceFilter(v Value, args []Value, kwargs map[string]Value) (Value, error) {
	slicesV, _ := arg(args, kwargs, 0, "slices")
	slices, ok := toInt(slicesV)
	if !ok || slices <= 0 || slices > maxItems {
		return nil, fmt.Errorf("slice needs a number of slices from 1 to %d", maxItems)
	}
	fill, hasFill := arg(args, kwargs, 1, "fill_with")
	hasFill = hasFill && fill != nil
	seq, err := iterate(v)
	if err != nil {
		return nil, err
	}
	n := int(slices)
	per, extra := len(seq)/n, len(seq)%n
	offset := 0
	out := make([]Value, 0, n)
	for i := 0; i < n; i++ {
		start := offset + i*per
		if i < extra {
			offset++
		}
		end := offset + (i+1)*per
		part := append([]Value{}, seq[start:end]...)
		if hasFill && i >= extra {
			part = append(part, fill)
		}
		out = append(out, part)
	}
	return out, nil
}

// truncateFilter is truncate(s, length=255, killwords=False, end='...',
// leeway=5), lengths in characters.
func truncateFilter(v Value, args []Value, kwargs map[string]Value) (Value, error) {
	s := []rune(toStr(v))
	length := int64(255)
	if l, ok := arg(args, kwargs, 0, "length"); ok {
		length, _ = toInt(l)
	}
	kill, _ := arg(args, kwargs, 1, "killwords")
	end := "..."
	if e, ok := arg(args, kwargs, 2, "end"); ok {
		end = toStr(e)
	}
	leeway := int64(5)
	if l, ok := arg(args, kwargs, 3, "leeway"); ok && l != nil {
		leeway, _ = toInt(l)
	}
	endLen := int64(len([]rune(end)))
	if length < endLen || leeway < 0 {
		return nil, fmt.Errorf("truncate: length must be at least the end's length and leeway not negative")
	}
	if int64(len(s)) <= length+leeway {
		return string(s), nil
	}
	head := string(s[:length-endLen])
	if truthy(kill) {
		return head + end, nil
	}
	if i := strings.LastIndex(head, " "); i >= 0 {
		head = head[:i]
	}
	return head + end, nil
}

// wordwrapFilter is wordwrap(s, width=79, break_long_words=True,
// wrapstring=None, break_on_hyphens=True): textwrap.wrap on each line.
func wordwrapFilter(v Value, args []Value, kwargs map[string]Value) (Value, error) {
	width := int64(79)
	if w, ok := arg(args, kwargs, 0, "width"); ok {
		width, _ = toInt(w)
	}
	breakLong := true
	if b, ok := arg(args, kwargs, 1, "break_long_words"); ok {
		breakLong = truthy(b)
	}
	wrap := "\n"
	if w, ok := arg(args, kwargs, 2, "wrapstring"); ok && w != nil {
		wrap = toStr(w)
	}
	hyphens := true
	if h, ok := arg(args, kwargs, 3, "break_on_hyphens"); ok {
		hyphens = truthy(h)
	}
	var out []string
	for _, line := range pySplitLines(toStr(v), false) {
		out = append(out, strings.Join(textWrap(line, int(width), breakLong, hyphens), wrap))
	}
	return strings.Join(out, wrap), nil
}

// textWrap is Python's textwrap.wrap with expand_tabs and
// replace_whitespace off and drop_whitespace on.
func textWrap(text string, width int, breakLong, hyphens bool) []string {
	if width <= 0 {
		width = 1
	}
	var chunks [][]rune // reversed at the end, popped from the back
	for _, c := range wrapChunks(text, hyphens) {
		chunks = append(chunks, []rune(c))
	}
	for i, j := 0, len(chunks)-1; i < j; i, j = i+1, j-1 {
		chunks[i], chunks[j] = chunks[j], chunks[i]
	}
	isSpace := func(c []rune) bool { // chunks are all-space or have no space
		return len(c) > 0 && pyIsSpace(c[0])
	}
	var lines []string
	for len(chunks) > 0 {
		var cur [][]rune
		curLen := 0
		if isSpace(chunks[len(chunks)-1]) && len(lines) > 0 {
			chunks = chunks[:len(chunks)-1]
		}
		for len(chunks) > 0 {
			l := len(chunks[len(chunks)-1])
			if curLen+l > width {
				break
			}
			cur = append(cur, chunks[len(chunks)-1])
			chunks = chunks[:len(chunks)-1]
			curLen += l
		}
		if len(chunks) > 0 && len(chunks[len(chunks)-1]) > width {
			chunk := chunks[len(chunks)-1]
			spaceLeft := max(width-curLen, 1)
			switch {
			case breakLong:
				end := spaceLeft
				if hyphens && len(chunk) > spaceLeft {
					if h := strings.LastIndex(string(chunk[:spaceLeft]), "-"); h > 0 && strings.Trim(string(chunk[:len([]rune(string(chunk[:spaceLeft])[:h]))]), "-") != "" {
						end = len([]rune(string(chunk[:spaceLeft])[:h])) + 1
					}
				}
				cur = append(cur, chunk[:end])
				chunks[len(chunks)-1] = chunk[end:]
			case len(cur) == 0:
				cur = append(cur, chunk)
				chunks = chunks[:len(chunks)-1]
			}
		}
		if len(cur) > 0 && isSpace(cur[len(cur)-1]) {
			cur = cur[:len(cur)-1]
		}
		if len(cur) > 0 {
			var b strings.Builder
			for _, c := range cur {
				b.WriteString(string(c))
			}
			lines = append(lines, b.String())
		}
	}
	return lines
}

// wrapChunks splits text into runs of whitespace and words; with hyphens,
// a word also breaks after a hyphen between letters (textwrap's
// wordsep_re, for the common case).
func wrapChunks(text string, hyphens bool) []string {
	var out []string
	rs := []rune(text)
	for i := 0; i < len(rs); {
		j := i
		space := pyIsSpace(rs[i])
		for j < len(rs) && pyIsSpace(rs[j]) == space {
			if !space && hyphens && rs[j] == '-' && j >= i+2 && unicode.IsLetter(rs[j-1]) && unicode.IsLetter(rs[j-2]) &&
				j+1 < len(rs) && unicode.IsLetter(rs[j+1]) {
				j++
				break
			}
			j++
		}
		out = append(out, string(rs[i:j]))
		i = j
	}
	return out
}

// pyCenter is str.center(width, fill).
func pyCenter(s string, width int, fill string) string {
	n := len([]rune(s))
	marg := width - n
	if marg <= 0 {
		return s
	}
	left := marg/2 + (marg & width & 1)
	return strings.Repeat(fill, left) + s + strings.Repeat(fill, marg-left)
}

// pyGetattr is the attr filter: a Python attribute only (methods of dicts
// and strings, namespace attributes), never an item.
func pyGetattr(v Value, name string) Value {
	switch x := v.(type) {
	case *Dict:
		if m := dictMethod(x, name); m != nil {
			return m
		}
	case string:
		if m := stringMethod(x, name); m != nil {
			return m
		}
	case *Namespace:
		if a, ok := x.attrs.Get(name); ok {
			return a
		}
	case GroupTuple:
		switch name {
		case "grouper":
			return x[0]
		case "list":
			return x[1]
		}
	}
	return Undefined{Name: name}
}
