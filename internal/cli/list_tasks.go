package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/ortrain/ortrain/internal/envs"
	"github.com/ortrain/ortrain/internal/envtarget"
	"github.com/ortrain/ortrain/internal/ors"
)

// ListTasksOptions are the inputs of `ortrain list-tasks`.
type ListTasksOptions struct {
	IO     *IOStreams
	Logger zerolog.Logger
	Getenv func(string) string

	Env      string
	Split    string
	NumTasks int
	Indices  []int
	Tools    bool
	Format   string
	// Protocol and TasksFile are for OpenEnv targets (which list no tasks).
	Protocol  string
	TasksFile string
	// TokenEnv names the variable holding --env's bearer token.
	TokenEnv string
	// Run lists a run directory's per-task pass rates instead of an env.
	Run string
}

var listTasksFormats = []string{"table", "json", "jsonl"}

func newListTasksCmd(deps *Deps, runF func(context.Context, *ListTasksOptions) error) *cobra.Command {
	opts := &ListTasksOptions{}
	cmd := &cobra.Command{
		Use:   "list-tasks --env TARGET | --run RUN_DIR",
		Short: "List an environment's tasks (and tools)",
		Long: `List the tasks of one split of an environment: an index column plus one
column per task-spec key (an OpenEnv env, which has no task list, shows its
metadata, schemas and MCP tools, and the tasks of --tasks). With --tools, also list the tools a policy would see:
the shared ones (/tools) and the task-scoped ones, found by opening one real
session on the first listed task (/task_tools).

TARGET is one of:
  http://HOST:PORT        a self-hosted ORS or OpenEnv server: the protocol is probed
                          (--protocol pins it); ORS: add /NAME for a non-default env
  Owner/Env               a hosted catalog environment (needs OPENREWARD_API_KEY)
  builtin:NAME            a built-in env, served in-process (` + strings.Join(envs.Names(), ", ") + `)

With --run RUN_DIR instead of --env, list the tasks a training run has tried
with their pass rates (from RUN_DIR/task_pass_rates.json, written with each
checkpoint): pass rate and mean reward over each task's recent rollouts, and
where the curriculum's bounds put it (too_easy, too_hard, in_band); hardest
first. --split, --indices, --num-tasks and --format filter and shape it.

Output: an aligned table on a terminal, tab-separated values when piped;
--format json prints one document {env, split, tasks[{index, task}], tools[]},
--format jsonl one {"index","task"} object per line (then one {"tool","scope"}
per tool). JSON fields may be added in later versions, never changed.

Environment variables:
  OPENREWARD_API_KEY      API key for catalog environments
  OPENREWARD_URL          platform web base (default https://openreward.ai)
  OPENREWARD_API_URL      override of the platform API host (https://api.<host>)
  OPENREWARD_SESSION_URL  override of the sessions host (https://sessions.<host>)`,
		Example: `  ortrain list-tasks --env http://127.0.0.1:8080 --tools
  ortrain list-tasks --env builtin:letters --split mixed --num-tasks 5
  ortrain list-tasks --env Eigent/SETA --indices 0,5,7 --format json
  ortrain list-tasks --run runs/ladder --num-tasks 10`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.IO = deps.IO
			opts.Getenv = deps.Getenv
			opts.Logger = deps.Logger.With().Str("command", "list-tasks").Logger()
			if err := opts.validate(cmd.Flags().Changed("num-tasks"), cmd.Flags().Changed("split")); err != nil {
				return err
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			if opts.Run != "" {
				return runListPassRates(opts)
			}
			return runListTasks(cmd.Context(), opts)
		},
	}
	cmd.Flags().StringVar(&opts.Env, "env", "", "environment: URL, Owner/Env catalog name, or builtin:NAME (required)")
	cmd.Flags().StringVar(&opts.Run, "run", "", "instead of --env: a training run directory whose per-task pass rates to list")
	cmd.Flags().StringVar(&opts.Split, "split", "train", "task split")
	cmd.Flags().IntVar(&opts.NumTasks, "num-tasks", 0, "list only the first N tasks")
	cmd.Flags().IntSliceVar(&opts.Indices, "indices", nil, "list only these task indices (e.g. 0,5,7)")
	cmd.Flags().BoolVar(&opts.Tools, "tools", false, "also list shared and task-scoped tools (opens one session)")
	addEnvTargetFlags(cmd.Flags(), &opts.Protocol, &opts.TokenEnv)
	cmd.Flags().StringVar(&opts.TasksFile, "tasks", "", "OpenEnv: a tasks file (JSONL of {prompt, reset, split}) to list")
	cmd.Flags().StringVar(&opts.Format, "format", "table", "output format: "+strings.Join(listTasksFormats, ", "))
	return cmd
}

func (o *ListTasksOptions) validate(numTasksSet, splitSet bool) error {
	if o.Run != "" && !splitSet {
		o.Split = "" // every split the run trained on
	}
	switch {
	case o.Env != "" && o.Run != "":
		return usageErrorf("specify only one of --env (list an env's tasks) and --run (list a run's per-task pass rates)")
	case o.Env == "" && o.Run == "":
		return usageErrorf("--env is required (a URL like http://127.0.0.1:8080, a catalog name like Owner/Env, or builtin:NAME), or --run RUN_DIR for a run's per-task pass rates")
	case !slices.Contains(listTasksFormats, o.Format):
		return usageErrorf("--format %q is not a format (allowed: %s)", o.Format, strings.Join(listTasksFormats, ", "))
	case numTasksSet && len(o.Indices) > 0:
		return usageErrorf("specify only one of --num-tasks and --indices")
	case numTasksSet && o.NumTasks <= 0:
		return usageErrorf("--num-tasks %d must be at least 1", o.NumTasks)
	case o.Split == "" && o.Run == "":
		return usageErrorf("--split must not be empty")
	}
	for _, i := range o.Indices {
		if i < 0 {
			return usageErrorf("--indices: %d is negative; indices start at 0", i)
		}
	}
	return nil
}

func runListTasks(ctx context.Context, opts *ListTasksOptions) error {
	oe := envtarget.OpenEnvOptions{NumTasks: max(opts.NumTasks, 1)}
	if opts.TasksFile != "" {
		tasks, err := envtarget.ReadTasksFile(opts.TasksFile)
		if err != nil {
			return &UsageError{Err: fmt.Errorf("--tasks: %w", err)}
		}
		oe.Tasks = tasks
	}
	env, err := envtarget.Resolve(ctx, opts.Env, envtarget.Options{Getenv: opts.Getenv, Logger: opts.Logger, Protocol: opts.Protocol, TokenEnv: opts.TokenEnv, OpenEnv: oe})
	if err != nil {
		return targetError(err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
		defer cancel()
		_ = env.Close(cctx)
	}()
	l, err := env.Describe(ctx, envtarget.Query{Split: opts.Split, Indices: opts.Indices, NumTasks: opts.NumTasks, Tools: opts.Tools})
	if err != nil {
		return targetError(err)
	}
	switch opts.Format {
	case "json":
		return writeTasksJSON(opts.IO.Out, opts, l)
	case "jsonl":
		return writeTasksJSONL(opts.IO.Out, l)
	}
	return writeTasksTable(opts.IO, l)
}

// targetError turns the resolver's typed errors into usage errors
// (printError adds the hint for an unreachable env).
func targetError(err error) error {
	var te *envtarget.TargetError
	var se *envtarget.SplitError
	var ie *envtarget.IndexError
	switch {
	case errors.As(err, &te):
		return &UsageError{Err: fmt.Errorf("--env: %w", err)}
	case errors.As(err, &se):
		return usageErrorf("--split %q is not a split of %s (valid splits: %s)", se.Split, se.Target, strings.Join(se.Valid, ", "))
	case errors.As(err, &ie):
		return usageErrorf("--indices: %d is out of range: split %q has %d tasks (0-%d)", ie.Index, ie.Split, ie.N, ie.N-1)
	}
	return err
}

// writeOpenEnvHeader prints what an OpenEnv env says of itself: its
// metadata, whether it is an MCP env, and its action and observation schemas.
func writeOpenEnvHeader(io *IOStreams, l *envtarget.Listing) {
	var meta struct{ Name, Version, Description string }
	_ = json.Unmarshal(l.Metadata, &meta)
	kind := "Gym-style: the action is offered as one tool"
	if l.MCP {
		kind = "MCP: tools from list_tools"
	}
	fmt.Fprintf(io.Out, "ENV\t%s %s (OpenEnv; %s)\n", meta.Name, meta.Version, kind)
	if meta.Description != "" {
		fmt.Fprintf(io.Out, "DESCRIPTION\t%s\n", meta.Description)
	}
	fmt.Fprintf(io.Out, "ACTION\t%s\n", cellOf(l.ActionSchema))
	fmt.Fprintf(io.Out, "OBSERVATION\t%s\n\n", cellOf(l.ObservationSchema))
}

// specKeys returns the keys of a JSON object in document order.
func specKeys(spec json.RawMessage) []string {
	dec := json.NewDecoder(bytes.NewReader(spec))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return keys
		}
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return keys
		}
	}
	return keys
}

func cellOf(v json.RawMessage) string {
	if len(v) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(v, &s) == nil {
		return s
	}
	var buf bytes.Buffer
	if json.Compact(&buf, v) == nil {
		return buf.String()
	}
	return string(v)
}

func writeTasksTable(io *IOStreams, l *envtarget.Listing) error {
	tasks, tools := l.Tasks, l.Tools
	if l.Protocol == envtarget.OpenEnv {
		writeOpenEnvHeader(io, l)
	}
	var cols []string
	seen := map[string]bool{}
	for _, t := range tasks {
		for _, k := range specKeys(t.Spec) {
			if !seen[k] {
				seen[k] = true
				cols = append(cols, k)
			}
		}
	}
	tp := newTablePrinter(io.Out, io.IsStdoutTTY())
	tp.AddRow(append([]string{"INDEX"}, upper(cols)...)...)
	for _, t := range tasks {
		var obj map[string]json.RawMessage
		_ = json.Unmarshal(t.Spec, &obj)
		row := []string{strconv.Itoa(t.Index)}
		for _, k := range cols {
			row = append(row, cellOf(obj[k]))
		}
		tp.AddRow(row...)
	}
	if err := tp.Render(); err != nil {
		return err
	}
	if tools == nil {
		return nil
	}
	fmt.Fprintln(io.Out)
	tp = newTablePrinter(io.Out, io.IsStdoutTTY())
	tp.AddRow("TOOL", "SCOPE", "DESCRIPTION")
	for _, t := range tools {
		tp.AddRow(t.Name, string(t.Scope), t.Description)
	}
	return tp.Render()
}

func upper(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = strings.ToUpper(v)
	}
	return out
}

type taskRow struct {
	Index int             `json:"index"`
	Task  json.RawMessage `json:"task"`
}

func taskRows(tasks []envtarget.Task) []taskRow {
	rows := make([]taskRow, len(tasks))
	for i, t := range tasks {
		rows[i] = taskRow{Index: t.Index, Task: t.Spec}
	}
	return rows
}

func writeTasksJSON(w io.Writer, opts *ListTasksOptions, l *envtarget.Listing) error {
	doc := struct {
		Env               string                 `json:"env"`
		Protocol          envtarget.Protocol     `json:"protocol"`
		Split             string                 `json:"split"`
		Tasks             []taskRow              `json:"tasks"`
		Tools             []envtarget.ListedTool `json:"tools,omitempty"`
		Metadata          json.RawMessage        `json:"metadata,omitempty"`
		ActionSchema      json.RawMessage        `json:"action_schema,omitempty"`
		ObservationSchema json.RawMessage        `json:"observation_schema,omitempty"`
	}{Env: opts.Env, Protocol: l.Protocol, Split: opts.Split, Tasks: taskRows(l.Tasks), Tools: l.Tools,
		Metadata: l.Metadata, ActionSchema: l.ActionSchema, ObservationSchema: l.ObservationSchema}
	b, err := ors.MarshalJSON(doc)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func writeTasksJSONL(w io.Writer, l *envtarget.Listing) error {
	for _, r := range taskRows(l.Tasks) {
		b, err := ors.MarshalJSON(r)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "%s\n", b)
	}
	for _, t := range l.Tools {
		b, err := ors.MarshalJSON(struct {
			Tool  envtarget.ToolSpec  `json:"tool"`
			Scope envtarget.ToolScope `json:"scope"`
		}{t.ToolSpec, t.Scope})
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "%s\n", b)
	}
	return nil
}
