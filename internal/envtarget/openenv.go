package envtarget

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"

	"github.com/ortrain/ortrain/internal/openenv"
)

// OpenEnv is the OpenEnv standard (one WebSocket per episode, reset/step,
// MCP tools, tasks from a local dataset).
const OpenEnv Protocol = "openenv"

// OpenEnvOptions say how an OpenEnv env is turned into tasks, tools and
// turns (envs[].openenv and envs[].tasks in the config).
type OpenEnvOptions struct {
	// ActionTool names the one tool a Gym-style env's action is offered as
	// (default "step").
	ActionTool string
	// TextAction sends the assistant's plain text as the action's single
	// string field (TRL's Wordle pattern) instead of offering a tool.
	TextAction bool
	// ObservationField renders only this field of an observation ("" = the
	// whole observation as JSON); ObservationDiff renders only the text that
	// is new since the previous turn (for cumulative text fields).
	ObservationField string
	ObservationDiff  bool
	// Tasks come from a tasks file; without one, task i is an episode reset
	// with seed i, prompted by the reset observation, and NumTasks says how
	// many there are.
	Tasks    []OpenEnvTask
	NumTasks int
}

// OpenEnvTask is one row of a tasks file.
type OpenEnvTask struct {
	Split  string         `json:"split,omitempty"`
	Prompt string         `json:"prompt"`
	Reset  map[string]any `json:"reset"`
}

// NoTaskListError is an OpenEnv target without a tasks file or a count.
type NoTaskListError struct{ Target string }

func (e *NoTaskListError) Error() string {
	return fmt.Sprintf("%s speaks OpenEnv, which has no task list: give the env entry tasks: FILE.jsonl, or num_tasks (episodes reset with seed 0..n-1)", e.Target)
}

var _ CapacityWaiter = (*openEnv)(nil)

// openEnv is an Env over the OpenEnv client.
type openEnv struct {
	target, name string
	client       *openenv.Client
	mcp          bool
	actionSchema json.RawMessage // Gym-style: the action minus metadata
	textField    string          // TextAction: the action's string field
	opts         OpenEnvOptions
	stopServer   func(context.Context) error
}

// openOpenEnv connects to an OpenEnv server at url; schema is its GET
// /schema when a probe read it already (nil: read it now).
func openOpenEnv(ctx context.Context, target, url, name string, opts Options, schema *openenv.Schema) (*openEnv, error) {
	tokenEnv, token := "", ""
	if KindOf(target) == KindURL {
		tokenEnv, token = tokenFor(target, opts)
	}
	c, err := openenv.NewClient(url, openenv.Options{Logger: opts.Logger.With().Str("env", name).Logger(), Token: token, TokenEnv: tokenEnv})
	if err != nil {
		return nil, &TargetError{Target: target, Reason: "not a valid OpenEnv target", Err: err}
	}
	if schema == nil {
		s, err := c.Schema(ctx)
		if err != nil {
			c.CloseIdleConnections()
			return nil, fmt.Errorf("%s: read the OpenEnv schema: %w", target, err)
		}
		schema = &s
	}
	o := opts.OpenEnv
	if o.ActionTool == "" {
		o.ActionTool = "step"
	}
	e := &openEnv{target: target, name: name, client: c, mcp: schema.IsMCP(), opts: o}
	if e.mcp {
		if o.TextAction {
			return nil, &TargetError{Target: target, Reason: "openenv.text_action needs a Gym-style env with one string action field; this env's actions are MCP tool calls"}
		}
		return e, nil
	}
	if e.actionSchema, err = schema.ActionTool(); err != nil {
		return nil, fmt.Errorf("%s: %w", target, err)
	}
	if o.TextAction {
		field, ok := schema.TextActionField()
		if !ok {
			return nil, &TargetError{Target: target, Reason: "openenv.text_action needs an action with exactly one string field; this action schema is " + string(e.actionSchema)}
		}
		e.textField = field
	}
	return e, nil
}

func (e *openEnv) Protocol() Protocol { return OpenEnv }
func (e *openEnv) Name() string       { return e.name }

// CapacityWaits counts the CAPACITY_REACHED refusals sessions waited out.
func (e *openEnv) CapacityWaits() int64 { return e.client.CapacityWaits() }

// IgnoredFrames counts server frames that answered no request (dropped).
func (e *openEnv) IgnoredFrames() int64 { return e.client.IgnoredFrames() }

// NumTasks counts the tasks file's rows of split, or the configured count.
func (e *openEnv) NumTasks(_ context.Context, split string) (int, error) {
	if e.opts.Tasks != nil {
		return len(e.splitTasks(split)), nil
	}
	if e.opts.NumTasks <= 0 {
		return 0, &NoTaskListError{Target: e.target}
	}
	return e.opts.NumTasks, nil
}

// splitTasks are the rows of split; rows without a split are train rows.
func (e *openEnv) splitTasks(split string) []OpenEnvTask {
	var out []OpenEnvTask
	for _, t := range e.opts.Tasks {
		s := t.Split
		if s == "" {
			s = "train"
		}
		if s == split {
			out = append(out, t)
		}
	}
	return out
}

// task returns the reset kwargs and prompt of task i of split ("" prompt:
// the reset observation prompts the model).
func (e *openEnv) task(split string, i int) (map[string]any, string, error) {
	if e.opts.Tasks == nil {
		return map[string]any{"seed": i}, "", nil
	}
	rows := e.splitTasks(split)
	if i < 0 || i >= len(rows) {
		return nil, "", &IndexError{Split: split, Index: i, N: len(rows)}
	}
	return maps.Clone(rows[i].Reset), rows[i].Prompt, nil
}

// withSecrets adds the env entry's secrets to a reset's "secrets" argument
// (the one OpenEnv's ORS import passes to the env's constructor); a task's
// own secrets win key by key.
func withSecrets(kwargs map[string]any, secrets map[string]string) map[string]any {
	if len(secrets) == 0 {
		return kwargs
	}
	merged := map[string]any{}
	for k, v := range secrets {
		merged[k] = v
	}
	if own, ok := kwargs["secrets"].(map[string]any); ok {
		maps.Copy(merged, own)
	}
	kwargs["secrets"] = merged
	return kwargs
}

// redactSecrets hides the values of a reset's secrets (for listings).
func redactSecrets(kwargs map[string]any) map[string]any {
	own, ok := kwargs["secrets"].(map[string]any)
	if !ok {
		return kwargs
	}
	out := maps.Clone(kwargs)
	hidden := map[string]any{}
	for k := range own {
		hidden[k] = "<redacted>"
	}
	out["secrets"] = hidden
	return out
}

// OpenSession resets a fresh episode with the task's kwargs; the G
// generations of a group reset with the same ones.
func (e *openEnv) OpenSession(ctx context.Context, t TaskRef) (Session, error) {
	kwargs, prompt, err := e.task(t.Split, t.Index)
	if err != nil {
		return nil, err
	}
	if kwargs == nil {
		kwargs = map[string]any{}
	}
	kwargs = withSecrets(kwargs, t.Secrets)
	s, first, err := e.client.Start(ctx, kwargs)
	if err != nil {
		return nil, e.wrap(err)
	}
	sess := &openEnvSession{env: e, s: s}
	obs := sess.render(first.Observation)
	if prompt == "" {
		prompt = obs
	}
	sess.prompt = prompt
	if e.textField != "" {
		return &textActionSession{sess}, nil
	}
	return sess, nil
}

func (e *openEnv) Close(ctx context.Context) error {
	e.client.CloseIdleConnections()
	if e.stopServer != nil {
		return e.stopServer(ctx)
	}
	return nil
}

// Describe lists the tasks of a tasks file (or the seeded episodes) and,
// with q.Tools, the tools a model is offered.
func (e *openEnv) Describe(ctx context.Context, q Query) (*Listing, error) {
	n, err := e.NumTasks(ctx, q.Split)
	var idx []int
	var nt *NoTaskListError
	switch {
	case errors.As(err, &nt) && len(q.Indices) == 0 && q.NumTasks == 0:
		// No task list: the env itself (metadata, schemas, the tools of a
		// seed-0 episode) is still worth listing.
	case err != nil && !errors.As(err, &nt):
		return nil, err
	default:
		if err != nil {
			n = max(q.NumTasks, slicesMax(q.Indices)+1)
		}
		if idx, err = SelectIndices(q.Split, n, q.Indices, q.NumTasks); err != nil {
			return nil, err
		}
	}
	l := &Listing{Protocol: OpenEnv, MCP: e.mcp}
	meta, err := e.client.Metadata(ctx)
	if err != nil {
		return nil, err
	}
	if l.Metadata, err = json.Marshal(meta); err != nil {
		return nil, err
	}
	schema, err := e.client.Schema(ctx)
	if err != nil {
		return nil, err
	}
	l.ActionSchema, l.ObservationSchema = schema.Action, schema.Observation
	for _, i := range idx {
		kwargs, prompt, err := e.task(q.Split, i)
		if err != nil {
			return nil, err
		}
		spec, _ := json.Marshal(map[string]any{"prompt": prompt, "reset": redactSecrets(kwargs)})
		l.Tasks = append(l.Tasks, Task{Index: i, Spec: spec})
	}
	if q.Tools {
		probe := 0
		if len(idx) > 0 {
			probe = idx[0]
		}
		s, err := e.OpenSession(ctx, TaskRef{Split: q.Split, Index: probe})
		if err != nil {
			return nil, err
		}
		tools, err := s.Tools(ctx)
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		closeErr := s.Close(cctx)
		cancel()
		if err != nil {
			return nil, err
		}
		if closeErr != nil {
			return nil, closeErr
		}
		for _, t := range tools {
			l.Tools = append(l.Tools, ListedTool{ToolSpec: t, Scope: ScopeShared})
		}
	}
	return l, nil
}

// wrap marks infrastructure failures the way rollouts classify them.
func (e *openEnv) wrap(err error) error {
	var ce *openenv.ConnectionError
	if errors.As(err, &ce) && ce.CloseCode < 0 {
		return &UnreachableError{Target: e.target, Err: err}
	}
	return err
}

// openEnvSession is one episode on one WebSocket.
type openEnvSession struct {
	env    *openEnv
	s      *openenv.Session
	prompt string
	last   string // the previous observation's text, for ObservationDiff
}

func (s *openEnvSession) Prompt(context.Context) (string, error) { return s.prompt, nil }

// Tools are the MCP env's tools of this session, or the action as one tool
// (none with TextAction: the plain answer is the action).
func (s *openEnvSession) Tools(ctx context.Context) ([]ToolSpec, error) {
	if s.env.textField != "" {
		return nil, nil
	}
	if !s.env.mcp {
		return []ToolSpec{{Name: s.env.opts.ActionTool, Description: "Take one action in the environment; the observation comes back.", InputSchema: s.env.actionSchema}}, nil
	}
	tools, err := s.s.ListTools(ctx)
	if err != nil {
		return nil, s.env.wrap(err)
	}
	out := make([]ToolSpec, len(tools))
	for i, t := range tools {
		out[i] = ToolSpec{Name: t.Name, Description: t.Description, InputSchema: t.InputSchema}
	}
	return out, nil
}

// CallTool runs an MCP tool, or steps a Gym-style env with the action. An
// action the env rejects (VALIDATION_ERROR, EXECUTION_ERROR) or a tool
// error observation reaches the model as the tool turn.
func (s *openEnvSession) CallTool(ctx context.Context, name string, input json.RawMessage) (*ToolOutput, error) {
	if s.env.mcp {
		tc, err := s.s.CallTool(ctx, name, input)
		if err != nil {
			return nil, s.toolErr(name, err)
		}
		if tc.Error != nil {
			return nil, &ToolError{Tool: name, Err: fmt.Errorf("%s: %s", tc.Error.Type, tc.Error.Message), Raised: tc.Error.Type == openenv.ToolExecutionError}
		}
		return &ToolOutput{Text: tc.Text(), Reward: tc.Reward, Finished: tc.Done}, nil
	}
	if name != s.env.opts.ActionTool {
		return nil, &ToolError{Tool: name, Err: fmt.Errorf("unknown tool %q: this environment takes actions through the %q tool", name, s.env.opts.ActionTool)}
	}
	return s.step(ctx, name, input)
}

func (s *openEnvSession) step(ctx context.Context, name string, action json.RawMessage) (*ToolOutput, error) {
	res, err := s.s.Step(ctx, action)
	if err != nil {
		return nil, s.toolErr(name, err)
	}
	return &ToolOutput{Text: s.render(res.Observation), Reward: res.Reward, Finished: res.Done, Metadata: res.Observation}, nil
}

// toolErr: what the env refused is the model's to read; the rest ends the episode.
func (s *openEnvSession) toolErr(name string, err error) error {
	if openenv.IsInfrastructure(err) {
		return s.env.wrap(err)
	}
	var se *openenv.ServerError
	if errors.As(err, &se) {
		return &ToolError{Tool: name, Err: err, Raised: se.Code == openenv.CodeExecutionError}
	}
	var re *openenv.RPCError
	if errors.As(err, &re) {
		return &ToolError{Tool: name, Err: err}
	}
	return err
}

// render turns an observation into the text of the next turn.
func (s *openEnvSession) render(obs json.RawMessage) string {
	o := s.env.opts
	var text string
	if o.ObservationField != "" {
		t, err := openenv.ObservationField(obs, o.ObservationField)
		if err != nil {
			t = err.Error()
		}
		text = t
	} else {
		var buf bytes.Buffer
		if json.Compact(&buf, obs) == nil {
			text = buf.String()
		} else {
			text = string(obs)
		}
	}
	if o.ObservationDiff {
		cur := text
		text = strings.TrimLeft(openenv.NewText(s.last, cur), "\n")
		s.last = cur
	}
	return text
}

func (s *openEnvSession) Close(ctx context.Context) error { return s.s.Close(ctx) }

// TextActor is a Session whose env takes the assistant's plain text as its
// action; the observation comes back as the next user turn.
type TextActor interface {
	TextAction(ctx context.Context, text string) (*ToolOutput, error)
}

// textActionSession is an OpenEnv session with openenv.text_action.
type textActionSession struct{ *openEnvSession }

func (s *textActionSession) TextAction(ctx context.Context, text string) (*ToolOutput, error) {
	action, err := json.Marshal(map[string]string{s.env.textField: text})
	if err != nil {
		return nil, err
	}
	return s.step(ctx, s.env.opts.ActionTool, action)
}

func slicesMax(xs []int) int {
	m := -1
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}
