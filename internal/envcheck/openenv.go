package envcheck

import (
	"github.com/ortrain/ortrain/internal/jsonschema"

	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"
)

// checkOpenEnv runs the OpenEnv cases against the wire of
// openenv-protocol.md §2: the HTTP endpoints and their error replies,
// JSON-RPC on POST /mcp, the /ws session protocol with its error codes,
// the /mcp WebSocket, and capacity and session independence.
func checkOpenEnv(ctx context.Context, u *url.URL, o Options, r *recorder) {
	x := &oe{ctx: ctx, base: origin(u), o: o, r: r, ok: map[string]bool{}}
	x.health()
	x.schema()
	x.metadata()
	x.httpCases()
	x.mcpHTTP()
	x.wsMain()
	x.wsSessionError()
	x.mcpSocket()
	x.capacity()
}

// oe is one OpenEnv check run: what later cases learn from earlier ones.
type oe struct {
	ctx  context.Context
	base string
	o    Options
	r    *recorder
	ok   map[string]bool // case name → passed

	// action is /schema's action schema (nil when openenv/schema failed);
	// mcpEnv says it is CallToolAction, the mark of an MCP tool env.
	action map[string]any
	mcpEnv bool
	// tools are POST /mcp tools/list's tools (MCP envs).
	tools []oeTool
}

// check runs a case unless a case it needs did not pass, which it then
// names as the reason for the skip.
func (x *oe) check(name, expected string, needs []string, f func() (string, bool)) bool {
	for _, n := range needs {
		if !x.ok[n] {
			x.r.skip(name, fmt.Sprintf("needs %s, which did not pass", n))
			return false
		}
	}
	ok := x.r.run(name, expected, f)
	x.ok[name] = ok
	return ok
}

// fetchObject sends one request and wants HTTP 200 with a JSON object;
// the string says what came instead ("" when it did).
func (x *oe) fetchObject(method, path string, body []byte, timeout time.Duration) (map[string]any, *exchange, string) {
	ex, err := do(x.ctx, x.o, method, x.base+path, body, nil, timeout)
	switch {
	case err != nil:
		return nil, nil, "no answer: " + err.Error()
	case ex.Status != http.StatusOK:
		return nil, ex, fmt.Sprintf("HTTP %d: %s", ex.Status, brief(ex.Body))
	}
	obj, err := oeObject(ex.Body)
	if err != nil {
		return nil, ex, "HTTP 200 with a body that is not a JSON object: " + brief(ex.Body)
	}
	return obj, ex, ""
}

func (x *oe) health() {
	x.check("openenv/health", `GET /health answers 200 with the JSON {"status":"healthy"} (§2 Endpoints)`, nil, func() (string, bool) {
		obj, ex, bad := x.fetchObject(http.MethodGet, "/health", nil, x.o.RequestTimeout)
		if bad != "" {
			return bad, false
		}
		if obj["status"] != "healthy" {
			return fmt.Sprintf(`status is %s, not "healthy": %s`, oeText(obj["status"]), brief(ex.Body)), false
		}
		return brief(ex.Body), true
	})
}

func (x *oe) schema() {
	x.check("openenv/schema", `GET /schema answers 200 with {"action":<JSON Schema>,"observation":<JSON Schema>,"state":<JSON Schema>}, each an object (§2 Endpoints)`, nil, func() (string, bool) {
		obj, ex, why := x.fetchObject(http.MethodGet, "/schema", nil, x.o.RequestTimeout)
		if why != "" {
			return why, false
		}
		var parts, bad []string
		for _, k := range []string{"action", "observation", "state"} {
			s, isObj := obj[k].(map[string]any)
			switch {
			case obj[k] == nil:
				bad = append(bad, "no "+k+" schema")
			case !isObj:
				bad = append(bad, fmt.Sprintf("the %s schema is not an object: %s", k, oeText(obj[k])))
			default:
				parts = append(parts, fmt.Sprintf("%s %s", k, oeSchemaSummary(s)))
			}
		}
		if len(bad) > 0 {
			return strings.Join(bad, "; ") + ": " + brief(ex.Body), false
		}
		x.action = obj["action"].(map[string]any)
		x.mcpEnv = oeIsCallTool(x.action)
		return strings.Join(parts, ", "), true
	})
}

// oeIsCallTool: the action schema is CallToolAction (tool_name, type
// call_tool), which an MCP env reports as its action.
func oeIsCallTool(s map[string]any) bool {
	props, _ := s["properties"].(map[string]any)
	typ, _ := props["type"].(map[string]any)
	_, hasTool := props["tool_name"]
	return hasTool && typ != nil && (typ["const"] == "call_tool" || typ["default"] == "call_tool")
}

// oeSchemaSummary is a schema's title and property names, for observed.
func oeSchemaSummary(s map[string]any) string {
	title, _ := s["title"].(string)
	props, _ := s["properties"].(map[string]any)
	names := make([]string, 0, len(props))
	for k := range props {
		names = append(names, k)
	}
	sort.Strings(names)
	return strings.TrimSpace(title + " {" + strings.Join(names, ",") + "}")
}

func (x *oe) metadata() {
	x.check("openenv/metadata", "GET /metadata answers 200 with name and description (strings) and readme_content, version, author, documentation_url (string or null) (§2 Endpoints)", nil, func() (string, bool) {
		obj, ex, why := x.fetchObject(http.MethodGet, "/metadata", nil, x.o.RequestTimeout)
		if why != "" {
			return why, false
		}
		var bad []string
		if name, _ := obj["name"].(string); name == "" {
			bad = append(bad, "name is not a non-empty string")
		}
		if _, isStr := obj["description"].(string); !isStr {
			bad = append(bad, "description is not a string")
		}
		for _, k := range []string{"readme_content", "version", "author", "documentation_url"} {
			v, has := obj[k]
			if _, isStr := v.(string); !has || (v != nil && !isStr) {
				bad = append(bad, k+" is missing or neither a string nor null")
			}
		}
		if len(bad) > 0 {
			return strings.Join(bad, "; ") + ": " + brief(ex.Body), false
		}
		return fmt.Sprintf("name %q, version %s", obj["name"], oeText(obj["version"])), true
	})
}

// httpCases: the stateless endpoints and their error replies.
func (x *oe) httpCases() {
	x.check("openenv/http reset", `POST /reset {} answers 200 {"observation":{...},"reward":float|null,"done":bool}; the observation holds no reward, done or metadata (§2 Endpoints)`, nil, func() (string, bool) {
		obj, ex, bad := x.fetchObject(http.MethodPost, "/reset", []byte(`{}`), x.o.CallTimeout)
		if bad != "" {
			return bad, false
		}
		return oeStepShape(obj, ex.Body)
	})
	x.check("openenv/http state", `GET /state answers 200 {"episode_id":str|null,"step_count":int>=0} (§2 Endpoints)`, nil, func() (string, bool) {
		obj, ex, bad := x.fetchObject(http.MethodGet, "/state", nil, x.o.RequestTimeout)
		if bad != "" {
			return bad, false
		}
		if why := oeStateShape(obj); why != "" {
			return why + ": " + brief(ex.Body), false
		}
		return brief(ex.Body), true
	})
	unprocessable := func(name, expected, path, body string, match func(loc []any, typ string) bool) {
		x.check(name, expected, nil, func() (string, bool) {
			// CallTimeout: a server that wrongly accepts the body runs an episode.
			ex, err := do(x.ctx, x.o, http.MethodPost, x.base+path, []byte(body), nil, x.o.CallTimeout)
			if err != nil {
				return "no answer: " + err.Error(), false
			}
			if ex.Status != http.StatusUnprocessableEntity {
				return fmt.Sprintf("HTTP %d, not 422: %s", ex.Status, brief(ex.Body)), false
			}
			obj, err := oeObject(ex.Body)
			detail, _ := obj["detail"].([]any)
			if err != nil || len(detail) == 0 {
				return "HTTP 422 without a detail list: " + brief(ex.Body), false
			}
			for _, d := range detail {
				item, _ := d.(map[string]any)
				loc, _ := item["loc"].([]any)
				typ, _ := item["type"].(string)
				if !match(loc, typ) {
					return fmt.Sprintf("HTTP 422 with the detail item loc %s type %q: %s", oeText(item["loc"]), typ, brief(ex.Body)), false
				}
			}
			return "HTTP 422: " + brief(ex.Body), true
		})
	}
	unprocessable("openenv/http reset bad seed", `POST /reset {"seed":-1} answers 422 {"detail":[{"loc":["body","seed"],...}]} (§2 Errors)`,
		"/reset", `{"seed":-1}`, func(loc []any, _ string) bool { return oeLocIs(loc, "body", "seed") })
	unprocessable("openenv/http step without action", `POST /step {} answers 422 {"detail":[{"type":"missing","loc":["body","action"],...}]} (§2 Errors)`,
		"/step", `{}`, func(loc []any, typ string) bool { return typ == "missing" && oeLocIs(loc, "body", "action") })
	unprocessable("openenv/http step invalid action", `POST /step with an action holding an unknown field answers 422 whose detail locs do not start with "body" (action-model errors; actions are extra="forbid") (§2 Errors)`,
		"/step", `{"action":{"envcheck_unexpected_field":1}}`, func(loc []any, _ string) bool { return len(loc) > 0 && loc[0] != "body" })
	x.check("openenv/http unknown path", `GET of an unknown path answers 404 {"detail":"Not Found"} (§2 Errors)`, nil, func() (string, bool) {
		ex, err := do(x.ctx, x.o, http.MethodGet, x.base+"/envcheck-no-such-path", nil, nil, x.o.RequestTimeout)
		if err != nil {
			return "no answer: " + err.Error(), false
		}
		obj, _ := oeObject(ex.Body)
		return fmt.Sprintf("HTTP %d: %s", ex.Status, brief(ex.Body)), ex.Status == http.StatusNotFound && obj["detail"] == "Not Found"
	})
	x.check("openenv/http wrong method", `GET /reset answers 405 {"detail":"Method Not Allowed"} with an Allow header naming POST (§2 Errors)`, nil, func() (string, bool) {
		ex, err := do(x.ctx, x.o, http.MethodGet, x.base+"/reset", nil, nil, x.o.RequestTimeout)
		if err != nil {
			return "no answer: " + err.Error(), false
		}
		obj, _ := oeObject(ex.Body)
		allow := ex.Header.Get("Allow")
		obs := fmt.Sprintf("HTTP %d, Allow %q: %s", ex.Status, allow, brief(ex.Body))
		return obs, ex.Status == http.StatusMethodNotAllowed && obj["detail"] == "Method Not Allowed" && strings.Contains(strings.ToUpper(allow), "POST")
	})
}

// oeLocIs: a validation issue's loc is exactly want.
func oeLocIs(loc []any, want ...string) bool {
	if len(loc) != len(want) {
		return false
	}
	for i, w := range want {
		if s, ok := loc[i].(string); !ok || s != w {
			return false
		}
	}
	return true
}

// oeStepShape checks a reset/step result; observed and ok for a case.
func oeStepShape(data map[string]any, raw []byte) (string, bool) {
	obs, isObj := data["observation"].(map[string]any)
	var bad []string
	if !isObj {
		bad = append(bad, "observation is not an object")
	}
	if r, has := data["reward"]; !has || (r != nil && !oeIsNumber(r)) {
		bad = append(bad, "reward is missing or neither a number nor null")
	}
	if _, isBool := data["done"].(bool); !isBool {
		bad = append(bad, "done is not a boolean")
	}
	for _, k := range []string{"reward", "done", "metadata"} {
		if _, has := obs[k]; has {
			bad = append(bad, "the observation holds "+k+" (lifted or never sent)")
		}
	}
	if len(bad) > 0 {
		return strings.Join(bad, "; ") + ": " + brief(raw), false
	}
	return brief(raw), true
}

// oeStateShape says what is wrong with a state ("" when nothing).
func oeStateShape(st map[string]any) string {
	id, has := st["episode_id"]
	if _, isStr := id.(string); !has || (id != nil && !isStr) {
		return "episode_id is missing or neither a string nor null"
	}
	if n, isInt := oeInt(st["step_count"]); !isInt || n < 0 {
		return "step_count is not an integer >= 0"
	}
	return ""
}

// oeRPC is a JSON-RPC reply checked against §2's envelope.
type oeRPC struct {
	ID      any
	Result  any
	Code    int64 // when IsError
	Message string
	IsError bool
}

// oeParseRPC checks the envelope: jsonrpc "2.0", an id, exactly one of
// result or error{code int, message str, data}.
func oeParseRPC(body []byte) (oeRPC, string) {
	obj, err := oeObject(body)
	if err != nil {
		return oeRPC{}, "a reply that is not a JSON object: " + brief(body)
	}
	if obj["jsonrpc"] != "2.0" {
		return oeRPC{}, `jsonrpc is not "2.0": ` + brief(body)
	}
	id, hasID := obj["id"]
	if !hasID {
		return oeRPC{}, "no id: " + brief(body)
	}
	res, hasRes := obj["result"]
	e, hasErr := obj["error"]
	if hasRes == hasErr {
		return oeRPC{}, "not exactly one of result and error: " + brief(body)
	}
	out := oeRPC{ID: id, Result: res, IsError: hasErr}
	if hasErr {
		em, _ := e.(map[string]any)
		code, isInt := oeInt(em["code"])
		msg, isStr := em["message"].(string)
		_, hasData := em["data"]
		if !isInt || !isStr || !hasData {
			return oeRPC{}, "error is not {code:int,message:str,data}: " + brief(body)
		}
		out.Code, out.Message = code, msg
	}
	return out, ""
}

// oeRPCRequest renders a JSON-RPC 2.0 request.
func oeRPCRequest(id any, method string, params any) []byte {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	return b
}

// toolsReply checks a tools/list reply to the request id: MCP envs list tools with a name
// and an object schema under schemaKey (inputSchema on JSON-RPC,
// input_schema in a /ws list_tools observation); a Gym-style env answers
// -32603 ("Environment does not support MCP").
func (x *oe) toolsReply(rep oeRPC, id any) ([]oeTool, string, bool) {
	if !oeIDEqual(rep.ID, id) {
		return nil, fmt.Sprintf("the reply's id is %s, not %s", oeText(rep.ID), oeText(id)), false
	}
	if rep.IsError {
		if rep.Code == -32603 && (x.action == nil || !x.mcpEnv) {
			return nil, fmt.Sprintf("error %d %q: no MCP (not an MCP env)", rep.Code, rep.Message), true
		}
		return nil, fmt.Sprintf("error %d %q", rep.Code, rep.Message), false
	}
	res, _ := rep.Result.(map[string]any)
	return oeToolList(res, "inputSchema")
}

// mcpHTTP: JSON-RPC on POST /mcp, always HTTP 200.
func (x *oe) mcpHTTP() {
	call := func(body []byte, timeout bool) (oeRPC, string) {
		t := x.o.RequestTimeout
		if timeout {
			t = x.o.CallTimeout
		}
		ex, err := do(x.ctx, x.o, http.MethodPost, x.base+"/mcp", body, nil, t)
		if err != nil {
			return oeRPC{}, "no answer: " + err.Error()
		}
		if ex.Status != http.StatusOK {
			return oeRPC{}, fmt.Sprintf("HTTP %d, not 200: %s", ex.Status, brief(ex.Body))
		}
		return oeParseRPC(ex.Body)
	}
	x.check("openenv/mcp tools/list", `POST /mcp {"jsonrpc":"2.0","id":1,"method":"tools/list"} answers 200 with result.tools, each with name and inputSchema; a Gym-style env answers error -32603 (§2 MCP JSON-RPC)`, nil, func() (string, bool) {
		rep, bad := call(oeRPCRequest(1, "tools/list", map[string]any{}), false)
		if bad != "" {
			return bad, false
		}
		tools, obs, ok := x.toolsReply(rep, 1)
		x.tools = tools
		return obs, ok
	})
	switch {
	case !x.ok["openenv/mcp tools/list"]:
		x.r.skip("openenv/mcp tools/call", "needs openenv/mcp tools/list, which did not pass")
	case len(x.tools) == 0:
		x.r.skip("openenv/mcp tools/call", "the server lists no MCP tools (a Gym-style env answers tools/* with -32603, which §2 allows)")
	default:
		t := x.tools[0]
		args := jsonschema.Minimal(t.Schema)
		if _, isObj := args.(map[string]any); !isObj {
			args = map[string]any{}
		}
		x.check("openenv/mcp tools/call", fmt.Sprintf(`POST /mcp tools/call {"name":%q,"arguments":<minimal>} answers a result {"content":[...],"data":..,"is_error":bool} or an error with an integer code (§2 MCP JSON-RPC)`, t.Name), nil, func() (string, bool) {
			rep, bad := call(oeRPCRequest(2, "tools/call", map[string]any{"name": t.Name, "arguments": args}), true)
			if bad != "" {
				return bad, false
			}
			if !oeIDEqual(rep.ID, 2) {
				return "the reply's id is " + oeText(rep.ID) + ", not 2", false
			}
			if rep.IsError {
				return fmt.Sprintf("arguments %s: error %d %q", oeText(args), rep.Code, rep.Message), true
			}
			res, _ := rep.Result.(map[string]any)
			_, hasContent := res["content"].([]any)
			_, hasData := res["data"]
			_, isErrBool := res["is_error"].(bool)
			obs := fmt.Sprintf("arguments %s: %s", oeText(args), brief([]byte(oeText(rep.Result))))
			return obs, hasContent && hasData && isErrBool
		})
	}
	rpcError := func(name, expected string, body []byte, wantCode int64, wantID any) {
		x.check(name, expected, nil, func() (string, bool) {
			rep, bad := call(body, false)
			if bad != "" {
				return bad, false
			}
			if !rep.IsError {
				return "a result, not an error: " + oeText(rep.Result), false
			}
			obs := fmt.Sprintf("error %d %q, id %s", rep.Code, rep.Message, oeText(rep.ID))
			return obs, rep.Code == wantCode && oeIDEqual(rep.ID, wantID)
		})
	}
	rpcError("openenv/mcp unknown method", `POST /mcp with the method "envcheck/no-such-method" answers error -32601 with the request's id (§2 MCP error codes)`,
		oeRPCRequest(3, "envcheck/no-such-method", map[string]any{}), -32601, 3)
	rpcError("openenv/mcp invalid request", `POST /mcp {"jsonrpc":"1.0",...} answers error -32600 with id null (§2 MCP error codes)`,
		[]byte(`{"jsonrpc":"1.0","id":4,"method":"tools/list","params":{}}`), -32600, nil)
	rpcError("openenv/mcp parse error", `POST /mcp with a body that is not JSON answers HTTP 200, error -32700, id null (§2 MCP error codes)`,
		[]byte(`{"jsonrpc":"2.0","id":5,`), -32700, nil)
}

// oeIDEqual compares a decoded JSON-RPC id with want (int, string or nil).
func oeIDEqual(got, want any) bool {
	if n, ok := want.(int); ok {
		g, isInt := oeInt(got)
		return isInt && g == int64(n)
	}
	return got == want
}

// oeObject decodes one JSON object, numbers as json.Number.
func oeObject(b []byte) (map[string]any, error) {
	v, err := oeDecode(b)
	if err != nil {
		return nil, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("JSON that is not an object")
	}
	return m, nil
}

func oeDecode(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, fmt.Errorf("data after the JSON value")
	}
	return v, nil
}

func oeIsNumber(v any) bool { _, ok := v.(json.Number); return ok }

// oeInt is v as an integer when it is a JSON integer.
func oeInt(v any) (int64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	i, err := n.Int64()
	return i, err == nil
}

func oeText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}
