package jinja

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

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
	if isBig(l) || isBig(r) {
		lb, lok := asBig(l)
		rb, rok := asBig(r)
		if lok && rok && op != "/" {
			return bigArith(op, lb, rb)
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
