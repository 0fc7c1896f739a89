// Package orsserver serves Open Reward Standard environments written in Go:
// every endpoint of the protocol with the reference server's JSON, SSE
// framing safe for the Python clients, resumable tool calls, asynchronous
// setup and idle reaping.
//
// An environment is an *Env value: its splits, its tasks (a full list or a
// count plus a getter), its shared tools, and a constructor that builds one
// Instance per session from a task spec and secrets. An Instance gives the
// prompt and may add Setup, Teardown and task-scoped tools.
//
// Beyond the reference, the kit bounds what one client can make it hold or
// send back: request bodies at 16 MiB (413), session ids at 256 bytes (400),
// the input a 422 item repeats at 1 KiB (marked input_truncated), and, with
// Options.MaxSessions, the sessions open at once (503, which ORS clients
// wait out and retry).
package orsserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/ortrain/ortrain/internal/ors"
)

// Env declares one environment.
type Env struct {
	// Name is the path segment; it is lowercased when served.
	Name string
	// Description is a one-line summary (for listings; not part of ORS).
	Description string
	// Splits lists the task splits. Types default to the split name when it
	// is train/validation/test, else "validation" (as the reference does).
	Splits []ors.Split
	// ListTasks returns every task spec of a split (a JSON object each).
	// Leave nil for index-only envs and set NumTasks and GetTask instead.
	ListTasks func(ctx context.Context, split string) ([]json.RawMessage, error)
	// NumTasks and GetTask serve envs too large to list; GetTask is only
	// called with 0 <= index < NumTasks.
	NumTasks func(ctx context.Context, split string) (int, error)
	GetTask  func(ctx context.Context, split string, index int) (json.RawMessage, error)
	// Tools are shared: listed by /tools and /task_tools, callable in every
	// session.
	Tools []Tool
	// New builds the per-session instance. It runs asynchronously after
	// /create, before Setup; an error surfaces on the session's next
	// prompt, task_tools or call.
	New func(ctx context.Context, task json.RawMessage, secrets map[string]string) (Instance, error)
}

// Instance is one session's environment.
type Instance interface {
	Prompt(ctx context.Context) ([]ors.Block, error)
}

// SetupInstance runs asynchronously after construction; prompt, task_tools
// and call wait for it.
type SetupInstance interface {
	Setup(ctx context.Context) error
}

// TeardownInstance releases what Setup acquired; errors are logged.
type TeardownInstance interface {
	Teardown(ctx context.Context) error
}

// TaskToolsInstance adds task-scoped tools, listed by /task_tools after the
// shared ones and callable in that session only.
type TaskToolsInstance interface {
	TaskTools() []Tool
}

// Tool is one callable tool.
type Tool struct {
	Name        string
	Description string
	// InputSchema is a JSON Schema object; nil means the tool takes no
	// arguments and its input is ignored.
	InputSchema json.RawMessage
	// Call runs the tool. Return an *InputError for invalid input (reported
	// as ok:false); any other error becomes an SSE error event.
	Call func(ctx context.Context, inst Instance, input json.RawMessage) (ors.ToolOutput, error)
}

// Spec is the tool's wire description.
func (t Tool) Spec() ors.ToolSpec {
	return ors.ToolSpec{Name: t.Name, Description: t.Description, InputSchema: t.InputSchema}
}

// InputError reports tool input that failed validation; it becomes
// {"ok":false,"error":"Tool input validation error: ...","reason":"input_validation"}.
type InputError struct{ Detail string }

func (e *InputError) Error() string { return "Tool input validation error: " + e.Detail }

// HTTPError lets env code (New, Setup, Prompt) choose the status and detail
// the client sees; other errors become 500 with the error text.
type HTTPError struct {
	Status int
	Detail string
}

func (e *HTTPError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Status, e.Detail) }

// NewTool builds a tool whose input is decoded into the struct P; the input
// schema is derived from P (see SchemaFor), and input that does not match it
// is reported as a validation failure before fn runs.
func NewTool[I Instance, P any](name, description string, fn func(ctx context.Context, inst I, params P) (ors.ToolOutput, error)) Tool {
	schema, fields, err := schemaFor[P]()
	if err != nil {
		panic(fmt.Sprintf("orsserver.NewTool %q: %v", name, err)) // a declaration bug, found at start-up
	}
	return Tool{
		Name:        name,
		Description: description,
		InputSchema: schema,
		Call: func(ctx context.Context, inst Instance, input json.RawMessage) (ors.ToolOutput, error) {
			typed, ok := inst.(I)
			if !ok {
				return ors.ToolOutput{}, fmt.Errorf("tool %q: instance is %T", name, inst)
			}
			var params P
			if err := decodeParams(input, fields, &params); err != nil {
				return ors.ToolOutput{}, err
			}
			return fn(ctx, typed, params)
		},
	}
}

// NewToolNoInput builds a tool that takes no arguments (input_schema null).
func NewToolNoInput[I Instance](name, description string, fn func(ctx context.Context, inst I) (ors.ToolOutput, error)) Tool {
	return Tool{
		Name:        name,
		Description: description,
		Call: func(ctx context.Context, inst Instance, _ json.RawMessage) (ors.ToolOutput, error) {
			typed, ok := inst.(I)
			if !ok {
				return ors.ToolOutput{}, fmt.Errorf("tool %q: instance is %T", name, inst)
			}
			return fn(ctx, typed)
		},
	}
}

// validate checks an Env declaration as the reference server does at start-up.
func (e *Env) validate() error {
	switch {
	case e.Name == "":
		return errors.New("env has no Name")
	case len(e.Splits) == 0:
		return fmt.Errorf("env %q declares no splits", e.Name)
	case len(e.Tools) == 0:
		return fmt.Errorf("env %q declares no shared tools", e.Name)
	case e.New == nil:
		return fmt.Errorf("env %q has no New constructor", e.Name)
	case e.ListTasks == nil && (e.NumTasks == nil || e.GetTask == nil):
		return fmt.Errorf("env %q needs ListTasks, or NumTasks and GetTask", e.Name)
	}
	seen := map[string]bool{}
	for _, t := range e.Tools {
		if t.Name == "" || t.Call == nil {
			return fmt.Errorf("env %q: tool %q has no name or no Call", e.Name, t.Name)
		}
		if seen[t.Name] {
			return fmt.Errorf("env %q: tool %q declared twice", e.Name, t.Name)
		}
		seen[t.Name] = true
	}
	return nil
}

func errStatus(err error) (int, string) {
	var he *HTTPError
	if errors.As(err, &he) {
		return he.Status, he.Detail
	}
	return http.StatusInternalServerError, err.Error()
}
