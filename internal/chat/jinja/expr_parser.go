package jinja

import (
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
)

// tokenStream parses expressions with Jinja's operator precedence.
type tokenStream struct {
	toks []token
	pos  int
}

func newTokenStream(s string) (*tokenStream, error) {
	toks, err := tokenize(s)
	if err != nil {
		return nil, err
	}
	return &tokenStream{toks: toks}, nil
}

func (ts *tokenStream) peek() token { return ts.toks[ts.pos] }

func (ts *tokenStream) next() token {
	t := ts.toks[ts.pos]
	if t.kind != tokEOF {
		ts.pos++
	}
	return t
}

func (ts *tokenStream) acceptOp(op string) bool {
	if t := ts.peek(); t.kind == tokOp && t.text == op {
		ts.pos++
		return true
	}
	return false
}

func (ts *tokenStream) acceptName(name string) bool {
	if t := ts.peek(); t.kind == tokName && t.text == name {
		ts.pos++
		return true
	}
	return false
}

func (ts *tokenStream) expectOp(op string) error {
	if !ts.acceptOp(op) {
		return fmt.Errorf("want %q, got %q", op, ts.peek().text)
	}
	return nil
}

func (ts *tokenStream) expectEOF() error {
	if t := ts.peek(); t.kind != tokEOF {
		return fmt.Errorf("unexpected %q", t.text)
	}
	return nil
}

// parseExpr: or_expr ["if" or_expr ["else" expr]].
func (ts *tokenStream) parseExpr() (expr, error) {
	x, err := ts.parseOr()
	if err != nil {
		return nil, err
	}
	for ts.acceptName("if") {
		cond, err := ts.parseOr()
		if err != nil {
			return nil, err
		}
		var orElse expr = literal{v: Undefined{}}
		if ts.acceptName("else") {
			if orElse, err = ts.parseExpr(); err != nil {
				return nil, err
			}
		}
		x = condExpr{cond: cond, a: x, b: orElse}
	}
	return x, nil
}

func (ts *tokenStream) parseOr() (expr, error) {
	return ts.parseBinaryLevel([]string{"or"}, true, (*tokenStream).parseAnd)
}

func (ts *tokenStream) parseAnd() (expr, error) {
	return ts.parseBinaryLevel([]string{"and"}, true, (*tokenStream).parseNot)
}

func (ts *tokenStream) parseNot() (expr, error) {
	if ts.acceptName("not") {
		x, err := ts.parseNot()
		return unaryExpr{op: "not", x: x}, err
	}
	return ts.parseCompare()
}

func (ts *tokenStream) parseCompare() (expr, error) {
	first, err := ts.parseMath1()
	if err != nil {
		return nil, err
	}
	c := compareExpr{first: first}
	for {
		t := ts.peek()
		var op string
		switch {
		case t.kind == tokOp && (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" || t.text == "<=" || t.text == ">="):
			op = ts.next().text
		case t.kind == tokName && t.text == "in":
			op = ts.next().text
		case t.kind == tokName && t.text == "not" && ts.toks[ts.pos+1].text == "in":
			ts.pos += 2
			op = "not in"
		}
		if op == "" {
			break
		}
		operand, err := ts.parseMath1()
		if err != nil {
			return nil, err
		}
		c.ops = append(c.ops, op)
		c.operands = append(c.operands, operand)
	}
	if len(c.ops) == 0 {
		return first, nil
	}
	return c, nil
}

func (ts *tokenStream) parseMath1() (expr, error) {
	return ts.parseBinaryLevel([]string{"+", "-"}, false, (*tokenStream).parseConcat)
}

func (ts *tokenStream) parseConcat() (expr, error) {
	return ts.parseBinaryLevel([]string{"~"}, false, (*tokenStream).parseMath2)
}

func (ts *tokenStream) parseMath2() (expr, error) {
	return ts.parseBinaryLevel([]string{"*", "/", "//", "%"}, false, (*tokenStream).parsePow)
}

func (ts *tokenStream) parsePow() (expr, error) {
	return ts.parseBinaryLevel([]string{"**"}, false, (*tokenStream).parseUnary)
}

func (ts *tokenStream) parseBinaryLevel(ops []string, names bool, sub func(*tokenStream) (expr, error)) (expr, error) {
	l, err := sub(ts)
	if err != nil {
		return nil, err
	}
	for {
		t := ts.peek()
		matched := ""
		for _, op := range ops {
			if t.text == op && (t.kind == tokOp || names && t.kind == tokName) {
				matched = op
			}
		}
		if matched == "" {
			return l, nil
		}
		ts.next()
		r, err := sub(ts)
		if err != nil {
			return nil, err
		}
		l = binaryExpr{op: matched, l: l, r: r}
	}
}

// parseUnary parses a unary operand; like jinja2, filters and tests after
// a negation apply to the negated value (-5|abs is 5).
func (ts *tokenStream) parseUnary() (expr, error) {
	x, err := ts.parseUnaryOperand()
	if err != nil {
		return nil, err
	}
	return ts.parseFilterAndTest(x)
}

func (ts *tokenStream) parseUnaryOperand() (expr, error) {
	if ts.acceptOp("-") {
		x, err := ts.parseUnaryOperand()
		return unaryExpr{op: "-", x: x}, err
	}
	if ts.acceptOp("+") {
		return ts.parseUnaryOperand()
	}
	x, err := ts.parsePrimary()
	if err != nil {
		return nil, err
	}
	return ts.parsePostfix(x)
}

func (ts *tokenStream) parsePrimary() (expr, error) {
	t := ts.next()
	switch t.kind {
	case tokString:
		s := t.text
		for ts.peek().kind == tokString { // adjacent literals concatenate
			s += ts.next().text
		}
		return literal{v: s}, nil
	case tokInt:
		digits := strings.ReplaceAll(t.text, "_", "")
		if v, err := strconv.ParseInt(digits, 10, 64); err == nil {
			return literal{v: v}, nil
		}
		b, ok := new(big.Int).SetString(digits, 10)
		if !ok || b.BitLen() > maxIntBits {
			return nil, fmt.Errorf("bad integer literal %q", t.text)
		}
		return literal{v: b}, nil
	case tokFloat:
		v, err := strconv.ParseFloat(t.text, 64)
		return literal{v: v}, err
	case tokName:
		switch t.text {
		case "true", "True":
			return literal{v: true}, nil
		case "false", "False":
			return literal{v: false}, nil
		case "none", "None":
			return literal{v: nil}, nil
		}
		return nameExpr{name: t.text}, nil
	}
	switch t.text {
	case "(":
		return ts.parseParen()
	case "[":
		return ts.parseListLiteral()
	case "{":
		return ts.parseDictLiteral()
	}
	return nil, fmt.Errorf("unexpected %q", t.text)
}

func (ts *tokenStream) parsePostfix(x expr) (expr, error) {
	for {
		switch {
		case ts.acceptOp("."):
			t := ts.next()
			if t.kind != tokName && t.kind != tokInt {
				return nil, fmt.Errorf("want an attribute name after '.'")
			}
			x = attrExpr{obj: x, name: t.text}
		case ts.acceptOp("["):
			var err error
			if x, err = ts.parseSubscript(x); err != nil {
				return nil, err
			}
		case ts.acceptOp("("):
			args, kwargs, err := ts.parseArgs()
			if err != nil {
				return nil, err
			}
			x = callExpr{fn: x, args: args, kwargs: kwargs}
		default:
			return x, nil
		}
	}
}

// parseSubscript parses after "[": an index or a slice.
func (ts *tokenStream) parseSubscript(obj expr) (expr, error) {
	var parts [3]expr
	n, isSlice := 0, false
	for {
		if t := ts.peek(); !(t.kind == tokOp && (t.text == ":" || t.text == "]")) {
			x, err := ts.parseExpr()
			if err != nil {
				return nil, err
			}
			parts[n] = x
		}
		if ts.acceptOp("]") {
			break
		}
		if err := ts.expectOp(":"); err != nil {
			return nil, err
		}
		isSlice = true
		if n++; n > 2 {
			return nil, fmt.Errorf("slice: too many ':'")
		}
	}
	if !isSlice {
		return itemExpr{obj: obj, key: parts[0]}, nil
	}
	return sliceExpr{obj: obj, start: parts[0], stop: parts[1], step: parts[2]}, nil
}

// parseArgs parses after "(" up to and including ")".
func (ts *tokenStream) parseArgs() ([]expr, []kwarg, error) {
	var args []expr
	var kwargs []kwarg
	for !ts.acceptOp(")") {
		if t := ts.peek(); t.kind == tokName && ts.toks[ts.pos+1].text == "=" && ts.toks[ts.pos+1].kind == tokOp {
			ts.pos += 2
			x, err := ts.parseExpr()
			if err != nil {
				return nil, nil, err
			}
			kwargs = append(kwargs, kwarg{name: t.text, x: x})
		} else {
			x, err := ts.parseExpr()
			if err != nil {
				return nil, nil, err
			}
			args = append(args, x)
		}
		if !ts.acceptOp(",") && ts.peek().text != ")" {
			return nil, nil, fmt.Errorf("call: want ',' or ')', got %q", ts.peek().text)
		}
	}
	return args, kwargs, nil
}

// parseFilterAndTest parses "| filter(args)" chains and "is [not] test".
func (ts *tokenStream) parseFilterAndTest(x expr) (expr, error) {
	for {
		switch {
		case ts.acceptOp("|"):
			name := ts.next()
			if name.kind != tokName {
				return nil, fmt.Errorf("want a filter name after '|'")
			}
			if !knownFilter(name.text) {
				return nil, fmt.Errorf("unsupported filter %q", name.text)
			}
			f := filterExpr{x: x, name: name.text}
			if ts.acceptOp("(") {
				var err error
				if f.args, f.kwargs, err = ts.parseArgs(); err != nil {
					return nil, err
				}
			}
			x = f
		case ts.acceptName("is"):
			t := testExpr{x: x, negate: ts.acceptName("not")}
			name := ts.next()
			if name.kind != tokName {
				return nil, fmt.Errorf("want a test name after 'is'")
			}
			t.name = name.text
			if !knownTest(t.name) {
				return nil, fmt.Errorf("unsupported test %q", t.name)
			}
			if ts.acceptOp("(") {
				args, _, err := ts.parseArgs()
				if err != nil {
					return nil, err
				}
				t.args = args
			} else if nt := ts.peek(); nt.kind == tokString || nt.kind == tokInt || nt.kind == tokFloat ||
				nt.kind == tokName && !isKeyword(nt.text) {
				arg, err := ts.parsePrimary()
				if err != nil {
					return nil, err
				}
				t.args = []expr{arg}
			}
			x = t
		default:
			return x, nil
		}
	}
}

func isKeyword(s string) bool {
	switch s {
	case "and", "or", "not", "in", "is", "if", "else":
		return true
	}
	return false
}

// parseParen parses after "(": a parenthesised expression or a tuple.
func (ts *tokenStream) parseParen() (expr, error) {
	if ts.acceptOp(")") {
		return listExpr{tuple: true}, nil
	}
	x, err := ts.parseExpr()
	if err != nil {
		return nil, err
	}
	if ts.peek().text == "," {
		items := []expr{x}
		for ts.acceptOp(",") && ts.peek().text != ")" {
			item, err := ts.parseExpr()
			if err != nil {
				return nil, err
			}
			items = append(items, item)
		}
		x = listExpr{items: items, tuple: true}
	}
	return x, ts.expectOp(")")
}

// parseListLiteral parses after "[".
func (ts *tokenStream) parseListLiteral() (expr, error) {
	var l listExpr
	for !ts.acceptOp("]") {
		item, err := ts.parseExpr()
		if err != nil {
			return nil, err
		}
		l.items = append(l.items, item)
		if !ts.acceptOp(",") && ts.peek().text != "]" {
			return nil, fmt.Errorf("list: want ',' or ']'")
		}
	}
	return l, nil
}

// parseDictLiteral parses after "{".
func (ts *tokenStream) parseDictLiteral() (expr, error) {
	var d dictExpr
	for !ts.acceptOp("}") {
		k, err := ts.parseExpr()
		if err != nil {
			return nil, err
		}
		if err := ts.expectOp(":"); err != nil {
			return nil, err
		}
		v, err := ts.parseExpr()
		if err != nil {
			return nil, err
		}
		d.keys, d.vals = append(d.keys, k), append(d.vals, v)
		if !ts.acceptOp(",") && ts.peek().text != "}" {
			return nil, fmt.Errorf("dict: want ',' or '}'")
		}
	}
	return d, nil
}

// filterNames lists the filters the renderer implements; an unsupported
// one fails at parse time with its line, as jinja2's
// TemplateAssertionError does.
func filterNames() []string {
	return []string{"abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape",
		"first", "float", "forceescape", "format", "groupby", "indent", "int", "items", "join", "last", "length",
		"list", "lower", "map", "max", "min", "reject", "rejectattr", "replace", "reverse", "round", "safe",
		"select", "selectattr", "slice", "sort", "string", "sum", "title", "tojson", "trim", "truncate",
		"unique", "upper", "wordwrap"}
}

// testNames is filterNames for tests.
func testNames() []string {
	return []string{"!=", "<", "<=", "==", ">", ">=", "boolean", "callable", "defined", "divisibleby", "eq", "equalto",
		"even", "false", "float", "ge", "gt", "in", "integer", "iterable", "le", "lower", "lt", "mapping", "ne",
		"none", "number", "odd", "sameas", "sequence", "string", "true", "undefined", "upper"}
}

func knownFilter(name string) bool { return slices.Contains(filterNames(), name) }

func knownTest(name string) bool { return slices.Contains(testNames(), name) }
