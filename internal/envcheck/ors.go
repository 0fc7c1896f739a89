package envcheck

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// orsCheck carries what later ORS cases need from earlier ones. A "why"
// field is set when the case that provides something failed; cases that
// need it are then skipped with that reason.
type orsCheck struct {
	ctx  context.Context
	o    Options
	r    *recorder
	base string // the server's origin: ORS paths are absolute (§2.3)

	downWhy string // the server did not answer at all

	env    string // the env under check
	envWhy string

	split    string
	splitWhy string

	n    int // num_tasks of the split; 0 = unknown
	nWhy string

	task0 json.RawMessage // /task index 0, for the task_range comparison

	tools     []orsTool // shared tools (/tools), in the served order
	taskTools []orsTool // /task_tools, when the server has it

	// played counts the tools called in order so far; ended is the call
	// that finished the episode, if one did.
	played int
	ended  *episodeEnd

	sid    string // from /create_session
	sidWhy string
	// live: /create made server state for sid that /delete has not yet
	// removed; closed: /delete_session was sent. The deferred cleanup
	// looks at both.
	live       bool
	sessionWhy string
	closed     bool
}

// orsTool is what the call cases need of a ToolSpec.
type orsTool struct {
	Name   string
	Schema json.RawMessage // an object, or nil for a tool without input
}

// The names the checker invents; they only need to miss the server's own.
const (
	noSuchSplit = "ortrain-envcheck-no-such-split"
	noSuchTool  = "ortrain_envcheck_no_such_tool"
)

// checkORS runs the ORS cases against the server at u, in protocol order:
// discovery, error statuses, then one session from create_session to
// delete_session.
func checkORS(ctx context.Context, u *url.URL, o Options, r *recorder) {
	c := &orsCheck{ctx: ctx, o: o.withDefaults(), r: r, base: origin(u)}
	c.health()
	c.listEnvironments(u)
	c.toolList()
	c.splits()
	c.numTasks()
	c.task()
	c.taskRange()
	c.tasks()
	c.errorStatuses()
	c.session()
}

// blocked records name as skipped when one of whys (failed prerequisites)
// is set; the server being down blocks everything.
func (c *orsCheck) blocked(name string, whys ...string) bool {
	return c.blockedBy(name, whys...) != ""
}

// blockedBy is blocked returning the reason, for a case whose dependants
// must name the root failure rather than a skipped case.
func (c *orsCheck) blockedBy(name string, whys ...string) string {
	cancelled := ""
	if err := c.ctx.Err(); err != nil {
		cancelled = "not run: " + err.Error()
	}
	for _, why := range append([]string{cancelled, c.downWhy}, whys...) {
		if why != "" {
			c.r.skip(name, why)
			return why
		}
	}
	return ""
}

// envPath is /{env}/{endpoint}.
func (c *orsCheck) envPath(endpoint string) string {
	return c.base + "/" + url.PathEscape(c.env) + "/" + endpoint
}

// request sends one request; a non-nil body is encoded as JSON.
func (c *orsCheck) request(method, target string, body any, header http.Header, timeout time.Duration) (*exchange, error) {
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return nil, err
		}
	}
	return do(c.ctx, c.o, method, target, b, header, timeout)
}

func (c *orsCheck) get(target string, header http.Header) (*exchange, error) {
	return c.request(http.MethodGet, target, nil, header, c.o.RequestTimeout)
}

func (c *orsCheck) post(target string, body any, header http.Header) (*exchange, error) {
	return c.request(http.MethodPost, target, body, header, c.o.RequestTimeout)
}

// sidHeader is the session header every session-bound request carries.
func sidHeader(sid string) http.Header { return http.Header{"X-Session-ID": {sid}} }

func (c *orsCheck) health() {
	c.r.run("ors/health", `GET /health: 200, application/json, {"status":"ok"} (§4.1)`, func() (string, bool) {
		ex, err := c.get(c.base+"/health", nil)
		if err != nil {
			c.downWhy = "the server did not answer ors/health"
		}
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

// listEnvironments checks the env list and settles the env to check:
// Options.Env, else the URL's first path segment, else the first listed.
func (c *orsCheck) listEnvironments(u *url.URL) {
	from := "--env"
	c.env = c.o.Env
	if c.env == "" {
		if seg, _, _ := strings.Cut(strings.Trim(u.Path, "/"), "/"); seg != "" {
			if p, err := url.PathUnescape(seg); err == nil {
				c.env, from = p, "the URL's path"
			}
		}
	}
	if c.blocked("ors/list_environments") {
		if c.env == "" {
			c.envWhy = "no env to check: the server did not answer"
		}
		return
	}
	ok := c.r.run("ors/list_environments", "GET /list_environments: 200, application/json, an array of env names that includes the env checked, case-insensitively (§4.3)", func() (string, bool) {
		ex, err := c.get(c.base+"/list_environments", nil)
		if bad := answered(ex, err, http.StatusOK); bad != "" {
			return bad, false
		}
		var names []string
		if err := json.Unmarshal(ex.Body, &names); err != nil || names == nil {
			return fmt.Sprintf("body %s is not an array of strings", brief(ex.Body)), false
		}
		if c.env == "" {
			if len(names) == 0 {
				return "an empty list: no env to check", false
			}
			c.env, from = names[0], "the first listed"
		}
		for _, n := range names {
			if strings.EqualFold(n, c.env) {
				return fmt.Sprintf("%q; checking env %q (%s)", names, c.env, from), true
			}
		}
		return fmt.Sprintf("%q lacks env %q (%s)", names, c.env, from), false
	})
	if !ok && c.env == "" {
		c.envWhy = "no env to check: ors/list_environments failed (name one with --env)"
	}
}

func (c *orsCheck) toolList() {
	if c.blocked("ors/tools", c.envWhy) {
		return
	}
	c.r.run("ors/tools", `GET /{env}/tools: 200, application/json, {"tools":[ToolSpec...]}; each ToolSpec exactly name, description, input_schema (object or null), names non-empty and unique (§4.4, §5.4)`, func() (string, bool) {
		ex, err := c.get(c.envPath("tools"), nil)
		tools, bad := toolsAnswer(ex, err)
		if bad != "" {
			return bad, false
		}
		c.tools = tools
		if len(tools) == 0 {
			return "no tools (a server needs at least one shared tool, §9.2)", false
		}
		return fmt.Sprintf("%d tools: %s", len(tools), toolNames(tools)), true
	})
}

func (c *orsCheck) splits() {
	c.split = c.o.Split
	if c.blocked("ors/splits", c.envWhy) {
		if c.split == "" {
			c.splitWhy = "no split: ors/splits did not run"
		}
		return
	}
	ok := c.r.run("ors/splits", `GET /{env}/splits: 200, application/json, [{"name","type"}...] with type train|validation|test, including the split checked (§4.5, §5.9)`, func() (string, bool) {
		ex, err := c.get(c.envPath("splits"), nil)
		if bad := answered(ex, err, http.StatusOK); bad != "" {
			return bad, false
		}
		var list []json.RawMessage
		if err := json.Unmarshal(ex.Body, &list); err != nil || list == nil {
			return fmt.Sprintf("body %s is not an array", brief(ex.Body)), false
		}
		var names []string
		for i, raw := range list {
			obj, err := jsonObject(raw)
			if err != nil {
				return fmt.Sprintf("split %d: %v", i, err), false
			}
			name, bad := stringField(obj, "name")
			if bad == "" && name == "" {
				bad = `"name" is empty`
			}
			if bad != "" {
				return fmt.Sprintf("split %d: %s", i, bad), false
			}
			typ, bad := stringField(obj, "type")
			if bad != "" {
				return fmt.Sprintf("split %q: %s", name, bad), false
			}
			if typ != "train" && typ != "validation" && typ != "test" {
				return fmt.Sprintf("split %q has type %q, not train, validation or test", name, typ), false
			}
			names = append(names, name)
		}
		if len(names) == 0 {
			return "no splits (a server needs at least one, §9.2)", false
		}
		from := "--split"
		if c.split == "" {
			c.split, from = names[0], "the first"
		}
		for _, n := range names {
			if n == c.split {
				return fmt.Sprintf("%q; checking split %q (%s)", names, c.split, from), true
			}
		}
		return fmt.Sprintf("%q lacks split %q (%s)", names, c.split, from), false
	})
	if !ok && c.split == "" {
		c.splitWhy = "no split: ors/splits failed (name one with --split)"
	}
}

func (c *orsCheck) numTasks() {
	c.nWhy = "num_tasks unknown: ors/num_tasks failed"
	if c.blocked("ors/num_tasks", c.envWhy, c.splitWhy) {
		return
	}
	c.r.run("ors/num_tasks", `POST /{env}/num_tasks {"split"}: 200, application/json, {"num_tasks": integer >= 1} (§4.7)`, func() (string, bool) {
		ex, err := c.post(c.envPath("num_tasks"), map[string]any{"split": c.split}, nil)
		obj, bad := jsonAnswer(ex, err, http.StatusOK)
		if bad != "" {
			return bad, false
		}
		raw, ok := obj["num_tasks"]
		if !ok {
			return fmt.Sprintf(`no "num_tasks" key in %s`, brief(ex.Body)), false
		}
		n, err := strconv.Atoi(string(bytes.TrimSpace(raw)))
		if err != nil {
			return fmt.Sprintf(`"num_tasks" is %s, not an integer`, brief(raw)), false
		}
		if n < 1 {
			return fmt.Sprintf(`"num_tasks" is %d: no task to check`, n), false
		}
		c.n, c.nWhy = n, ""
		return fmt.Sprintf("%d tasks in %q", n, c.split), true
	})
}

// taskAnswer reads {"task": object, "env_name": the env} (§4.8).
func (c *orsCheck) taskAnswer(ex *exchange, err error) (json.RawMessage, string) {
	obj, bad := jsonAnswer(ex, err, http.StatusOK)
	if bad != "" {
		return nil, bad
	}
	task, ok := obj["task"]
	if !ok {
		return nil, fmt.Sprintf(`no "task" key in %s`, brief(ex.Body))
	}
	if _, err := jsonObject(task); err != nil {
		return nil, fmt.Sprintf(`"task": %v`, err)
	}
	if bad := c.envName(obj); bad != "" {
		return nil, bad
	}
	return task, ""
}

// envName checks an answer's env_name, which the openreward client indexes
// directly and echoes back in /create (§4.6, §11.2 #2).
func (c *orsCheck) envName(obj map[string]json.RawMessage) string {
	name, bad := stringField(obj, "env_name")
	if bad != "" {
		return bad + " (the openreward client needs it)"
	}
	if !strings.EqualFold(name, c.env) {
		return fmt.Sprintf(`"env_name" is %q, not the env %q`, name, c.env)
	}
	return ""
}

func (c *orsCheck) fetchTask(i int) (json.RawMessage, string) {
	ex, err := c.post(c.envPath("task"), map[string]any{"split": c.split, "index": i}, nil)
	return c.taskAnswer(ex, err)
}

func (c *orsCheck) task() {
	if c.blocked("ors/task", c.envWhy, c.splitWhy) {
		return
	}
	c.r.run("ors/task", `POST /{env}/task {"split","index":0}: 200, application/json, {"task": object, "env_name": string} — env_name required (§4.8)`, func() (string, bool) {
		task, bad := c.fetchTask(0)
		if bad != "" {
			return bad, false
		}
		c.task0 = task
		return "task 0: " + brief(task), true
	})
}

func (c *orsCheck) taskRange() {
	if c.blocked("ors/task_range", c.envWhy, c.splitWhy, c.nWhy) {
		return
	}
	stop := min(3, c.n)
	c.r.run("ors/task_range", fmt.Sprintf(`POST /{env}/task_range {"split","start":0,"stop":%d}: 200, application/json, {"tasks":[%d tasks], "env_name"}, each equal to /task at its index (§4.9)`, stop, stop), func() (string, bool) {
		ex, err := c.post(c.envPath("task_range"), map[string]any{"split": c.split, "start": 0, "stop": stop}, nil)
		tasks, bad := c.tasksAnswer(ex, err)
		if bad != "" {
			return bad, false
		}
		if len(tasks) != stop {
			return fmt.Sprintf("%d tasks, not %d", len(tasks), stop), false
		}
		for i, got := range tasks {
			want := c.task0
			if i > 0 || want == nil {
				if want, bad = c.fetchTask(i); bad != "" {
					return fmt.Sprintf("/task index %d, to compare: %s", i, bad), false
				}
			}
			if !jsonEqual(got, want) {
				return fmt.Sprintf("task %d is %s, but /task gives %s", i, brief(got), brief(want)), false
			}
		}
		return fmt.Sprintf("%d tasks, each equal to /task", stop), true
	})
}

func (c *orsCheck) tasks() {
	if c.blocked("ors/tasks", c.envWhy, c.splitWhy) {
		return
	}
	c.r.run("ors/tasks", `POST /{env}/tasks {"split"}: 200, application/json, {"tasks":[num_tasks tasks], "env_name"}; or 400 {"detail"} when the env cannot enumerate (§4.6)`, func() (string, bool) {
		ex, err := c.post(c.envPath("tasks"), map[string]any{"split": c.split}, nil)
		if err == nil && ex.Status == http.StatusBadRequest {
			detail, bad := detailAnswer(ex, nil, http.StatusBadRequest)
			if bad != "" {
				return bad, false
			}
			return fmt.Sprintf("400: enumeration unsupported (%s)", detail), true
		}
		tasks, bad := c.tasksAnswer(ex, err)
		if bad != "" {
			return bad, false
		}
		if c.n > 0 && len(tasks) != c.n {
			return fmt.Sprintf("%d tasks, but num_tasks says %d", len(tasks), c.n), false
		}
		return fmt.Sprintf("200: %d tasks listed", len(tasks)), true
	})
}

// errorStatuses checks the error answers a client relies on (§2.2, §4).
func (c *orsCheck) errorStatuses() {
	if !c.blocked("ors/num_tasks unknown split", c.envWhy) {
		c.r.run("ors/num_tasks unknown split", `POST /{env}/num_tasks with an unknown split: 400, application/json, {"detail": string} (§4.7)`, func() (string, bool) {
			ex, err := c.post(c.envPath("num_tasks"), map[string]any{"split": noSuchSplit}, nil)
			return detailCase(ex, err, http.StatusBadRequest)
		})
	}
	if !c.blocked("ors/task index out of range", c.envWhy, c.splitWhy, c.nWhy) {
		c.r.run("ors/task index out of range", fmt.Sprintf(`POST /{env}/task with index = num_tasks (%d): 400, application/json, {"detail": string} (§4.8)`, c.n), func() (string, bool) {
			ex, err := c.post(c.envPath("task"), map[string]any{"split": c.split, "index": c.n}, nil)
			return detailCase(ex, err, http.StatusBadRequest)
		})
	}
	if !c.blocked("ors/ping without session id") {
		c.r.run("ors/ping without session id", `POST /ping without X-Session-ID: 400, application/json, {"detail": string} (§2.1)`, func() (string, bool) {
			ex, err := c.post(c.base+"/ping", nil, nil)
			return detailCase(ex, err, http.StatusBadRequest)
		})
	}
	if !c.blocked("ors/ping unknown session") {
		c.r.run("ors/ping unknown session", `POST /ping with an unknown X-Session-ID: 404, application/json, {"detail": string} (§4.12)`, func() (string, bool) {
			ex, err := c.post(c.base+"/ping", nil, sidHeader("ortrain-envcheck-"+rand.Text()))
			return detailCase(ex, err, http.StatusNotFound)
		})
	}
}

// answered checks that a plain answer arrived with status want and a JSON
// Content-Type; "" when so, else what was observed instead.
func answered(ex *exchange, err error, want int) string {
	if err != nil {
		return "no answer: " + err.Error()
	}
	if ex.Status != want {
		return fmt.Sprintf("HTTP %d, not %d: %s", ex.Status, want, brief(ex.Body))
	}
	if ct := ex.Header.Get("Content-Type"); !isJSONType(ct) {
		return fmt.Sprintf("HTTP %d with Content-Type %q, not application/json (a Python client's response.json() refuses it)", ex.Status, ct)
	}
	return ""
}

// jsonAnswer is answered plus a body that is a JSON object.
func jsonAnswer(ex *exchange, err error, want int) (map[string]json.RawMessage, string) {
	if bad := answered(ex, err, want); bad != "" {
		return nil, bad
	}
	obj, err := jsonObject(ex.Body)
	if err != nil {
		return nil, fmt.Sprintf("body %s: %v", brief(ex.Body), err)
	}
	return obj, ""
}

// detailAnswer checks a FastAPI-style error: status want, JSON, {"detail": string}.
func detailAnswer(ex *exchange, err error, want int) (string, string) {
	obj, bad := jsonAnswer(ex, err, want)
	if bad != "" {
		return "", bad
	}
	detail, bad := stringField(obj, "detail")
	if bad != "" {
		return "", bad
	}
	return detail, ""
}

// detailCase is detailAnswer shaped as a case result.
func detailCase(ex *exchange, err error, want int) (string, bool) {
	detail, bad := detailAnswer(ex, err, want)
	if bad != "" {
		return bad, false
	}
	return fmt.Sprintf("%d %q", want, detail), true
}

// isJSONType: what the Python clients' response.json() accepts.
func isJSONType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}

// jsonObject decodes b as one JSON object (null is not one).
func jsonObject(b []byte) (map[string]json.RawMessage, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	if obj == nil {
		return nil, fmt.Errorf("null, not an object")
	}
	return obj, nil
}

// jsonKind names the JSON type of raw.
func jsonKind(raw json.RawMessage) string {
	b := bytes.TrimSpace(raw)
	if len(b) == 0 {
		return "nothing"
	}
	switch b[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

// stringField reads obj[key] as a string; the second result says what is
// wrong when it is not one.
func stringField(obj map[string]json.RawMessage, key string) (string, string) {
	raw, ok := obj[key]
	if !ok {
		return "", fmt.Sprintf("no %q key", key)
	}
	var s string
	if jsonKind(raw) != "string" || json.Unmarshal(raw, &s) != nil {
		return "", fmt.Sprintf("%q is %s, not a string", key, jsonKind(raw))
	}
	return s, ""
}

// taskList reads "tasks": an array of objects.
func taskList(obj map[string]json.RawMessage) ([]json.RawMessage, string) {
	raw, ok := obj["tasks"]
	if !ok {
		return nil, `no "tasks" key`
	}
	var tasks []json.RawMessage
	if jsonKind(raw) != "array" || json.Unmarshal(raw, &tasks) != nil {
		return nil, fmt.Sprintf(`"tasks" is %s, not an array`, jsonKind(raw))
	}
	for i, t := range tasks {
		if jsonKind(t) != "object" {
			return nil, fmt.Sprintf("task %d is %s, not an object", i, jsonKind(t))
		}
	}
	return tasks, ""
}

// jsonEqual: a and b decode to the same value (key order and spacing aside).
func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// tasksAnswer reads a 200 {"tasks":[...], "env_name"} answer (/task_range,
// /tasks): what is wrong with it, or the tasks.
func (c *orsCheck) tasksAnswer(ex *exchange, err error) ([]json.RawMessage, string) {
	obj, bad := jsonAnswer(ex, err, http.StatusOK)
	if bad != "" {
		return nil, bad
	}
	tasks, bad := taskList(obj)
	if bad == "" {
		bad = c.envName(obj)
	}
	return tasks, bad
}

// toolsAnswer reads a 200 {"tools":[ToolSpec...]} answer (/tools,
// /task_tools): what is wrong with it, or the tools.
func toolsAnswer(ex *exchange, err error) ([]orsTool, string) {
	obj, bad := jsonAnswer(ex, err, http.StatusOK)
	if bad != "" {
		return nil, bad
	}
	return toolSpecs(obj)
}
