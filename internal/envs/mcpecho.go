package envs

import (
	"context"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/ortrain/ortrain/internal/openenv"
	"github.com/ortrain/ortrain/internal/openenv/openenvserver"
)

// MCPEchoEnvName is the mcp-echo env's OpenEnv name: OpenEnv's own echo
// env's class name.
const MCPEchoEnvName = "EchoEnvironment"

const echoMessageSchema = `{"additionalProperties":false,"properties":{"message":{"type":"string"}},"required":["message"],"type":"object"}`

var mcpEchoTools = []openenv.Tool{
	{Name: "echo_message", Description: "Echo back the provided message.", InputSchema: json.RawMessage(echoMessageSchema)},
	{Name: "echo_with_length", Description: "Echo back the provided message together with its length in characters.", InputSchema: json.RawMessage(echoMessageSchema)},
}

// mcpEcho is one session of the mcp-echo env.
type mcpEcho struct {
	episodeID *string
	steps     int
}

type echoState struct {
	EpisodeID *string `json:"episode_id"`
	StepCount int     `json:"step_count"`
}

func (e *mcpEcho) Reset(_ context.Context, kw map[string]json.RawMessage) (openenvserver.Observation, error) {
	id, err := openenvserver.EpisodeID(kw)
	if err != nil {
		return openenvserver.Observation{}, err
	}
	e.episodeID, e.steps = &id, 0
	return openenvserver.Observation{Reward: openenvserver.Reward(0)}, nil
}

func (e *mcpEcho) State(context.Context) (json.RawMessage, error) {
	return json.Marshal(echoState{EpisodeID: e.episodeID, StepCount: e.steps})
}

func (e *mcpEcho) ListTools(context.Context) ([]openenv.Tool, error) {
	e.steps++
	return mcpEchoTools, nil
}

func (e *mcpEcho) CallTool(_ context.Context, name string, args json.RawMessage) (openenvserver.ToolOutput, error) {
	e.steps++
	if name != "echo_message" && name != "echo_with_length" {
		return openenvserver.ToolOutput{}, openenvserver.UnknownTool(name)
	}
	var in map[string]json.RawMessage
	if err := json.Unmarshal(args, &in); err != nil || in == nil {
		return openenvserver.ToolOutput{}, invalidArgs(name, "arguments must be an object")
	}
	raw, ok := in["message"]
	if !ok {
		return openenvserver.ToolOutput{}, invalidArgs(name, "message: Missing required argument")
	}
	var msg string
	if json.Unmarshal(raw, &msg) != nil {
		return openenvserver.ToolOutput{}, invalidArgs(name, "message: Input should be a valid string")
	}
	for k := range in {
		if k != "message" {
			return openenvserver.ToolOutput{}, invalidArgs(name, k+": Unexpected keyword argument")
		}
	}
	if name == "echo_message" {
		return openenvserver.ToolOutput{Value: msg}, nil
	}
	return openenvserver.ToolOutput{Value: struct {
		Message string `json:"message"`
		Length  int    `json:"length"`
	}{msg, utf8.RuneCountInString(msg)}}, nil
}

func invalidArgs(tool, detail string) *openenvserver.ToolError {
	return &openenvserver.ToolError{Type: openenv.ToolInvalidArgs, Message: fmt.Sprintf("Invalid arguments for tool '%s': %s", tool, detail)}
}

// MCPEcho returns OpenEnv's echo env as an MCP env: tools echo_message and
// echo_with_length; every step, list_tools included, counts in step_count.
func MCPEcho() *openenvserver.Env {
	return &openenvserver.Env{
		Name: MCPEchoEnvName,
		// No Description: /metadata then says "EchoEnvironment environment",
		// as the Python echo env does.
		MCP:                true,
		ResetKwargs:        []string{"seed", "episode_id"},
		ConcurrentSessions: true,
		New: func(context.Context) (openenvserver.Instance, error) {
			return &mcpEcho{}, nil
		},
	}
}
