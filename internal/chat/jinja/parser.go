package jinja

import (
	"fmt"
	"strconv"
)

// Statement nodes.
type (
	node interface{}

	textNode   struct{ text string }
	outputNode struct{ x expr }
	ifNode     struct {
		conds  []expr
		bodies [][]node
		orElse []node
	}
	forNode struct {
		targets []string
		iter    expr
		cond    expr // optional "if" filter
		body    []node
		orElse  []node
	}
	setNode struct {
		name string // variable, or namespace object when attr != ""
		attr string
		x    expr
	}
	setBlockNode struct {
		name string
		body []node
	}
	macroNode struct {
		name     string
		params   []string
		defaults []expr // aligned with params; nil when none
		body     []node
	}
	breakNode    struct{}
	continueNode struct{}
)

// Expression nodes.
type (
	expr interface{}

	literal  struct{ v Value }
	nameExpr struct{ name string }
	listExpr struct {
		items []expr
		tuple bool
	}
	dictExpr struct{ keys, vals []expr }
	attrExpr struct {
		obj  expr
		name string
	}
	itemExpr  struct{ obj, key expr }
	sliceExpr struct {
		obj, start, stop, step expr
	}
	callExpr struct {
		fn     expr
		args   []expr
		kwargs []kwarg
	}
	filterExpr struct {
		x      expr
		name   string
		args   []expr
		kwargs []kwarg
	}
	testExpr struct {
		x      expr
		name   string
		args   []expr
		negate bool
	}
	unaryExpr struct {
		op string
		x  expr
	}
	binaryExpr struct {
		op   string
		l, r expr
	}
	compareExpr struct {
		first    expr
		ops      []string
		operands []expr
	}
	condExpr struct{ cond, a, b expr }
)

type kwarg struct {
	name string
	x    expr
}

// parser turns segments into a node tree.
type parser struct {
	segs []segment
	pos  int
}

func parse(segs []segment) ([]node, error) {
	p := &parser{segs: segs}
	body, end, err := p.parseBody()
	if err != nil {
		return nil, err
	}
	if end != "" {
		return nil, fmt.Errorf("unexpected {%% %s %%}", end)
	}
	return body, nil
}

// parseBody parses nodes until an end-ish block tag (endif, else, elif,
// endfor, endmacro, endset, endgeneration) or EOF, which it returns.
func (p *parser) parseBody() ([]node, string, error) {
	var out []node
	for p.pos < len(p.segs) {
		seg := p.segs[p.pos]
		p.pos++
		switch seg.kind {
		case segText:
			out = append(out, textNode{text: seg.text})
		case segVar:
			ts, err := newTokenStream(seg.text)
			if err != nil {
				return nil, "", fmt.Errorf("line %d: %w", seg.line, err)
			}
			x, err := ts.parseExpr()
			if err == nil {
				err = ts.expectEOF()
			}
			if err != nil {
				return nil, "", fmt.Errorf("line %d: {{ %s }}: %w", seg.line, seg.text, err)
			}
			out = append(out, outputNode{x: x})
		case segBlock:
			ts, err := newTokenStream(seg.text)
			if err != nil {
				return nil, "", fmt.Errorf("line %d: %w", seg.line, err)
			}
			kw := ts.peek()
			switch kw.text {
			case "endif", "else", "elif", "endfor", "endmacro", "endset", "endgeneration":
				p.pos-- // the caller consumes it
				return out, kw.text, nil
			}
			n, err := p.parseStatement(ts)
			if err != nil {
				return nil, "", fmt.Errorf("line %d: {%% %s %%}: %w", seg.line, seg.text, err)
			}
			if n != nil {
				out = append(out, n)
			}
		}
	}
	return out, "", nil
}

// closeTag consumes the end tag the caller expects and returns its stream.
func (p *parser) closeTag(want ...string) (*tokenStream, string, error) {
	if p.pos >= len(p.segs) {
		return nil, "", fmt.Errorf("missing {%% %s %%}", want[0])
	}
	ts, err := newTokenStream(p.segs[p.pos].text)
	if err != nil {
		return nil, "", err
	}
	kw := ts.next().text
	for _, w := range want {
		if kw == w {
			p.pos++
			return ts, kw, nil
		}
	}
	return nil, "", fmt.Errorf("got {%% %s %%}, want {%% %s %%}", kw, want[0])
}

func (p *parser) parseStatement(ts *tokenStream) (node, error) {
	switch kw := ts.next().text; kw {
	case "if":
		return p.parseIf(ts)
	case "for":
		return p.parseFor(ts)
	case "set":
		return p.parseSet(ts)
	case "macro":
		return p.parseMacro(ts)
	case "break":
		return breakNode{}, ts.expectEOF()
	case "continue":
		return continueNode{}, ts.expectEOF()
	case "generation":
		// transformers' assistant-mask marker: render the body as is.
		body, _, err := p.parseBody()
		if err != nil {
			return nil, err
		}
		if _, _, err := p.closeTag("endgeneration"); err != nil {
			return nil, err
		}
		return ifNode{conds: []expr{literal{v: true}}, bodies: [][]node{body}}, nil
	default:
		return nil, fmt.Errorf("unsupported statement %q", kw)
	}
}

func (p *parser) parseIf(ts *tokenStream) (node, error) {
	var n ifNode
	for {
		cond, err := ts.parseExpr()
		if err == nil {
			err = ts.expectEOF()
		}
		if err != nil {
			return nil, err
		}
		body, _, err := p.parseBody()
		if err != nil {
			return nil, err
		}
		n.conds = append(n.conds, cond)
		n.bodies = append(n.bodies, body)
		next, kw, err := p.closeTag("endif", "elif", "else")
		if err != nil {
			return nil, err
		}
		switch kw {
		case "endif":
			return n, nil
		case "elif":
			ts = next
			continue
		}
		n.orElse, _, err = p.parseBody()
		if err != nil {
			return nil, err
		}
		if _, _, err := p.closeTag("endif"); err != nil {
			return nil, err
		}
		return n, nil
	}
}

func (p *parser) parseFor(ts *tokenStream) (node, error) {
	var n forNode
	for {
		t := ts.next()
		if t.kind != tokName {
			return nil, fmt.Errorf("for: want a loop variable, got %q", t.text)
		}
		n.targets = append(n.targets, t.text)
		if !ts.acceptOp(",") {
			break
		}
	}
	if t := ts.next(); t.text != "in" {
		return nil, fmt.Errorf("for: want 'in', got %q", t.text)
	}
	iter, err := ts.parseOr() // no conditional expression: "if" filters
	if err != nil {
		return nil, err
	}
	n.iter = iter
	if ts.peek().kind == tokName && ts.peek().text == "if" {
		ts.next()
		if n.cond, err = ts.parseExpr(); err != nil {
			return nil, err
		}
	}
	if err := ts.expectEOF(); err != nil {
		return nil, err
	}
	if n.body, _, err = p.parseBody(); err != nil {
		return nil, err
	}
	_, kw, err := p.closeTag("endfor", "else")
	if err != nil {
		return nil, err
	}
	if kw == "else" {
		if n.orElse, _, err = p.parseBody(); err != nil {
			return nil, err
		}
		if _, _, err := p.closeTag("endfor"); err != nil {
			return nil, err
		}
	}
	return n, nil
}

func (p *parser) parseSet(ts *tokenStream) (node, error) {
	name := ts.next()
	if name.kind != tokName {
		return nil, fmt.Errorf("set: want a variable name, got %q", name.text)
	}
	n := setNode{name: name.text}
	if ts.acceptOp(".") {
		attr := ts.next()
		if attr.kind != tokName {
			return nil, fmt.Errorf("set: want an attribute name after '.'")
		}
		n.attr = attr.text
	}
	if ts.peek().kind == tokEOF && n.attr == "" {
		body, _, err := p.parseBody()
		if err != nil {
			return nil, err
		}
		if _, _, err := p.closeTag("endset"); err != nil {
			return nil, err
		}
		return setBlockNode{name: n.name, body: body}, nil
	}
	if !ts.acceptOp("=") {
		return nil, fmt.Errorf("set: want '='")
	}
	x, err := ts.parseExpr()
	if err == nil {
		err = ts.expectEOF()
	}
	n.x = x
	return n, err
}

func (p *parser) parseMacro(ts *tokenStream) (node, error) {
	name := ts.next()
	if name.kind != tokName || !ts.acceptOp("(") {
		return nil, fmt.Errorf("macro: want NAME(")
	}
	n := macroNode{name: name.text}
	for !ts.acceptOp(")") {
		param := ts.next()
		if param.kind != tokName {
			return nil, fmt.Errorf("macro %s: bad parameter %q", n.name, param.text)
		}
		var def expr
		if ts.acceptOp("=") {
			var err error
			if def, err = ts.parseExpr(); err != nil {
				return nil, err
			}
		}
		n.params = append(n.params, param.text)
		n.defaults = append(n.defaults, def)
		if !ts.acceptOp(",") && ts.peek().text != ")" {
			return nil, fmt.Errorf("macro %s: want ',' or ')'", n.name)
		}
	}
	if err := ts.expectEOF(); err != nil {
		return nil, err
	}
	body, _, err := p.parseBody()
	if err != nil {
		return nil, err
	}
	if _, _, err := p.closeTag("endmacro"); err != nil {
		return nil, err
	}
	n.body = body
	return n, nil
}

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
		v, err := strconv.ParseInt(t.text, 10, 64)
		return literal{v: v}, err
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
		if ts.acceptOp(")") {
			return listExpr{tuple: true}, nil
		}
		x, err := ts.parseExpr()
		if err != nil {
			return nil, err
		}
		if ts.peek().text == "," { // tuple
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
	case "[":
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
	case "{":
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
