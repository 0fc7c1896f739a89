package openenv

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Frame types of the /ws session protocol.
const (
	FrameReset       = "reset"
	FrameStep        = "step"
	FrameState       = "state"
	FrameClose       = "close"
	FrameMCP         = "mcp"
	FrameObservation = "observation"
	FrameError       = "error"
)

// ErrorCode is the code of a {"type":"error"} frame.
type ErrorCode string

// The error codes of §2.
const (
	CodeInvalidJSON     ErrorCode = "INVALID_JSON"
	CodeUnknownType     ErrorCode = "UNKNOWN_TYPE"
	CodeValidationError ErrorCode = "VALIDATION_ERROR"
	CodeExecutionError  ErrorCode = "EXECUTION_ERROR"
	CodeCapacityReached ErrorCode = "CAPACITY_REACHED"
	CodeFactoryError    ErrorCode = "FACTORY_ERROR"
	CodeSessionError    ErrorCode = "SESSION_ERROR"
)

// EndsSession reports whether the server closes the socket after sending
// this code. Unknown codes are treated as fatal: nothing says the socket
// survives them.
func (c ErrorCode) EndsSession() bool {
	switch c {
	case CodeInvalidJSON, CodeUnknownType, CodeValidationError, CodeExecutionError:
		return false
	}
	return true
}

// JSON-RPC error codes the OpenEnv server uses.
const (
	RPCParseError     = -32700
	RPCInvalidRequest = -32600
	RPCMethodNotFound = -32601
	RPCInvalidParams  = -32602
	RPCInternalError  = -32603
	RPCCapacity       = -32000
)

// Frame is one server→client /ws frame: its type and raw data.
type Frame struct {
	Type string          `json:"type"`
	Data json.RawMessage `json:"data,omitempty"`
}

// StepResult is the data of an observation frame, and the body of HTTP
// /reset and /step: the observation (minus reward, done and metadata), and
// the lifted reward (nil when the env gave none) and done.
type StepResult struct {
	Observation json.RawMessage `json:"observation"`
	Reward      *float64        `json:"reward"`
	Done        bool            `json:"done"`
}

// ValidationIssue is one pydantic error of a VALIDATION_ERROR frame or of a
// 422 reply's detail list.
type ValidationIssue struct {
	Type  string          `json:"type"`
	Loc   []any           `json:"loc"`
	Msg   string          `json:"msg"`
	Input json.RawMessage `json:"input"`
	Ctx   json.RawMessage `json:"ctx,omitempty"`
	URL   string          `json:"url,omitempty"`
}

// String renders the issue as one line ("guess: Input should be ...").
func (v ValidationIssue) String() string {
	loc := make([]string, len(v.Loc))
	for i, l := range v.Loc {
		loc[i] = fmt.Sprint(l)
	}
	if len(loc) == 0 {
		return v.Msg
	}
	return strings.Join(loc, ".") + ": " + v.Msg
}

// Tool is one MCP tool as /ws list_tools gives it ({name, description,
// input_schema}); it also decodes the MCP SDK's camelCase inputSchema from
// JSON-RPC tools/list.
type Tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// UnmarshalJSON accepts input_schema and inputSchema.
func (t *Tool) UnmarshalJSON(b []byte) error {
	var w struct {
		Name        string          `json:"name"`
		Description *string         `json:"description"`
		InputSchema json.RawMessage `json:"input_schema"`
		Camel       json.RawMessage `json:"inputSchema"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	t.Name = w.Name
	t.Description = ""
	if w.Description != nil {
		t.Description = *w.Description
	}
	t.InputSchema = w.InputSchema
	if len(t.InputSchema) == 0 {
		t.InputSchema = w.Camel
	}
	return nil
}

// ContentBlock is one item of an MCP tool result's content.
type ContentBlock struct {
	Type        string          `json:"type"`
	Text        string          `json:"text"`
	Annotations json.RawMessage `json:"annotations"`
	Meta        json.RawMessage `json:"meta"`
}

// ToolResult is FastMCP's CallToolResult as OpenEnv sends it (snake_case).
// Clients read Data.
type ToolResult struct {
	Content           []ContentBlock  `json:"content"`
	StructuredContent json.RawMessage `json:"structured_content"`
	Meta              json.RawMessage `json:"meta"`
	Data              json.RawMessage `json:"data"`
	IsError           bool            `json:"is_error"`
}

// Text joins the text content blocks.
func (r *ToolResult) Text() string {
	var parts []string
	for _, c := range r.Content {
		if c.Type == "text" {
			parts = append(parts, c.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// Tool failure types of a call_tool observation's error.
const (
	ToolNotFound       = "tool_not_found"
	ToolInvalidArgs    = "invalid_args"
	ToolExecutionError = "execution_error"
	ToolTimeout        = "timeout"
	ToolTransportError = "transport_error"
)

// ToolFailure is the error of a call_tool observation: a tool failure is an
// observation, not an error frame.
type ToolFailure struct {
	Type    string `json:"error_type"`
	Message string `json:"message"`
}

// ToolCall is the outcome of a call_tool step: the observation
// {tool_name, result, error} plus the step's reward and done.
type ToolCall struct {
	ToolName string       `json:"tool_name"`
	Result   *ToolResult  `json:"result"`
	Error    *ToolFailure `json:"error"`
	Reward   *float64     `json:"-"`
	Done     bool         `json:"-"`
}

// Text is what a model should read: the result's text, or the failure in
// the words of the reference client ("Tool 'x' failed: msg (type: t)").
func (c *ToolCall) Text() string {
	if c.Error != nil {
		return fmt.Sprintf("Tool '%s' failed: %s (type: %s)", c.ToolName, c.Error.Message, c.Error.Type)
	}
	if c.Result == nil {
		return ""
	}
	return c.Result.Text()
}

// RPCRequest is a JSON-RPC 2.0 request as OpenEnv takes it.
type RPCRequest struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params,omitempty"`
}

// RPCResponse is a JSON-RPC 2.0 reply: exactly one of Result and Error.
type RPCResponse struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *RPCError       `json:"error,omitempty"`
}

// ParseFrame decodes one server→client /ws frame. An error frame comes back
// as a *ServerError (with the frame itself); a frame that is not a JSON
// object with a known type is a *ProtocolError.
func ParseFrame(b []byte) (Frame, error) {
	var f Frame
	trimmed := bytes.TrimSpace(b)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return Frame{}, &ProtocolError{Detail: "frame is not a JSON object", Frame: clip(b)}
	}
	if err := json.Unmarshal(trimmed, &f); err != nil {
		return Frame{}, &ProtocolError{Detail: "frame is not valid JSON: " + err.Error(), Frame: clip(b)}
	}
	switch f.Type {
	case FrameObservation, FrameState, FrameMCP:
		if len(f.Data) == 0 || string(f.Data) == "null" {
			return Frame{}, &ProtocolError{Detail: fmt.Sprintf("%s frame has no data", f.Type), Frame: clip(b)}
		}
		return f, nil
	case FrameError:
		return f, parseErrorData(f.Data, b)
	}
	return Frame{}, &ProtocolError{Detail: fmt.Sprintf("unknown frame type %q", f.Type), Frame: clip(b)}
}

func parseErrorData(data json.RawMessage, frame []byte) error {
	var d struct {
		Message        string            `json:"message"`
		Code           ErrorCode         `json:"code"`
		Errors         []ValidationIssue `json:"errors"`
		ActiveSessions int               `json:"active_sessions"`
		MaxSessions    int               `json:"max_sessions"`
		FactoryName    string            `json:"factory_name"`
	}
	if err := json.Unmarshal(data, &d); err != nil || d.Code == "" {
		return &ProtocolError{Detail: "error frame without a code", Frame: clip(frame)}
	}
	return &ServerError{Code: d.Code, Message: d.Message, Errors: d.Errors,
		ActiveSessions: d.ActiveSessions, MaxSessions: d.MaxSessions, FactoryName: d.FactoryName}
}

// decodeStep decodes an observation frame's data.
func decodeStep(data json.RawMessage) (StepResult, error) {
	var r StepResult
	if err := json.Unmarshal(data, &r); err != nil {
		return StepResult{}, &ProtocolError{Detail: "observation data: " + err.Error(), Frame: clip(data)}
	}
	if len(r.Observation) == 0 || r.Observation[0] != '{' {
		return StepResult{}, &ProtocolError{Detail: "observation is not an object", Frame: clip(data)}
	}
	return r, nil
}

func clip(b []byte) string {
	const max = 512
	if len(b) > max {
		return string(b[:max]) + "…"
	}
	return string(b)
}
