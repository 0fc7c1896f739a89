package jinja

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// Template is a parsed chat template. It is immutable and safe for
// concurrent Render calls.
type Template struct {
	body []node
}

// LineError is a render error with the template line it happened on.
type LineError struct {
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }

func (e *LineError) Unwrap() error { return e.Err }

// atLine attaches the innermost line to a render error; the template's
// own raise_exception messages stay as they are.
func atLine(line int, err error) error {
	var le *LineError
	var te *TemplateError
	if err == nil || errors.As(err, &le) || errors.As(err, &te) {
		return err
	}
	return &LineError{Line: line, Err: err}
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
				return ctrlNone, atLine(n.line, err)
			}
			out.WriteString(toStr(v))
		case located:
			ctrl, err := r.exec(out, []node{n.n}, sc)
			if err != nil || ctrl != ctrlNone {
				return ctrl, atLine(n.line, err)
			}
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
		case withNode:
			inner := &scope{vars: map[string]Value{}, parent: sc}
			for i, x := range n.xs {
				v, err := r.eval(x, sc)
				if err != nil {
					return ctrlNone, err
				}
				inner.vars[n.names[i]] = v
			}
			if ctrl, err := r.exec(out, n.body, inner); err != nil || ctrl != ctrlNone {
				return ctrl, err
			}
		case filterBlockNode:
			var b strings.Builder
			if _, err := r.exec(&b, n.body, sc); err != nil {
				return ctrlNone, err
			}
			v, err := r.eval(n.x, &scope{vars: map[string]Value{filterBodyVar: b.String()}, parent: sc})
			if err != nil {
				return ctrlNone, err
			}
			out.WriteString(toStr(v))
		case callBlockNode:
			caller := &macro{n: n.caller, defined: sc, r: r}
			v, err := r.evalCallWith(n.call, sc, caller)
			if err != nil {
				return ctrlNone, err
			}
			out.WriteString(toStr(v))
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
	changed := &loopChanged{}
	for i, it := range items {
		s := &scope{vars: map[string]Value{"loop": loopObject(items, i, changed)}, parent: sc}
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

// loopChanged is loop.changed's memory across iterations.
type loopChanged struct {
	last Value
	set  bool
}

func loopObject(items []Value, i int, changed *loopChanged) *Dict {
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
	d.Set("changed", builtinFunc(func(args []Value, _ map[string]Value) (Value, error) {
		now := Value(Tuple(args))
		if changed.set && equal(changed.last, now) {
			return false, nil
		}
		changed.last, changed.set = now, true
		return true, nil
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
		return r.evalList(e, sc)
	case dictExpr:
		return r.evalDict(e, sc)
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

func (r *renderer) evalCall(e callExpr, sc *scope) (Value, error) { return r.evalCallWith(e, sc, nil) }

// evalCallWith calls e; caller, when set, is passed to a macro as the
// caller keyword ({% call %}).
func (r *renderer) evalCallWith(e callExpr, sc *scope, caller *macro) (Value, error) {
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
		if caller != nil {
			return nil, fmt.Errorf("{%% call %%} needs a macro, not a builtin function")
		}
		return f(args, kwargs)
	case *macro:
		order := make([]string, len(e.kwargs))
		for i, k := range e.kwargs {
			order[i] = k.name
		}
		return f.callWith(args, kwargs, order, caller)
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
	order := make([]string, 0, len(kwargs))
	for k := range kwargs {
		order = append(order, k)
	}
	sort.Strings(order)
	return m.callWith(args, kwargs, order, nil)
}

// callWith binds the parameters; extra positional arguments are varargs
// (a tuple), extra keywords kwargs (a dict in call order), and caller the
// {% call %} body, as jinja2 binds them.
func (m *macro) callWith(args []Value, kwargs map[string]Value, order []string, caller *macro) (Value, error) {
	m.r.depth++
	defer func() { m.r.depth-- }()
	if m.r.depth > maxMacroDepth {
		return nil, fmt.Errorf("macro %s: recursion deeper than %d", m.n.name, maxMacroDepth)
	}
	s := &scope{vars: map[string]Value{}, parent: m.defined}
	for i, p := range m.n.params {
		switch {
		case i < len(args):
			if hasKwarg(kwargs, p) {
				return nil, fmt.Errorf("macro '%s' got multiple values for argument '%s'", m.n.name, p)
			}
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
	varargs := Tuple{}
	if len(args) > len(m.n.params) {
		varargs = append(varargs, args[len(m.n.params):]...)
	}
	extra := NewDict()
	for _, k := range order {
		if !slices.Contains(m.n.params, k) {
			extra.Set(k, kwargs[k])
		}
	}
	s.vars["varargs"], s.vars["kwargs"] = varargs, extra
	if caller != nil {
		s.vars["caller"] = caller
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

func (r *renderer) evalList(e listExpr, sc *scope) (Value, error) {
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
}

func (r *renderer) evalDict(e dictExpr, sc *scope) (Value, error) {
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
}
