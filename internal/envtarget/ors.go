package envtarget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
	"github.com/ortrain/ortrain/internal/ors"
	"github.com/ortrain/ortrain/internal/ors/orsserver"
)

var _ CapacityWaiter = (*orsEnv)(nil)

// orsEnv is an Env over the ORS client; builtin targets also own the
// in-process server.
type orsEnv struct {
	target string
	name   string
	client *ors.Client
	// stopServer stops a builtin target's loopback server (nil otherwise).
	stopServer func(context.Context) error
	// Server is the builtin target's server (for its session counters).
	server *orsserver.Server
}

// resolveBuiltin serves builtin:NAME on loopback over the requested
// protocol (its own by default) and connects to it.
func resolveBuiltin(ctx context.Context, target string, opts Options) (Env, error) {
	name, latency, err := parseBuiltin(target, opts.ToolLatency)
	if err != nil {
		return nil, err
	}
	native, err := envs.ProtocolOf(name)
	if err != nil {
		return nil, &TargetError{Target: target, Reason: "no such built-in env", Err: err}
	}
	proto := envs.Protocol(opts.Protocol)
	if opts.Protocol == "" || opts.Protocol == "auto" {
		proto = native
	}
	if native == envs.ProtocolORS && proto == envs.ProtocolOpenEnv {
		if opts.OpenEnv, err = orsTasksOverOpenEnv(ctx, name, opts.OpenEnv); err != nil {
			return nil, err
		}
	}
	log := opts.Logger.With().Str("env", name).Logger()
	// The server outlives ctx (it bounds only resolution): Close stops it.
	srv, err := envs.ServeLocalProtocol(context.WithoutCancel(ctx), name, proto, envs.ServeOptions{
		ORS: orsserver.Options{Logger: log}, OpenEnv: openenvserver.Options{Logger: log}, ToolLatency: latency,
	})
	if err != nil {
		var pe *envs.ProtocolError
		if errors.As(err, &pe) {
			return nil, &TargetError{Target: target, Reason: "cannot be served over " + string(proto), Err: err}
		}
		return nil, fmt.Errorf("serve built-in env %q: %w", name, err)
	}
	if srv.Protocol == envs.ProtocolOpenEnv {
		e, err := openOpenEnv(ctx, target, srv.URL, name, opts, nil)
		if err != nil {
			stopBounded(ctx, srv.Stop)
			return nil, err
		}
		e.stopServer = srv.Stop
		return e, nil
	}
	e, err := resolveORS(ctx, target, srv.URL, name, opts)
	if err != nil {
		stopBounded(ctx, srv.Stop)
		return nil, err
	}
	oe := e.(*orsEnv)
	oe.server, oe.stopServer = srv.ORS, srv.Stop
	return oe, nil
}

// parseBuiltin splits builtin:NAME[?tool_latency=DURATION] into the env's
// name and its tool latency (the query's, else configured).
func parseBuiltin(target string, configured time.Duration) (string, time.Duration, error) {
	name, query, hasQuery := strings.Cut(strings.TrimPrefix(target, BuiltinPrefix), "?")
	if !hasQuery {
		return name, configured, nil
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return "", 0, &TargetError{Target: target, Reason: "bad query", Err: err}
	}
	latency := configured
	for k, v := range q {
		if k != "tool_latency" {
			return "", 0, &TargetError{Target: target, Reason: fmt.Sprintf("unknown parameter %q (builtin targets take tool_latency)", k)}
		}
		d, err := time.ParseDuration(v[len(v)-1])
		switch {
		case err != nil || d < 0:
			return "", 0, &TargetError{Target: target, Reason: fmt.Sprintf("tool_latency %q is not a duration >= 0 such as 300ms", v[len(v)-1])}
		case configured > 0 && d != configured:
			return "", 0, &TargetError{Target: target, Reason: fmt.Sprintf("tool_latency %s in the target and %s in the config; set it once", d, configured)}
		}
		latency = d
	}
	return name, latency, nil
}

// orsTasksOverOpenEnv gives a built-in ORS env served over OpenEnv its own
// task list (OpenEnv has none): one task per ORS task, reset with its split
// and index, prompted by the reset observation's prompt field — so
// {target: builtin:letters, protocol: openenv} trains like the ORS target.
func orsTasksOverOpenEnv(ctx context.Context, name string, o OpenEnvOptions) (OpenEnvOptions, error) {
	if o.ObservationField == "" {
		o.ObservationField = "prompt"
	}
	if o.Tasks != nil {
		return o, nil
	}
	decl, err := envs.New(name)
	if err != nil {
		return o, err
	}
	for _, sp := range decl.Splits {
		specs, err := decl.ListTasks(ctx, sp.Name)
		if err != nil {
			return o, fmt.Errorf("list tasks of %s split %q: %w", name, sp.Name, err)
		}
		for i := range specs {
			o.Tasks = append(o.Tasks, OpenEnvTask{Split: sp.Name, Reset: map[string]any{"split": sp.Name, "index": i}})
		}
	}
	return o, nil
}

// closeTimeout bounds closing a probe session and stopping a server, also
// after the caller's context was cancelled.
const closeTimeout = 10 * time.Second

// stopBounded stops a server with a fresh, bounded context.
func stopBounded(ctx context.Context, stop func(context.Context) error) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	_ = stop(sctx)
}

// resolveORS builds an ORS client for url (target is what the user wrote).
func resolveORS(_ context.Context, target, url, name string, opts Options) (Env, error) {
	e := &orsEnv{target: target, name: name}
	c, err := ors.NewClient(url, ors.Options{Getenv: opts.Getenv, Logger: opts.Logger.With().Str("env", name).Logger()})
	if err != nil {
		var auth *ors.AuthError
		if errors.As(err, &auth) {
			return nil, err
		}
		return nil, &TargetError{Target: target, Reason: "not a valid ORS target", Err: err}
	}
	e.client = c
	if d := c.Deployment(); d != "" {
		e.name = d
	}
	return e, nil
}

// FromORSClient wraps an ORS client built by the caller (custom retries or
// transport) as an Env; closing the Env closes the client's idle connections.
func FromORSClient(c *ors.Client, target string) Env {
	name := target
	if d := c.Deployment(); d != "" {
		name = d
	}
	return &orsEnv{target: target, name: name, client: c}
}

func (e *orsEnv) Protocol() Protocol { return ORS }
func (e *orsEnv) Name() string       { return e.name }

// CapacityWaits counts the busy answers (429, 503) the client waited out.
func (e *orsEnv) CapacityWaits() int64 { return e.client.CapacityWaits() }

// Server is the in-process server of a builtin target (nil otherwise); tests
// read its session counters.
func (e *orsEnv) Server() *orsserver.Server { return e.server }

// NumTasks counts the tasks of split. A server that rejects the request is
// asked for its splits: when split is not one of them the error is a
// *SplitError listing the valid ones.
func (e *orsEnv) NumTasks(ctx context.Context, split string) (int, error) {
	n, err := e.client.NumTasks(ctx, split)
	var inv *ors.InvalidRequestError
	if errors.As(err, &inv) {
		if splits, serr := e.client.Splits(ctx); serr == nil {
			var valid []string
			for _, s := range splits {
				valid = append(valid, s.Name)
			}
			if !contains(valid, split) {
				return 0, &SplitError{Target: e.target, Split: split, Valid: valid}
			}
		}
	}
	return n, wrapORS(e.target, err)
}

func (e *orsEnv) OpenSession(ctx context.Context, t TaskRef) (Session, error) {
	s, err := e.client.OpenSession(ctx, ors.SessionSpec{Split: t.Split, Index: t.Index, Secrets: t.Secrets})
	if err != nil {
		return nil, wrapORS(e.target, err)
	}
	return &orsSession{s: s, target: e.target}, nil
}

func (e *orsEnv) Close(ctx context.Context) error {
	if e.client != nil {
		e.client.CloseIdleConnections()
	}
	if e.stopServer != nil {
		return e.stopServer(ctx)
	}
	return nil
}

// Describe checks the split, reads the selected tasks and, with q.Tools,
// the shared tools plus the task-scoped ones of one real session.
func (e *orsEnv) Describe(ctx context.Context, q Query) (*Listing, error) {
	splits, err := e.client.Splits(ctx)
	if err != nil {
		return nil, wrapORS(e.target, err)
	}
	var valid []string
	for _, s := range splits {
		valid = append(valid, s.Name)
	}
	if !contains(valid, q.Split) {
		return nil, &SplitError{Target: e.target, Split: q.Split, Valid: valid}
	}
	tasks, err := e.tasks(ctx, q)
	if err != nil {
		return nil, wrapORS(e.target, err)
	}
	l := &Listing{Protocol: ORS}
	for _, t := range tasks {
		l.Tasks = append(l.Tasks, Task{Index: t.Index, Spec: t.Spec})
	}
	if q.Tools {
		probe := 0
		if len(tasks) > 0 {
			probe = tasks[0].Index
		}
		if l.Tools, err = e.tools(ctx, q.Split, probe); err != nil {
			return nil, wrapORS(e.target, err)
		}
	}
	return l, nil
}

func (e *orsEnv) tasks(ctx context.Context, q Query) ([]ors.Task, error) {
	switch {
	case len(q.Indices) > 0:
		n, err := e.client.NumTasks(ctx, q.Split)
		if err != nil {
			return nil, err
		}
		var out []ors.Task
		for _, i := range q.Indices {
			if i < 0 || i >= n {
				return nil, &IndexError{Split: q.Split, Index: i, N: n}
			}
			t, err := e.client.Task(ctx, q.Split, i)
			if err != nil {
				return nil, err
			}
			out = append(out, t)
		}
		return out, nil
	case q.NumTasks > 0:
		return e.client.TaskRange(ctx, q.Split, 0, q.NumTasks)
	}
	return e.client.Tasks(ctx, q.Split)
}

// tools lists the shared tools, then opens one session to find the
// task-scoped ones (in /task_tools but not in /tools).
func (e *orsEnv) tools(ctx context.Context, split string, index int) ([]ListedTool, error) {
	shared, err := e.client.Tools(ctx)
	if err != nil {
		return nil, err
	}
	s, err := e.client.OpenSession(ctx, ors.SessionSpec{Split: split, Index: index})
	if err != nil {
		return nil, fmt.Errorf("probe session for task-scoped tools: %w", err)
	}
	all, err := s.Tools(ctx)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	closeErr := s.Close(cctx)
	cancel()
	if err != nil {
		return nil, err
	}
	if closeErr != nil {
		return nil, closeErr
	}
	isShared := map[string]bool{}
	var rows []ListedTool
	for _, t := range shared {
		isShared[t.Name] = true
		rows = append(rows, ListedTool{ToolSpec: toolSpec(t), Scope: ScopeShared})
	}
	for _, t := range all {
		if !isShared[t.Name] {
			rows = append(rows, ListedTool{ToolSpec: toolSpec(t), Scope: ScopeTask})
		}
	}
	return rows, nil
}

// orsSession adapts an ors.Session.
type orsSession struct {
	s      *ors.Session
	target string
}

func (s *orsSession) Prompt(ctx context.Context) (string, error) {
	blocks, err := s.s.Prompt(ctx)
	if err != nil {
		return "", wrapORS(s.target, err)
	}
	var texts []string
	for _, b := range blocks {
		if b.Type == "text" || b.Type == "" {
			texts = append(texts, b.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

func (s *orsSession) Tools(ctx context.Context) ([]ToolSpec, error) {
	tools, err := s.s.Tools(ctx)
	if err != nil {
		return nil, wrapORS(s.target, err)
	}
	out := make([]ToolSpec, len(tools))
	for i, t := range tools {
		out[i] = toolSpec(t)
	}
	return out, nil
}

func (s *orsSession) CallTool(ctx context.Context, name string, input json.RawMessage) (*ToolOutput, error) {
	out, err := s.s.CallTool(ctx, name, input)
	var toolErr *ors.ToolCallError
	var failed *ors.ToolFailedError
	switch {
	case errors.As(err, &failed):
		return nil, &ToolError{Tool: name, Err: err, Raised: true}
	case errors.As(err, &toolErr):
		return nil, &ToolError{Tool: name, Err: err}
	case err != nil:
		return nil, wrapORS(s.target, err)
	}
	return &ToolOutput{Text: out.Text(), Reward: out.Reward, Finished: out.Finished, Metadata: out.Metadata}, nil
}

func (s *orsSession) Close(ctx context.Context) error { return s.s.Close(ctx) }

func toolSpec(t ors.ToolSpec) ToolSpec {
	return ToolSpec{Name: t.Name, Description: t.Description, InputSchema: t.InputSchema}
}

// wrapORS marks an unreachable server and a lost session with the neutral
// types rollouts classify; everything else passes through.
func wrapORS(target string, err error) error {
	var ue *ors.UnreachableError
	var lost *ors.SessionTerminatedError
	switch {
	case errors.As(err, &ue):
		return &UnreachableError{Target: target, Err: err}
	case errors.As(err, &lost), errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.ErrUnexpectedEOF):
		return &SessionLostError{Target: target, Err: err}
	}
	return err
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
