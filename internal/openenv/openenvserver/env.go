// Package openenvserver serves OpenEnv environments written in Go, the
// mirror of orsserver: /health, /metadata, /schema, stateless /reset /step
// /state, /ws sessions, /mcp over HTTP (JSON-RPC, openenv/session/*) and
// over WebSocket, one capacity limit shared by every session kind,
// validation of actions against their declared fields, and idle reaping.
// The replies are those of the real openenv-core server
// (openenv-protocol.md §2).
//
// An environment is an *Env: its metadata, its action fields (Gym-style) or
// MCP flag, and a factory that builds one Instance per session. FromORS
// serves any orsserver.Env as an MCP env.
package openenvserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ortrain/ortrain/internal/openenv"
)

// Env declares one OpenEnv environment.
type Env struct {
	// Name is reported by /metadata (the env class name in Python).
	Name        string
	Description string
	Version     string // default "1.0.0"
	// MCP envs take list_tools/call_tool actions and their instances must
	// implement MCPInstance; other envs are Gym-style and implement
	// GymInstance.
	MCP bool
	// ActionName and Action declare a Gym-style env's action model: the
	// kit derives its JSON Schema and validates every action against it
	// (extra fields forbidden; an optional metadata object always allowed).
	ActionName string
	Action     []Field
	// ObservationSchema is reported by /schema (nil: an empty object schema).
	ObservationSchema json.RawMessage
	// StateSchema is reported by /schema (nil: the base State schema).
	StateSchema json.RawMessage
	// ResetKwargs lists the reset keys the env takes; others are dropped
	// silently, as Python filters kwargs against reset()'s signature. Nil
	// takes every key (a **kwargs signature).
	ResetKwargs []string
	// ConcurrentSessions must be true to serve more than one session at a
	// time (SUPPORTS_CONCURRENT_SESSIONS).
	ConcurrentSessions bool
	// New builds one session's instance; an error is a FACTORY_ERROR.
	New func(ctx context.Context) (Instance, error)
}

// Instance is one session's environment.
type Instance interface {
	// Reset starts an episode; an error is an EXECUTION_ERROR (500 on HTTP).
	Reset(ctx context.Context, kwargs map[string]json.RawMessage) (Observation, error)
	// State is the full episode state, a JSON object with at least
	// episode_id and step_count.
	State(ctx context.Context) (json.RawMessage, error)
}

// GymInstance takes typed actions, already validated against Env.Action.
type GymInstance interface {
	Instance
	Step(ctx context.Context, action json.RawMessage) (Observation, error)
}

// MCPInstance takes MCP tool calls. Both methods serve /ws steps and
// JSON-RPC alike.
type MCPInstance interface {
	Instance
	ListTools(ctx context.Context) ([]openenv.Tool, error)
	// CallTool returns a *ToolError for failures the caller should see as
	// an error observation (unknown tool, bad arguments); other errors
	// become execution_error observations.
	CallTool(ctx context.Context, name string, args json.RawMessage) (ToolOutput, error)
}

// ClosingInstance releases resources when its session ends.
type ClosingInstance interface {
	Close(ctx context.Context) error
}

// Observation is what reset and step return. Fields is the observation
// model's fields (marshalled to a JSON object; nil is {}); Reward and Done
// are lifted to the top level.
type Observation struct {
	Fields any
	Reward *float64
	Done   bool
}

// ToolOutput is a tool's return value: Value is its data (a string gives
// that text; an object gives its JSON as text and itself as structured
// content), Reward and Done become the step's.
type ToolOutput struct {
	Value  any
	Reward *float64
	Done   bool
}

// ToolError is a tool failure reported as an observation error
// ({"error_type","message"}) and as JSON-RPC -32603.
type ToolError struct {
	Type    string // openenv.ToolNotFound, ToolInvalidArgs, ...
	Message string
}

func (e *ToolError) Error() string { return e.Message }

// UnknownTool is the tool_not_found error for name.
func UnknownTool(name string) *ToolError {
	return &ToolError{Type: openenv.ToolNotFound, Message: fmt.Sprintf("Unknown tool: '%s'", name)}
}

// EpisodeID is the episode id a reset should use: the kwargs' episode_id,
// or a fresh uuid4 when it is absent, null or empty, as OpenEnv's own envs
// do (`episode_id or str(uuid4())`): clients tell episodes apart by it.
func EpisodeID(kwargs map[string]json.RawMessage) (string, error) {
	raw, ok := kwargs["episode_id"]
	if !ok || string(raw) == "null" {
		return newUUID(), nil
	}
	var id string
	if json.Unmarshal(raw, &id) != nil {
		return "", errors.New("episode_id must be a string")
	}
	if id == "" {
		return newUUID(), nil
	}
	return id, nil
}

// Reward returns a pointer to r.
func Reward(r float64) *float64 { return &r }

func (e *Env) validate(maxSessions int) error {
	switch {
	case e.Name == "":
		return errors.New("env has no Name")
	case e.New == nil:
		return fmt.Errorf("env %q has no New factory", e.Name)
	case !e.MCP && len(e.Action) == 0:
		return fmt.Errorf("env %q is Gym-style but declares no Action fields", e.Name)
	case maxSessions > 1 && !e.ConcurrentSessions:
		return fmt.Errorf("env %q does not support concurrent sessions; serve it with MaxSessions 1", e.Name)
	}
	seen := map[string]bool{}
	for _, f := range e.Action {
		if f.Name == "" || f.Name == "metadata" || seen[f.Name] {
			return fmt.Errorf("env %q: action field %q is empty, reserved or duplicated", e.Name, f.Name)
		}
		seen[f.Name] = true
	}
	return nil
}
