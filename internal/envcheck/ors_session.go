package envcheck

import (
	"github.com/ortrain/ortrain/internal/jsonschema"

	"context"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"strings"
)

// session runs one episode's cases, create_session to delete_session. What
// it creates on the server is removed by a deferred cleanup whatever fails.
func (c *orsCheck) session() {
	c.sidWhy = "no session id: ors/create_session failed"
	c.sessionWhy = "no session: ors/create failed"
	c.createSession()
	defer c.cleanup()
	c.create()
	c.createTwice()
	c.ping()
	c.prompt()
	c.taskToolList()
	c.callUnknown()
	c.callTool()
	c.episodeReward()
	c.deleteCases()
}

// cleanup deletes what the cases left on the server. It runs even when the
// caller's context is cancelled, bounded by the request timeout.
func (c *orsCheck) cleanup() {
	if c.sid == "" {
		return
	}
	ctx := context.WithoutCancel(c.ctx)
	if c.live {
		_, _ = do(ctx, c.o, http.MethodPost, c.base+"/delete", nil, sidHeader(c.sid), c.o.RequestTimeout)
	}
	if !c.closed {
		_, _ = do(ctx, c.o, http.MethodPost, c.base+"/delete_session", nil, sidHeader(c.sid), c.o.RequestTimeout)
	}
}

// sse posts body to an SSE endpoint as the Python clients do (Accept:
// text/event-stream). SSE endpoints get the call timeout: a hosted
// /create_session streams while a container starts, /call while a tool runs.
func (c *orsCheck) sse(target string, body any, header http.Header) (*exchange, error) {
	h := http.Header{"Accept": {"text/event-stream"}}
	for k, v := range header {
		h[k] = v
	}
	return c.request(http.MethodPost, target, body, h, c.o.CallTimeout)
}

// sseAnswer checks an SSE answer: HTTP 200, a text/event-stream
// Content-Type and strict framing (§3), with task_id as the first event; it
// returns the events from task_id on.
func sseAnswer(ex *exchange, err error) ([]sseEvent, string) {
	if err != nil {
		return nil, "no answer: " + err.Error()
	}
	if ex.Status != http.StatusOK {
		return nil, fmt.Sprintf("HTTP %d, not 200: %s", ex.Status, brief(ex.Body))
	}
	ct := ex.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "text/event-stream" {
		return nil, fmt.Sprintf("Content-Type %q, not text/event-stream", ct)
	}
	events, problems := parseSSEStrict(ex.Body)
	if len(problems) > 0 {
		more := ""
		if len(problems) > 1 {
			more = fmt.Sprintf(" (and %d more framing problems)", len(problems)-1)
		}
		return nil, "SSE framing: " + problems[0] + more
	}
	if len(events) == 0 || events[0].Name != "task_id" || events[0].Data == "" {
		return nil, fmt.Sprintf("events %s: the first must be task_id with a non-empty id", sseNames(events))
	}
	return events, ""
}

func (c *orsCheck) createSession() {
	if c.blocked("ors/create_session") {
		return
	}
	c.r.run("ors/create_session", "POST /create_session (Accept: text/event-stream, body {}): 200 text/event-stream, strict framing, event task_id carrying the sid, then end (§3, §4.10)", func() (string, bool) {
		ex, err := c.sse(c.base+"/create_session", map[string]any{}, nil)
		if err == nil {
			// Remember a sid even from a failing answer, so that cleanup
			// releases it (on the platform it may hold a container).
			if evs, _ := parseSSEStrict(ex.Body); len(evs) > 0 && evs[0].Name == "task_id" && evs[0].Data != "" {
				c.sid = evs[0].Data
			}
		}
		events, bad := sseAnswer(ex, err)
		if bad != "" {
			return bad, false
		}
		sid := events[0].Data
		for _, e := range events[1:] {
			switch e.Name {
			case "error":
				return fmt.Sprintf("error event: %s", brief([]byte(e.Data))), false
			case "end":
				// The session path also takes the sid from an end payload
				// {"sid": ...} (§4.10).
				if obj, err := jsonObject([]byte(e.Data)); err == nil {
					if s, bad := stringField(obj, "sid"); bad == "" && s != "" {
						sid = s
					}
				}
				c.sid, c.sidWhy = sid, ""
				return fmt.Sprintf("sid %s (events %s)", sid, sseNames(events)), true
			}
		}
		return fmt.Sprintf("events %s: no end event", sseNames(events)), false
	})
}

func (c *orsCheck) createBody() map[string]any {
	return map[string]any{"env_name": c.env, "split": c.split, "index": 0}
}

func (c *orsCheck) create() {
	if why := c.blockedBy("ors/create", c.sidWhy, c.envWhy, c.splitWhy); why != "" {
		c.sessionWhy = why
		return
	}
	c.r.run("ors/create", `POST /create (X-Session-ID, {"env_name","split","index":0}): 200, application/json, {"sid": the sid} (§4.11)`, func() (string, bool) {
		ex, err := c.post(c.base+"/create", c.createBody(), sidHeader(c.sid))
		if err == nil && ex.Status == http.StatusOK {
			c.live = true // whatever the body says, there may be state to delete
		}
		obj, bad := jsonAnswer(ex, err, http.StatusOK)
		if bad != "" {
			return bad, false
		}
		if sid, bad := stringField(obj, "sid"); bad != "" || sid != c.sid {
			return fmt.Sprintf("body %s, not {\"sid\":%q}", brief(ex.Body), c.sid), false
		}
		c.sessionWhy = ""
		return fmt.Sprintf("session %s on %s/%s task 0", c.sid, c.env, c.split), true
	})
}

func (c *orsCheck) createTwice() {
	if c.blocked("ors/create twice", c.sessionWhy) {
		return
	}
	c.r.run("ors/create twice", `the same POST /create again: 400, application/json, {"detail": string} — session already exists (§4.11)`, func() (string, bool) {
		ex, err := c.post(c.base+"/create", c.createBody(), sidHeader(c.sid))
		return detailCase(ex, err, http.StatusBadRequest)
	})
}

func (c *orsCheck) ping() {
	if c.blocked("ors/ping keeps the session alive", c.sessionWhy) {
		return
	}
	c.r.run("ors/ping keeps the session alive", `POST /ping with the sid: 200, application/json, {"status":"ok"} (§4.12)`, func() (string, bool) {
		ex, err := c.post(c.base+"/ping", nil, sidHeader(c.sid))
		obj, bad := jsonAnswer(ex, err, http.StatusOK)
		if bad != "" {
			return bad, false
		}
		if s, bad := stringField(obj, "status"); bad != "" || s != "ok" {
			return fmt.Sprintf("body %s, not {\"status\":\"ok\"}", brief(ex.Body)), false
		}
		return `{"status":"ok"}`, true
	})
}

func (c *orsCheck) prompt() {
	if c.blocked("ors/prompt", c.sessionWhy) {
		return
	}
	c.r.run("ors/prompt", `GET /{env}/prompt with the sid: 200, application/json, an array of blocks: {"text","detail","type":"text"} or {"data","mimeType","detail","type":"image"} (§4.13, §5.1-5.3)`, func() (string, bool) {
		ex, err := c.get(c.envPath("prompt"), sidHeader(c.sid))
		if bad := answered(ex, err, http.StatusOK); bad != "" {
			return bad, false
		}
		n, bad := checkBlocks(ex.Body)
		if bad != "" {
			return bad, false
		}
		return fmt.Sprintf("%d blocks: %s", n, brief(ex.Body)), true
	})
}

func (c *orsCheck) taskToolList() {
	if c.blocked("ors/task_tools", c.sessionWhy) {
		return
	}
	c.r.run("ors/task_tools", `GET /{env}/task_tools with the sid: 200, application/json, {"tools":[ToolSpec...]} including every shared tool; 404 means no task tools (clients fall back to /tools) (§4.14)`, func() (string, bool) {
		ex, err := c.get(c.envPath("task_tools"), sidHeader(c.sid))
		if err == nil && ex.Status == http.StatusNotFound {
			return "404: no task tools (clients fall back to /tools)", true
		}
		tools, bad := toolsAnswer(ex, err)
		if bad != "" {
			return bad, false
		}
		c.taskTools = tools
		have := map[string]bool{}
		for _, t := range tools {
			have[t.Name] = true
		}
		for _, t := range c.tools {
			if !have[t.Name] {
				return fmt.Sprintf("lacks the shared tool %q (has %s)", t.Name, toolNames(tools)), false
			}
		}
		return fmt.Sprintf("%d tools: %s", len(tools), toolNames(tools)), true
	})
}

// callResult checks a /call answer: SSE as sseAnswer requires, then chunk
// events and one end (an error event fails: the tool invocation crashed);
// the concatenated chunk and end data must be a RunToolOutput (§3.2, §5.6).
func (c *orsCheck) callResult(name string, input any) (*runToolOutput, string) {
	ex, err := c.sse(c.envPath("call"), map[string]any{"name": name, "input": input}, sidHeader(c.sid))
	events, bad := sseAnswer(ex, err)
	if bad != "" {
		return nil, bad
	}
	var payload strings.Builder
	for _, e := range events[1:] {
		switch e.Name {
		case "chunk":
			payload.WriteString(e.Data)
		case "end":
			payload.WriteString(e.Data)
			out, bad := parseRunToolOutput([]byte(payload.String()))
			if bad != "" {
				return nil, fmt.Sprintf("result %s: %s", brief([]byte(payload.String())), bad)
			}
			return out, ""
		case "error":
			return nil, fmt.Sprintf("error event (the tool invocation failed): %s", brief([]byte(e.Data)))
		}
	}
	return nil, fmt.Sprintf("events %s: no end event", sseNames(events))
}

func (c *orsCheck) callUnknown() {
	if c.blocked("ors/call unknown tool", c.sessionWhy) {
		return
	}
	c.r.run("ors/call unknown tool", fmt.Sprintf(`POST /{env}/call {"name":%q,"input":{}}: 200 text/event-stream, strict framing, task_id, then end with a RunToolOutput {"ok":false,"error":string} — a tool-level failure, not an HTTP error or an error event (§4.15, §5.6)`, noSuchTool), func() (string, bool) {
		out, bad := c.callResult(noSuchTool, map[string]any{})
		if bad != "" {
			return bad, false
		}
		if out.OK {
			return "ok:true for a tool that does not exist", false
		}
		return fmt.Sprintf("ok:false: %s", out.Error), true
	})
}

func (c *orsCheck) callTool() {
	tools := c.tools
	if len(tools) == 0 {
		tools = c.taskTools
	}
	toolWhy := ""
	if len(tools) == 0 {
		toolWhy = "no tool to call: ors/tools failed"
	}
	if c.blocked("ors/call first tool", c.sessionWhy, toolWhy) {
		return
	}
	tool := tools[0]
	input := jsonschema.MinimalInput(tool.Schema)
	in, _ := json.Marshal(input)
	c.r.run("ors/call first tool", fmt.Sprintf(`POST /{env}/call {"name":%q,"input":%s}: 200 text/event-stream, strict framing, task_id, then end with a RunToolOutput; when ok:true its output has blocks, metadata (object|null), reward (number|null), finished (boolean) (§4.15, §5.5, §5.6)`, tool.Name, in), func() (string, bool) {
		out, bad := c.callResult(tool.Name, input)
		if bad != "" {
			return bad, false
		}
		if !out.OK {
			c.played = 1
			return fmt.Sprintf("%s: ok:false (a tool-level failure): %s", tool.Name, out.Error), true
		}
		c.played = 1
		if out.Finished {
			c.ended = &episodeEnd{tool: tool.Name, reward: out.Reward}
		}
		return fmt.Sprintf("%s: ok:true, reward %s, finished %t", tool.Name, out.Reward, out.Finished), true
	})
}

// episodeEnd is the call that finished the episode and its reward's JSON.
type episodeEnd struct {
	tool, reward string
}

// episodeReward plays the remaining tools once each, in order, with
// minimal inputs until one finishes the episode, and requires that the
// finishing output carries a reward: an env whose episodes end with
// reward null trains nothing (every rollout scores nothing).
func (c *orsCheck) episodeReward() {
	const name = "ors/episode ends with a reward"
	tools := c.tools
	if len(tools) == 0 {
		tools = c.taskTools
	}
	playWhy := ""
	if c.played == 0 {
		playWhy = "ors/call first tool failed"
	}
	if c.blocked(name, c.sessionWhy, playWhy) {
		return
	}
	c.r.run(name, "the tool result that ends the episode (finished: true) carries a number as reward, not null (§5.5); each tool is called once, in order, with minimal input, until one ends it", func() (string, bool) {
		for _, tool := range tools[c.played:] {
			if c.ended != nil {
				break
			}
			out, bad := c.callResult(tool.Name, jsonschema.MinimalInput(tool.Schema))
			if bad != "" {
				return fmt.Sprintf("%s: %s", tool.Name, bad), false
			}
			if out.OK && out.Finished {
				c.ended = &episodeEnd{tool: tool.Name, reward: out.Reward}
			}
		}
		switch {
		case c.ended == nil:
			return "no tool ended the episode with minimal inputs (the reward could not be checked)", true
		case c.ended.reward == "" || c.ended.reward == "null":
			return fmt.Sprintf("%s ended the episode with reward null: the env never sends a reward", c.ended.tool), false
		}
		return fmt.Sprintf("%s ended the episode with reward %s", c.ended.tool, c.ended.reward), true
	})
}

func (c *orsCheck) deleteCases() {
	if !c.blocked("ors/delete", c.sessionWhy) {
		c.r.run("ors/delete", `POST /delete with the sid: 200, application/json, {"sid": the sid}; afterwards POST /ping with it: 404 (§4.16)`, func() (string, bool) {
			ex, err := c.post(c.base+"/delete", nil, sidHeader(c.sid))
			obj, bad := jsonAnswer(ex, err, http.StatusOK)
			if bad != "" {
				return bad, false
			}
			c.live = false
			if sid, bad := stringField(obj, "sid"); bad != "" || sid != c.sid {
				return fmt.Sprintf("body %s, not {\"sid\":%q}", brief(ex.Body), c.sid), false
			}
			ex, err = c.post(c.base+"/ping", nil, sidHeader(c.sid))
			if err != nil {
				return "ping after delete: no answer: " + err.Error(), false
			}
			if ex.Status != http.StatusNotFound {
				return fmt.Sprintf("the session is still alive: ping after delete answered HTTP %d, not 404: %s", ex.Status, brief(ex.Body)), false
			}
			return "deleted; ping after delete: 404", true
		})
	}
	if !c.blocked("ors/delete_session", c.sidWhy) {
		c.r.run("ors/delete_session", `POST /delete_session with the sid: 200, application/json, {"sid": the sid} (§4.17)`, func() (string, bool) {
			ex, err := c.post(c.base+"/delete_session", nil, sidHeader(c.sid))
			obj, bad := jsonAnswer(ex, err, http.StatusOK)
			if err == nil {
				c.closed = true
			}
			if bad != "" {
				return bad, false
			}
			if sid, bad := stringField(obj, "sid"); bad != "" || sid != c.sid {
				return fmt.Sprintf("body %s, not {\"sid\":%q}", brief(ex.Body), c.sid), false
			}
			return fmt.Sprintf(`{"sid":%q}`, c.sid), true
		})
	}
}

// runToolOutput is a checked RunToolOutput (§5.6).
type runToolOutput struct {
	OK       bool
	Error    string
	Reward   string // its JSON text: a number or null
	Finished bool
}

// parseRunToolOutput checks b is a RunToolOutput: {"ok":true,"output":
// ToolOutput} or {"ok":false,"error":string} with an optional string reason;
// a ToolOutput has all four keys the Python clients index (§5.5).
func parseRunToolOutput(b []byte) (*runToolOutput, string) {
	obj, err := jsonObject(b)
	if err != nil {
		return nil, err.Error()
	}
	var out runToolOutput
	raw, ok := obj["ok"]
	if !ok {
		return nil, `no "ok" key`
	}
	if jsonKind(raw) != "boolean" {
		return nil, fmt.Sprintf(`"ok" is %s, not a boolean`, jsonKind(raw))
	}
	_ = json.Unmarshal(raw, &out.OK)
	if !out.OK {
		var bad string
		if out.Error, bad = stringField(obj, "error"); bad != "" {
			return nil, "ok:false with " + bad
		}
		if _, has := obj["reason"]; has {
			if _, bad := stringField(obj, "reason"); bad != "" {
				return nil, bad
			}
		}
		return &out, ""
	}
	raw, ok = obj["output"]
	if !ok {
		return nil, `ok:true with no "output" key`
	}
	output, err := jsonObject(raw)
	if err != nil {
		return nil, `"output": ` + err.Error()
	}
	for _, k := range []string{"blocks", "metadata", "reward", "finished"} {
		if _, ok := output[k]; !ok {
			return nil, fmt.Sprintf(`"output" has no %q key`, k)
		}
	}
	if _, bad := checkBlocks(output["blocks"]); bad != "" {
		return nil, `"output.blocks": ` + bad
	}
	if k := jsonKind(output["metadata"]); k != "object" && k != "null" {
		return nil, fmt.Sprintf(`"output.metadata" is %s, not an object or null`, k)
	}
	if k := jsonKind(output["reward"]); k != "number" && k != "null" {
		return nil, fmt.Sprintf(`"output.reward" is %s, not a number or null`, k)
	}
	out.Reward = strings.TrimSpace(string(output["reward"]))
	if k := jsonKind(output["finished"]); k != "boolean" {
		return nil, fmt.Sprintf(`"output.finished" is %s, not a boolean`, k)
	}
	_ = json.Unmarshal(output["finished"], &out.Finished)
	return &out, ""
}

// checkBlocks checks b is an array of text or image blocks with every key
// the openreward client indexes (§5.1, §5.2); it returns their number.
func checkBlocks(b []byte) (int, string) {
	var blocks []json.RawMessage
	if jsonKind(b) != "array" || json.Unmarshal(b, &blocks) != nil {
		return 0, fmt.Sprintf("%s is not an array of blocks", brief(b))
	}
	for i, raw := range blocks {
		block, err := jsonObject(raw)
		if err != nil {
			return 0, fmt.Sprintf("block %d: %v", i, err)
		}
		typ, bad := stringField(block, "type")
		if bad != "" {
			return 0, fmt.Sprintf("block %d: %s", i, bad)
		}
		var keys []string
		switch typ {
		case "text":
			keys = []string{"text"}
		case "image":
			keys = []string{"data", "mimeType"}
		default:
			return 0, fmt.Sprintf("block %d has type %q, not text or image", i, typ)
		}
		for _, k := range keys {
			if _, bad := stringField(block, k); bad != "" {
				return 0, fmt.Sprintf("%s block %d: %s", typ, i, bad)
			}
		}
		detail, ok := block["detail"]
		if !ok {
			return 0, fmt.Sprintf(`%s block %d: no "detail" key (the openreward client reads it)`, typ, i)
		}
		if k := jsonKind(detail); k != "object" && k != "null" {
			return 0, fmt.Sprintf(`%s block %d: "detail" is %s, not an object or null`, typ, i, k)
		}
	}
	return len(blocks), ""
}

// toolSpecs reads a ListToolsOutput's "tools" strictly: the openreward
// client builds a fixed three-field record from each spec (§4.4).
func toolSpecs(obj map[string]json.RawMessage) ([]orsTool, string) {
	raw, ok := obj["tools"]
	if !ok {
		return nil, `no "tools" key`
	}
	var specs []json.RawMessage
	if jsonKind(raw) != "array" || json.Unmarshal(raw, &specs) != nil {
		return nil, fmt.Sprintf(`"tools" is %s, not an array`, jsonKind(raw))
	}
	seen := map[string]bool{}
	var tools []orsTool
	for i, s := range specs {
		spec, err := jsonObject(s)
		if err != nil {
			return nil, fmt.Sprintf("tool %d: %v", i, err)
		}
		name, bad := stringField(spec, "name")
		if bad == "" && name == "" {
			bad = `"name" is empty`
		}
		if bad != "" {
			return nil, fmt.Sprintf("tool %d: %s", i, bad)
		}
		if seen[name] {
			return nil, fmt.Sprintf("tool name %q appears twice", name)
		}
		seen[name] = true
		if _, bad := stringField(spec, "description"); bad != "" {
			return nil, fmt.Sprintf("tool %q: %s", name, bad)
		}
		schema, ok := spec["input_schema"]
		if !ok {
			return nil, fmt.Sprintf(`tool %q: no "input_schema" key`, name)
		}
		switch jsonKind(schema) {
		case "null":
			schema = nil
		case "object":
		default:
			return nil, fmt.Sprintf(`tool %q: "input_schema" is %s, not an object or null`, name, jsonKind(schema))
		}
		for k := range spec {
			if k != "name" && k != "description" && k != "input_schema" {
				return nil, fmt.Sprintf("tool %q has the extra key %q (a ToolSpec has exactly name, description, input_schema)", name, k)
			}
		}
		tools = append(tools, orsTool{Name: name, Schema: schema})
	}
	return tools, ""
}

func toolNames(tools []orsTool) string {
	names := make([]string, len(tools))
	for i, t := range tools {
		names[i] = t.Name
	}
	return strings.Join(names, ", ")
}
