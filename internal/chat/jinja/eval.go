package jinja

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// Template is a parsed chat template. It is immutable and safe for
// concurrent Render calls.
type Template struct {
	body []node
}

// TemplateError is raised by the template itself through
// raise_exception(message), as transformers' TemplateError.
type TemplateError struct{ Message string }

func (e *TemplateError) Error() string { return "TemplateError: " + e.Message }

// Parse compiles template source.
func Parse(src string) (*Template, error) {
	segs, err := lex(src)
	if err != nil {
		return nil, fmt.Errorf("lex template: %w", err)
	}
	body, err := parse(segs)
	if err != nil {
		return nil, fmt.Errorf("parse template: %w", err)
	}
	return &Template{body: body}, nil
}

// RenderOptions are the environment's inputs besides the variables.
type RenderOptions struct {
	// Now is the clock strftime_now reads; nil means time.Now.
	Now func() time.Time
}

// Render executes the template with the given top-level variables.
func (t *Template) Render(vars map[string]Value, opts RenderOptions) (string, error) {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	globals := &scope{vars: globalFunctions(now)}
	root := &scope{vars: map[string]Value{}, parent: globals}
	for k, v := range vars {
		root.vars[k] = v
	}
	r := &renderer{root: root}
	var out strings.Builder
	if _, err := r.exec(&out, t.body, root); err != nil {
		return "", err
	}
	return out.String(), nil
}

type scope struct {
	vars   map[string]Value
	parent *scope
}

func (s *scope) lookup(name string) (Value, bool) {
	for c := s; c != nil; c = c.parent {
		if v, ok := c.vars[name]; ok {
			return v, true
		}
	}
	return nil, false
}

type renderer struct {
	root  *scope
	depth int // macro recursion depth
	steps int // statements executed, against maxSteps
}

// control is how a statement list ended.
type control int

const (
	ctrlNone control = iota
	ctrlBreak
	ctrlContinue
)

// builtinFunc is a callable provided by the environment.
type builtinFunc func(args []Value, kwargs map[string]Value) (Value, error)

// macro is a {% macro %} bound to the scope it was defined in.
type macro struct {
	n       macroNode
	defined *scope
	r       *renderer
}

func (r *renderer) exec(out *strings.Builder, body []node, sc *scope) (control, error) {
	for _, n := range body {
		if r.steps++; r.steps > maxSteps {
			return ctrlNone, fmt.Errorf("template executed more than %d statements", maxSteps)
		}
		if out.Len() > maxStringLen {
			return ctrlNone, fmt.Errorf("template output longer than %d bytes", maxStringLen)
		}
		switch n := n.(type) {
		case textNode:
			out.WriteString(n.text)
		case outputNode:
			v, err := r.eval(n.x, sc)
			if err != nil {
				return ctrlNone, err
			}
			out.WriteString(toStr(v))
		case ifNode:
			ctrl, err := r.execIf(out, n, sc)
			if err != nil || ctrl != ctrlNone {
				return ctrl, err
			}
		case forNode:
			if err := r.execFor(out, n, sc); err != nil {
				return ctrlNone, err
			}
		case setNode:
			if err := r.execSet(n, sc); err != nil {
				return ctrlNone, err
			}
		case setBlockNode:
			var b strings.Builder
			if _, err := r.exec(&b, n.body, sc); err != nil {
				return ctrlNone, err
			}
			sc.vars[n.name] = b.String()
		case macroNode:
			sc.vars[n.name] = &macro{n: n, defined: sc, r: r}
		case breakNode:
			return ctrlBreak, nil
		case continueNode:
			return ctrlContinue, nil
		}
	}
	return ctrlNone, nil
}

func (r *renderer) execIf(out *strings.Builder, n ifNode, sc *scope) (control, error) {
	for i, cond := range n.conds {
		v, err := r.eval(cond, sc)
		if err != nil {
			return ctrlNone, err
		}
		if truthy(v) {
			return r.exec(out, n.bodies[i], sc)
		}
	}
	return r.exec(out, n.orElse, sc)
}

func (r *renderer) execSet(n setNode, sc *scope) error {
	v, err := r.eval(n.x, sc)
	if err != nil {
		return err
	}
	if n.attr == "" {
		sc.vars[n.name] = v
		return nil
	}
	obj, _ := sc.lookup(n.name)
	ns, ok := obj.(*Namespace)
	if !ok {
		return fmt.Errorf("cannot assign attribute on non-namespace object %q", n.name)
	}
	ns.attrs.Set(n.attr, v)
	return nil
}

func (r *renderer) execFor(out *strings.Builder, n forNode, sc *scope) error {
	iterV, err := r.eval(n.iter, sc)
	if err != nil {
		return err
	}
	items, err := iterate(iterV)
	if err != nil {
		return err
	}
	if n.cond != nil { // the "if" filter runs before loop variables exist
		var kept []Value
		for _, it := range items {
			s := &scope{vars: map[string]Value{}, parent: sc}
			if err := bindTargets(s, n.targets, it); err != nil {
				return err
			}
			ok, err := r.eval(n.cond, s)
			if err != nil {
				return err
			}
			if truthy(ok) {
				kept = append(kept, it)
			}
		}
		items = kept
	}
	if len(items) == 0 {
		_, err := r.exec(out, n.orElse, sc)
		return err
	}
	for i, it := range items {
		s := &scope{vars: map[string]Value{"loop": loopObject(items, i)}, parent: sc}
		if err := bindTargets(s, n.targets, it); err != nil {
			return err
		}
		ctrl, err := r.exec(out, n.body, s)
		if err != nil {
			return err
		}
		if ctrl == ctrlBreak {
			break
		}
	}
	return nil
}

func bindTargets(s *scope, targets []string, item Value) error {
	if len(targets) == 1 {
		s.vars[targets[0]] = item
		return nil
	}
	parts, ok := asList(item).([]Value)
	if !ok || len(parts) != len(targets) {
		return fmt.Errorf("cannot unpack %s into %d loop variables", typeName(item), len(targets))
	}
	for i, t := range targets {
		s.vars[t] = parts[i]
	}
	return nil
}

func loopObject(items []Value, i int) *Dict {
	d := NewDict()
	n := len(items)
	d.Set("index", int64(i+1))
	d.Set("index0", int64(i))
	d.Set("revindex", int64(n-i))
	d.Set("revindex0", int64(n-i-1))
	d.Set("first", i == 0)
	d.Set("last", i == n-1)
	d.Set("length", int64(n))
	d.Set("depth", int64(1))
	d.Set("depth0", int64(0))
	var prev, next Value = Undefined{Name: "previtem"}, Undefined{Name: "nextitem"}
	if i > 0 {
		prev = items[i-1]
	}
	if i+1 < n {
		next = items[i+1]
	}
	d.Set("previtem", prev)
	d.Set("nextitem", next)
	d.Set("cycle", builtinFunc(func(args []Value, _ map[string]Value) (Value, error) {
		if len(args) == 0 {
			return nil, fmt.Errorf("loop.cycle needs at least one argument")
		}
		return args[i%len(args)], nil
	}))
	return d
}

// iterate lists what a for loop visits: list items, dict keys, string
// characters; Undefined is empty.
func iterate(v Value) ([]Value, error) {
	switch x := asList(v).(type) {
	case []Value:
		return x, nil
	case *Dict:
		out := make([]Value, len(x.keys))
		for i, k := range x.keys {
			out[i] = k
		}
		return out, nil
	case string:
		var out []Value
		for _, r := range x {
			out = append(out, string(r))
		}
		return out, nil
	case Undefined:
		return nil, nil
	}
	return nil, fmt.Errorf("'%s' object is not iterable", typeName(v))
}

func (r *renderer) eval(e expr, sc *scope) (Value, error) {
	switch e := e.(type) {
	case literal:
		return e.v, nil
	case nameExpr:
		if v, ok := sc.lookup(e.name); ok {
			return v, nil
		}
		return Undefined{Name: e.name}, nil
	case listExpr:
		out := make([]Value, len(e.items))
		for i, it := range e.items {
			v, err := r.eval(it, sc)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		if e.tuple {
			return Tuple(out), nil
		}
		return out, nil
	case dictExpr:
		d := NewDict()
		for i := range e.keys {
			k, err := r.eval(e.keys[i], sc)
			if err != nil {
				return nil, err
			}
			v, err := r.eval(e.vals[i], sc)
			if err != nil {
				return nil, err
			}
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("dict keys must be strings, got %s", typeName(k))
			}
			d.Set(ks, v)
		}
		return d, nil
	case attrExpr:
		obj, err := r.eval(e.obj, sc)
		if err != nil {
			return nil, err
		}
		return getAttr(obj, e.name)
	case itemExpr:
		obj, err := r.eval(e.obj, sc)
		if err != nil {
			return nil, err
		}
		key, err := r.eval(e.key, sc)
		if err != nil {
			return nil, err
		}
		return getItem(obj, key)
	case sliceExpr:
		return r.evalSlice(e, sc)
	case callExpr:
		return r.evalCall(e, sc)
	case filterExpr:
		return r.evalFilter(e, sc)
	case testExpr:
		return r.evalTest(e, sc)
	case unaryExpr:
		v, err := r.eval(e.x, sc)
		if err != nil {
			return nil, err
		}
		if e.op == "not" {
			return !truthy(v), nil
		}
		if f, ok := v.(float64); ok {
			return -f, nil // keeps the sign of zero, as Python does
		}
		return arith("-", int64(0), v)
	case binaryExpr:
		return r.evalBinary(e, sc)
	case compareExpr:
		return r.evalCompare(e, sc)
	case condExpr:
		c, err := r.eval(e.cond, sc)
		if err != nil {
			return nil, err
		}
		if truthy(c) {
			return r.eval(e.a, sc)
		}
		return r.eval(e.b, sc)
	}
	return nil, fmt.Errorf("unknown expression %T", e)
}

func (r *renderer) evalBinary(e binaryExpr, sc *scope) (Value, error) {
	l, err := r.eval(e.l, sc)
	if err != nil {
		return nil, err
	}
	switch e.op {
	case "and":
		if !truthy(l) {
			return l, nil
		}
		return r.eval(e.r, sc)
	case "or":
		if truthy(l) {
			return l, nil
		}
		return r.eval(e.r, sc)
	}
	rv, err := r.eval(e.r, sc)
	if err != nil {
		return nil, err
	}
	if e.op == "~" {
		return toStr(l) + toStr(rv), nil
	}
	return arith(e.op, l, rv)
}

func (r *renderer) evalCompare(e compareExpr, sc *scope) (Value, error) {
	l, err := r.eval(e.first, sc)
	if err != nil {
		return nil, err
	}
	for i, op := range e.ops {
		rv, err := r.eval(e.operands[i], sc)
		if err != nil {
			return nil, err
		}
		ok, err := compareOp(op, l, rv)
		if err != nil || !ok {
			return false, err
		}
		l = rv
	}
	return true, nil
}

func compareOp(op string, l, r Value) (bool, error) {
	switch op {
	case "==":
		return equal(l, r), nil
	case "!=":
		return !equal(l, r), nil
	case "in":
		return contains(r, l)
	case "not in":
		ok, err := contains(r, l)
		return !ok, err
	}
	c, err := compare(l, r)
	if err != nil {
		return false, err
	}
	switch op {
	case "<":
		return c < 0, nil
	case ">":
		return c > 0, nil
	case "<=":
		return c <= 0, nil
	}
	return c >= 0, nil
}

// contains is Python's "needle in container".
func contains(container, needle Value) (bool, error) {
	switch c := asList(container).(type) {
	case string:
		s, ok := needle.(string)
		if !ok {
			return false, fmt.Errorf("'in <string>' requires string as left operand, not %s", typeName(needle))
		}
		return strings.Contains(c, s), nil
	case []Value:
		for _, v := range c {
			if equal(v, needle) {
				return true, nil
			}
		}
		return false, nil
	case *Dict:
		s, ok := needle.(string)
		if !ok {
			return false, nil
		}
		_, found := c.m[s]
		return found, nil
	case Undefined:
		return false, nil
	}
	return false, fmt.Errorf("argument of type '%s' is not iterable", typeName(container))
}

// arith implements + - * / // % ** with Python semantics.
func arith(op string, l, r Value) (Value, error) {
	if _, ok := l.(Undefined); ok {
		return nil, fmt.Errorf("'%s' is undefined", l.(Undefined).Name)
	}
	if _, ok := r.(Undefined); ok {
		return nil, fmt.Errorf("'%s' is undefined", r.(Undefined).Name)
	}
	if s, ok := l.(string); ok && op == "%" {
		return percentFormat(s, r)
	}
	if op == "+" {
		switch x := asList(l).(type) {
		case string:
			if y, ok := r.(string); ok {
				return x + y, nil
			}
		case []Value:
			if y, ok := asList(r).([]Value); ok {
				return append(append([]Value{}, x...), y...), nil
			}
		}
	}
	if op == "*" {
		s, n, ok := l, r, false
		if _, isStr := s.(string); !isStr {
			s, n = r, l
		}
		if str, isStr := s.(string); isStr {
			var count int64
			if count, ok = toInt(n); ok {
				if count > 0 && int64(len(str))*count > maxStringLen {
					return nil, fmt.Errorf("string repetition longer than %d bytes", maxStringLen)
				}
				return strings.Repeat(str, int(max(count, 0))), nil
			}
		}
	}
	li, lInt := toInt(l)
	ri, rInt := toInt(r)
	if lInt && rInt && op != "/" {
		return intArith(op, li, ri)
	}
	lf, lok := toFloat(l)
	rf, rok := toFloat(r)
	if !lok || !rok {
		return nil, fmt.Errorf("unsupported operand type(s) for %s: '%s' and '%s'", op, typeName(l), typeName(r))
	}
	switch op {
	case "+":
		return lf + rf, nil
	case "-":
		return lf - rf, nil
	case "*":
		return lf * rf, nil
	case "**":
		return math.Pow(lf, rf), nil
	}
	if rf == 0 {
		return nil, errors.New("division by zero")
	}
	switch op {
	case "/":
		return lf / rf, nil
	case "//":
		return math.Floor(lf / rf), nil
	}
	return lf - rf*math.Floor(lf/rf), nil
}

func intArith(op string, a, b int64) (Value, error) {
	switch op {
	case "+":
		return a + b, nil
	case "-":
		return a - b, nil
	case "*":
		return a * b, nil
	case "**":
		if b < 0 {
			return math.Pow(float64(a), float64(b)), nil
		}
		out := int64(1)
		for base := a; b > 0; b >>= 1 { // by squaring: O(log b)
			if b&1 == 1 {
				out *= base
			}
			base *= base
		}
		return out, nil
	}
	if b == 0 {
		return nil, errors.New("integer division or modulo by zero")
	}
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q-- // floor division
	}
	if op == "//" {
		return q, nil
	}
	return a - q*b, nil
}

func (r *renderer) evalSlice(e sliceExpr, sc *scope) (Value, error) {
	obj, err := r.eval(e.obj, sc)
	if err != nil {
		return nil, err
	}
	var bounds [3]*int64
	for i, x := range []expr{e.start, e.stop, e.step} {
		if x == nil {
			continue
		}
		v, err := r.eval(x, sc)
		if err != nil {
			return nil, err
		}
		if v == nil {
			continue
		}
		n, ok := toInt(v)
		if !ok {
			return nil, fmt.Errorf("slice indices must be integers or None")
		}
		bounds[i] = &n
	}
	switch x := asList(obj).(type) {
	case []Value:
		idx, err := sliceIndices(len(x), bounds)
		if err != nil {
			return nil, err
		}
		out := make([]Value, len(idx))
		for i, j := range idx {
			out[i] = x[j]
		}
		return out, nil
	case string:
		rs := []rune(x)
		idx, err := sliceIndices(len(rs), bounds)
		if err != nil {
			return nil, err
		}
		out := make([]rune, len(idx))
		for i, j := range idx {
			out[i] = rs[j]
		}
		return string(out), nil
	}
	return nil, fmt.Errorf("'%s' object is not subscriptable", typeName(obj))
}

// sliceIndices resolves a Python slice over n items.
func sliceIndices(n int, b [3]*int64) ([]int, error) {
	step := int64(1)
	if b[2] != nil {
		step = *b[2]
	}
	if step == 0 {
		return nil, errors.New("slice step cannot be zero")
	}
	clamp := func(p *int64, def int64, lo, hi int64) int64 {
		if p == nil {
			return def
		}
		v := *p
		if v < 0 {
			v += int64(n)
		}
		return min(max(v, lo), hi)
	}
	var out []int
	if step > 0 {
		start, stop := clamp(b[0], 0, 0, int64(n)), clamp(b[1], int64(n), 0, int64(n))
		for i := start; i < stop; i += step {
			out = append(out, int(i))
		}
	} else {
		start, stop := clamp(b[0], int64(n)-1, -1, int64(n)-1), clamp(b[1], -1, -1, int64(n)-1)
		if b[1] != nil && *b[1] < 0 && *b[1]+int64(n) < 0 {
			stop = -1
		}
		for i := start; i > stop; i += step {
			out = append(out, int(i))
		}
	}
	return out, nil
}

func (r *renderer) evalArgs(args []expr, kwargs []kwarg, sc *scope) ([]Value, map[string]Value, error) {
	vals := make([]Value, len(args))
	for i, a := range args {
		v, err := r.eval(a, sc)
		if err != nil {
			return nil, nil, err
		}
		vals[i] = v
	}
	kw := map[string]Value{}
	for _, k := range kwargs {
		v, err := r.eval(k.x, sc)
		if err != nil {
			return nil, nil, err
		}
		kw[k.name] = v
	}
	return vals, kw, nil
}

func (r *renderer) evalCall(e callExpr, sc *scope) (Value, error) {
	fn, err := r.eval(e.fn, sc)
	if err != nil {
		return nil, err
	}
	args, kwargs, err := r.evalArgs(e.args, e.kwargs, sc)
	if err != nil {
		return nil, err
	}
	switch f := fn.(type) {
	case builtinFunc:
		return f(args, kwargs)
	case *macro:
		return f.call(args, kwargs)
	case Undefined:
		return nil, fmt.Errorf("'%s' is undefined", f.Name)
	}
	return nil, fmt.Errorf("'%s' object is not callable", typeName(fn))
}

// Limits that keep a hostile or broken template from exhausting memory
// or the stack.
const (
	maxMacroDepth = 200
	maxStringLen  = 64 << 20
	maxSteps      = 2_000_000
)

func (m *macro) call(args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) > len(m.n.params) {
		return nil, fmt.Errorf("macro %s takes %d arguments, got %d", m.n.name, len(m.n.params), len(args))
	}
	m.r.depth++
	defer func() { m.r.depth-- }()
	if m.r.depth > maxMacroDepth {
		return nil, fmt.Errorf("macro %s: recursion deeper than %d", m.n.name, maxMacroDepth)
	}
	s := &scope{vars: map[string]Value{}, parent: m.defined}
	for i, p := range m.n.params {
		switch {
		case i < len(args):
			s.vars[p] = args[i]
		case hasKwarg(kwargs, p):
			s.vars[p] = kwargs[p]
		case m.n.defaults[i] != nil:
			v, err := m.r.eval(m.n.defaults[i], s)
			if err != nil {
				return nil, err
			}
			s.vars[p] = v
		default:
			s.vars[p] = Undefined{Name: p}
		}
	}
	var out strings.Builder
	if _, err := m.r.exec(&out, m.n.body, s); err != nil {
		return nil, err
	}
	return out.String(), nil
}

func hasKwarg(kwargs map[string]Value, name string) bool {
	_, ok := kwargs[name]
	return ok
}
