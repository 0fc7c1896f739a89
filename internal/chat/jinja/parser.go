package jinja

import "fmt"

// Statement nodes.
type (
	node interface{}

	textNode   struct{ text string }
	outputNode struct {
		x    expr
		line int
	}
	// located marks a statement with its template line, for errors.
	located struct {
		n    node
		line int
	}
	ifNode struct {
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
	// withNode: {% with a = x, b = y %}: the values are evaluated in the
	// outer scope; the body gets its own scope.
	withNode struct {
		names []string
		xs    []expr
		body  []node
	}
	// filterBlockNode: {% filter f(args) | g %}: the rendered body is
	// bound to filterBodyVar and x (the filter chain over it) is output.
	filterBlockNode struct {
		x    expr
		body []node
	}
	// callBlockNode: {% call(params) m(args) %}body{% endcall %}: m is
	// called with caller, a macro made of the body.
	callBlockNode struct {
		caller macroNode
		call   callExpr
	}
)

// filterBodyVar holds a filter block's rendered body; it is not a valid
// template identifier, so templates cannot collide with it.
const filterBodyVar = "filter body"

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
			out = append(out, outputNode{x: x, line: seg.line})
		case segBlock:
			ts, err := newTokenStream(seg.text)
			if err != nil {
				return nil, "", fmt.Errorf("line %d: %w", seg.line, err)
			}
			kw := ts.peek()
			switch kw.text {
			case "endif", "else", "elif", "endfor", "endmacro", "endset", "endgeneration", "endwith", "endfilter", "endcall":
				p.pos-- // the caller consumes it
				return out, kw.text, nil
			}
			n, err := p.parseStatement(ts)
			if err != nil {
				return nil, "", fmt.Errorf("line %d: {%% %s %%}: %w", seg.line, seg.text, err)
			}
			if n != nil {
				out = append(out, located{n: n, line: seg.line})
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
	case "with":
		return p.parseWith(ts)
	case "filter":
		return p.parseFilterBlock(ts)
	case "call":
		return p.parseCallBlock(ts)
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
		return nil, fmt.Errorf("unsupported statement {%% %s %%}", kw)
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
	if err := parseParams(ts, &n); err != nil {
		return nil, err
	}
	if err := ts.expectEOF(); err != nil {
		return nil, err
	}
	body, err := p.parseUntil("endmacro")
	if err != nil {
		return nil, err
	}
	n.body = body
	return n, nil
}

// parseParams reads macro parameters up to and including ")".
func parseParams(ts *tokenStream, n *macroNode) error {
	for !ts.acceptOp(")") {
		param := ts.next()
		if param.kind != tokName {
			return fmt.Errorf("macro %s: bad parameter %q", n.name, param.text)
		}
		var def expr
		if ts.acceptOp("=") {
			var err error
			if def, err = ts.parseExpr(); err != nil {
				return err
			}
		}
		n.params = append(n.params, param.text)
		n.defaults = append(n.defaults, def)
		if !ts.acceptOp(",") && ts.peek().text != ")" {
			return fmt.Errorf("macro %s: want ',' or ')'", n.name)
		}
	}
	return nil
}

// parseUntil parses a body and its end tag.
func (p *parser) parseUntil(end string) ([]node, error) {
	body, _, err := p.parseBody()
	if err != nil {
		return nil, err
	}
	if _, _, err := p.closeTag(end); err != nil {
		return nil, err
	}
	return body, nil
}

func (p *parser) parseWith(ts *tokenStream) (node, error) {
	var n withNode
	for ts.peek().kind != tokEOF {
		name := ts.next()
		if name.kind != tokName || !ts.acceptOp("=") {
			return nil, fmt.Errorf("with: want NAME = EXPR, got %q", name.text)
		}
		x, err := ts.parseExpr()
		if err != nil {
			return nil, err
		}
		n.names = append(n.names, name.text)
		n.xs = append(n.xs, x)
		if !ts.acceptOp(",") && ts.peek().kind != tokEOF {
			return nil, fmt.Errorf("with: want ',' between assignments")
		}
	}
	body, err := p.parseUntil("endwith")
	n.body = body
	return n, err
}

func (p *parser) parseFilterBlock(ts *tokenStream) (node, error) {
	if ts.peek().kind != tokName {
		return nil, fmt.Errorf("filter: want a filter name")
	}
	// The chain is parsed as if it followed the body: BODY | f(args) | g.
	ts.toks = append([]token{{kind: tokOp, text: "|"}}, ts.toks[ts.pos:]...)
	ts.pos = 0
	x, err := ts.parseFilterAndTest(nameExpr{name: filterBodyVar})
	if err == nil {
		err = ts.expectEOF()
	}
	if err != nil {
		return nil, err
	}
	body, err := p.parseUntil("endfilter")
	return filterBlockNode{x: x, body: body}, err
}

func (p *parser) parseCallBlock(ts *tokenStream) (node, error) {
	n := callBlockNode{caller: macroNode{name: "caller"}}
	if ts.acceptOp("(") {
		if err := parseParams(ts, &n.caller); err != nil {
			return nil, err
		}
	}
	x, err := ts.parseExpr()
	if err == nil {
		err = ts.expectEOF()
	}
	if err != nil {
		return nil, err
	}
	call, ok := x.(callExpr)
	if !ok {
		return nil, fmt.Errorf("call: want a macro call")
	}
	n.call = call
	n.caller.body, err = p.parseUntil("endcall")
	return n, err
}
