package train

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/config"
	"github.com/ortrain/ortrain/internal/envtarget"
)

// runEnv is one configured environment, connected.
type runEnv struct {
	Config config.EnvConfig
	// Key is the entry's unique, readable name in metrics, trajectories and
	// the manifest (envs[].name, else the env's name, with the split when
	// two entries share a name).
	Key string
	// Name is the env's own name: the built-in name, the catalog name or
	// the URL.
	Name string
	Conn envtarget.Env
	// Indices are the task indices of Config.Split the run draws from.
	Indices []int
}

// setupCallTimeout bounds each env call made while connecting (resolving,
// probing, counting tasks), so an env that accepts and never answers
// cannot hang startup.
const setupCallTimeout = 2 * time.Minute

// connectEnvs resolves every env target (serving builtin ones on loopback)
// and selects each env's task indices. Close the returned envs.
func connectEnvs(ctx context.Context, cfgs []config.EnvConfig, getenv func(string) string, log zerolog.Logger) ([]*runEnv, error) {
	var out []*runEnv
	fail := func(err error) ([]*runEnv, error) {
		closeEnvs(out)
		return nil, err
	}
	for i, ec := range cfgs {
		e, err := connectEnv(ctx, ec, getenv, log)
		if err != nil {
			return fail(fmt.Errorf("envs[%d] %s: %w", i, ec.Target, err))
		}
		out = append(out, e)
	}
	assignKeys(out)
	return out, nil
}

func connectEnv(ctx context.Context, ec config.EnvConfig, getenv func(string) string, log zerolog.Logger) (*runEnv, error) {
	oe, err := openEnvOptions(ec)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, setupCallTimeout)
	defer cancel()
	conn, err := envtarget.Resolve(cctx, ec.Target, envtarget.Options{Getenv: getenv, Logger: log, Protocol: ec.Protocol, TokenEnv: ec.TokenEnv, OpenEnv: oe, ToolLatency: ec.ToolLatency})
	if err != nil {
		return nil, err
	}
	e := &runEnv{Config: ec, Name: conn.Name(), Conn: conn}
	n, err := conn.NumTasks(cctx, ec.Split)
	if err == nil {
		e.Indices, err = envtarget.SelectIndices(ec.Split, n, ec.Indices, ec.NumTasks)
	}
	if err != nil {
		closeEnvs([]*runEnv{e})
		return nil, err
	}
	return e, nil
}

// openEnvOptions reads envs[].openenv and the tasks file of an entry.
func openEnvOptions(ec config.EnvConfig) (envtarget.OpenEnvOptions, error) {
	o := envtarget.OpenEnvOptions{
		ActionTool: ec.OpenEnv.ActionTool, TextAction: ec.OpenEnv.TextAction,
		ObservationField: ec.OpenEnv.ObservationField, ObservationDiff: ec.OpenEnv.ObservationDiff,
		NumTasks: ec.NumTasks,
	}
	for _, idx := range ec.Indices {
		o.NumTasks = max(o.NumTasks, idx+1)
	}
	if ec.Tasks == "" {
		return o, nil
	}
	tasks, err := envtarget.ReadTasksFile(ec.Tasks)
	if err != nil {
		return o, err
	}
	o.Tasks = tasks
	return o, nil
}

// assignKeys gives every entry a unique, readable key: its name field, else
// the env's short name (a URL's host and path), with the split when two
// entries share it, and a counter as the last resort.
func assignKeys(es []*runEnv) {
	base := make([]string, len(es))
	count := map[string]int{}
	for i, e := range es {
		base[i] = shortName(e.Name)
		if e.Config.Name != "" {
			base[i] = e.Config.Name
		}
		count[base[i]]++
	}
	used := map[string]bool{}
	for _, e := range es {
		if e.Config.Name != "" {
			used[e.Config.Name] = true
		}
	}
	for i, e := range es {
		key := base[i]
		if e.Config.Name == "" && count[key] > 1 {
			key += "-" + e.Config.Split
		}
		if e.Config.Name == "" {
			for n := 2; used[key]; n++ {
				key = fmt.Sprintf("%s-%s-%d", base[i], e.Config.Split, n)
			}
		}
		used[key] = true
		e.Key = key
	}
}

// shortName turns a URL into host[:port][-path] (metric keys have no
// scheme or slashes); other names pass through.
func shortName(name string) string {
	u, err := url.Parse(name)
	if err != nil || u.Host == "" {
		return name
	}
	s := u.Host
	if p := strings.Trim(u.Path, "/"); p != "" {
		s += "-" + strings.ReplaceAll(p, "/", "-")
	}
	return s
}

// closeEnvs releases every env (in-process servers included), each bounded.
func closeEnvs(es []*runEnv) {
	for _, e := range es {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = e.Conn.Close(ctx)
		cancel()
	}
}

// checkFinalAnswerTools opens one session per env that names a
// final_answer_tool and refuses to start when the env does not offer it:
// every answer would otherwise become a failed call and the run would train
// on errors. Tools are known only from a session (task-scoped ones).
func checkFinalAnswerTools(ctx context.Context, cfg *config.Config, es []*runEnv) error {
	for i, e := range es {
		tool := cfg.EnvChat(i).FinalAnswerTool
		if tool == "" || len(e.Indices) == 0 {
			continue
		}
		names, err := sessionTools(ctx, e)
		if err != nil {
			return fmt.Errorf("envs[%d] %s: check final_answer_tool %q: %w", i, e.Key, tool, err)
		}
		found := false
		for _, n := range names {
			found = found || n == tool
		}
		if !found {
			return &config.FieldError{Field: fmt.Sprintf("chat.final_answer_tool (for envs[%d] %s)", i, e.Key), Value: tool,
				Allowed: fmt.Sprintf("one of the env's tools (%s), or \"\" to switch it off for this env (envs[%d].chat.final_answer_tool)", strings.Join(names, ", "), i)}
		}
	}
	return nil
}

// sessionTools lists the tools one real session of e offers.
func sessionTools(ctx context.Context, e *runEnv) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, setupCallTimeout)
	defer cancel()
	s, err := e.Conn.OpenSession(ctx, envtarget.TaskRef{Split: e.Config.Split, Index: e.Indices[0], Secrets: e.Config.Secrets})
	if err != nil {
		return nil, err
	}
	defer func() {
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer ccancel()
		_ = s.Close(cctx)
	}()
	tools, err := s.Tools(ctx)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(tools))
	for i, t := range tools {
		names[i] = t.Name
	}
	return names, nil
}

// ConnectEnv resolves one configured env as a run does (its protocol,
// token, OpenEnv options and tasks file) and returns the connection and
// the task indices of its split the run would draw from. Close the Env.
func ConnectEnv(ctx context.Context, ec config.EnvConfig, getenv func(string) string, log zerolog.Logger) (envtarget.Env, []int, error) {
	e, err := connectEnv(ctx, ec, getenv, log)
	if err != nil {
		return nil, nil, err
	}
	return e.Conn, e.Indices, nil
}
