package envmcp

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"

	"github.com/ortrain/ortrain/internal/envtarget"
)

// The MCP revisions this server speaks. 2025-06-18 removed JSON-RPC
// batching; 2025-03-26 introduced streamable HTTP. Batches are refused for
// both: no SDK sends them, and one message per POST keeps each answer one
// JSON body.
const (
	latestVersion = "2025-06-18"
	oldestVersion = "2025-03-26"
)

func supportedVersion(v string) bool { return v == latestVersion || v == oldestVersion }

// negotiateVersion answers the client's version when this server speaks it,
// else the latest it does (the client then decides whether to go on).
func negotiateVersion(client string) string {
	if supportedVersion(client) {
		return client
	}
	return latestVersion
}

// JSON-RPC 2.0 error codes.
const (
	codeParseError     = -32700
	codeInvalidRequest = -32600
	codeMethodNotFound = -32601
	codeInvalidParams  = -32602
	codeInternalError  = -32603
	// codeServerError is the implementation-defined code of the bodies
	// sent with HTTP errors (401, 404, 413, ...).
	codeServerError = -32000
)

// rpcError is a JSON-RPC error object.
type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *rpcError) Error() string { return e.Message }

type rpcResponse struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  any             `json:"result,omitempty"`
	Error   *rpcError       `json:"error,omitempty"`
}

// nullID answers a message whose id could not be read.
const nullID = "null"

type messageKind int

const (
	kindRequest      messageKind = iota
	kindNotification             // no id: no answer expected
	kindResponse                 // the client answering a server request
)

// rpcMessage is one JSON-RPC message as the client sent it.
type rpcMessage struct {
	kind   messageKind
	id     json.RawMessage // requests only
	method string
	params json.RawMessage // nil when absent
}

// parseMessage reads one JSON-RPC 2.0 message. Its error is the JSON-RPC
// error to send back with a null id.
func parseMessage(body []byte) (*rpcMessage, *rpcError) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 || !json.Valid(body) {
		return nil, &rpcError{Code: codeParseError, Message: "Parse error: the body is not one JSON value"}
	}
	switch body[0] {
	case '[':
		return nil, &rpcError{Code: codeInvalidRequest, Message: "Invalid Request: JSON-RPC batches are not supported (MCP 2025-06-18 removed them); send one message per POST"}
	case '{':
	default:
		return nil, &rpcError{Code: codeInvalidRequest, Message: "Invalid Request: a message must be a JSON object"}
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return nil, &rpcError{Code: codeInvalidRequest, Message: "Invalid Request: " + err.Error()}
	}
	var version string
	if json.Unmarshal(fields["jsonrpc"], &version) != nil || version != "2.0" {
		return nil, &rpcError{Code: codeInvalidRequest, Message: `Invalid Request: "jsonrpc" must be "2.0"`}
	}
	rawMethod, hasMethod := fields["method"]
	if !hasMethod {
		_, hasResult := fields["result"]
		_, hasError := fields["error"]
		if hasResult || hasError {
			return &rpcMessage{kind: kindResponse}, nil
		}
		return nil, &rpcError{Code: codeInvalidRequest, Message: `Invalid Request: no "method"`}
	}
	msg := &rpcMessage{kind: kindNotification, params: fields["params"]}
	if json.Unmarshal(rawMethod, &msg.method) != nil || msg.method == "" {
		return nil, &rpcError{Code: codeInvalidRequest, Message: `Invalid Request: "method" must be a non-empty string`}
	}
	if id, ok := fields["id"]; ok {
		// MCP ids are strings or numbers, never null.
		switch id[0] {
		case '"', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		default:
			return nil, &rpcError{Code: codeInvalidRequest, Message: `Invalid Request: "id" must be a string or a number`}
		}
		msg.kind, msg.id = kindRequest, id
	}
	return msg, nil
}

// decodeParams reads a request's params object into v (absent or null
// params leave v as it is).
func decodeParams(raw json.RawMessage, v any) *rpcError {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if raw[0] != '{' {
		return &rpcError{Code: codeInvalidParams, Message: "Invalid params: params must be an object"}
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return &rpcError{Code: codeInvalidParams, Message: "Invalid params: " + err.Error()}
	}
	return nil
}

// writeRPC sends one JSON-RPC response. A JSON body is allowed even when
// the client also accepts text/event-stream.
func writeRPC(w http.ResponseWriter, status int, reply rpcResponse) {
	body, err := json.Marshal(reply)
	if err != nil {
		// Results are built from strings and raw JSON the env gave;
		// an unencodable one is a bug, reported as such.
		body, _ = json.Marshal(rpcResponse{JSONRPC: "2.0", ID: reply.ID, Error: &rpcError{Code: codeInternalError, Message: "encode result: " + err.Error()}})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// writeHTTPError sends an HTTP error with a JSON-RPC error body (null id),
// which MCP SDKs show to the user.
func writeHTTPError(w http.ResponseWriter, status int, msg string) {
	writeRPC(w, status, rpcResponse{JSONRPC: "2.0", ID: json.RawMessage(nullID), Error: &rpcError{Code: codeServerError, Message: msg}})
}

type initializeParams struct {
	ProtocolVersion string `json:"protocolVersion"`
}

type initializeResult struct {
	ProtocolVersion string             `json:"protocolVersion"`
	Capabilities    serverCapabilities `json:"capabilities"`
	ServerInfo      implementation     `json:"serverInfo"`
}

type serverCapabilities struct {
	Tools toolsCapability `json:"tools"`
}

// toolsCapability: the tool list is fixed for an episode.
type toolsCapability struct {
	ListChanged bool `json:"listChanged"`
}

type implementation struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// initialize opens an MCP session on the episode and answers with its id in
// the Mcp-Session-Id header.
func (s *Server) initialize(w http.ResponseWriter, ep *Episode, msg *rpcMessage) {
	var p initializeParams
	if rerr := decodeParams(msg.params, &p); rerr != nil {
		writeRPC(w, http.StatusOK, rpcResponse{JSONRPC: "2.0", ID: msg.id, Error: rerr})
		return
	}
	version := negotiateVersion(p.ProtocolVersion)
	sid, err := ep.openMCPSession(version)
	if err != nil {
		s.log.Warn().Err(err).Str("rollout", ep.id).Msg("mcp initialize failed")
		writeRPC(w, http.StatusOK, rpcResponse{JSONRPC: "2.0", ID: msg.id, Error: &rpcError{Code: codeInternalError, Message: err.Error()}})
		return
	}
	s.log.Debug().Str("rollout", ep.id).Str("client_version", p.ProtocolVersion).Str("version", version).Msg("mcp session opened")
	w.Header().Set(headerSessionID, sid)
	writeRPC(w, http.StatusOK, rpcResponse{JSONRPC: "2.0", ID: msg.id, Result: initializeResult{
		ProtocolVersion: version,
		Capabilities:    serverCapabilities{Tools: toolsCapability{ListChanged: false}},
		ServerInfo:      implementation{Name: "ortrain", Version: s.opts.Version},
	}})
}

// dispatch answers one request of an established MCP session.
func (s *Server) dispatch(ctx context.Context, ep *Episode, msg *rpcMessage) (any, *rpcError) {
	switch msg.method {
	case "ping":
		return struct{}{}, nil
	case "tools/list":
		return toolsListResult{Tools: ep.tools}, nil
	case "tools/call":
		return s.callTool(ctx, ep, msg.params)
	case "initialize":
		return nil, &rpcError{Code: codeInvalidRequest, Message: "Invalid Request: initialize must be a request with an id"}
	}
	return nil, &rpcError{Code: codeMethodNotFound, Message: "Method not found: " + msg.method}
}

// mcpTool is a tool as tools/list shows it.
type mcpTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"inputSchema"`
}

type toolsListResult struct {
	Tools []mcpTool `json:"tools"`
}

// emptyObjectSchema is the inputSchema of a tool that takes no arguments:
// MCP requires an object schema on every tool.
const emptyObjectSchema = `{"type":"object"}`

func mcpTools(specs []envtarget.ToolSpec) []mcpTool {
	out := make([]mcpTool, len(specs))
	for i, spec := range specs {
		schema := bytes.TrimSpace(spec.InputSchema)
		if len(schema) == 0 || string(schema) == "null" {
			schema = []byte(emptyObjectSchema)
		}
		out[i] = mcpTool{Name: spec.Name, Description: spec.Description, InputSchema: append(json.RawMessage(nil), schema...)}
	}
	return out
}

type callParams struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

type callResult struct {
	Content []textContent `json:"content"`
	IsError bool          `json:"isError"`
}

type textContent struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// callTool forwards tools/call to the env session. A tool name the episode
// did not list still goes to the env, as the rollout runner does: the env
// decides, its answer (a tool error) reaches the model as isError so it can
// correct itself, and the record matches a trainer-driven rollout's.
// JSON-RPC errors are kept for malformed calls and infrastructure failures,
// which many agent frameworks raise instead of showing to the model.
func (s *Server) callTool(ctx context.Context, ep *Episode, raw json.RawMessage) (any, *rpcError) {
	var p callParams
	if rerr := decodeParams(raw, &p); rerr != nil {
		return nil, rerr
	}
	if p.Name == "" {
		return nil, &rpcError{Code: codeInvalidParams, Message: `Invalid params: "name" is required`}
	}
	args := bytes.TrimSpace(p.Arguments)
	switch {
	case len(args) == 0 || string(args) == "null":
		args = []byte("{}")
	case args[0] != '{':
		return nil, &rpcError{Code: codeInvalidParams, Message: `Invalid params: "arguments" must be an object`}
	}
	call := ep.call(ctx, p.Name, append(json.RawMessage(nil), args...))
	if call.infraErr != nil {
		return nil, &rpcError{Code: codeInternalError, Message: "tool call failed: " + call.infraErr.Error()}
	}
	text := call.record.Result
	if call.record.IsError {
		text = call.record.Err
	}
	return callResult{Content: []textContent{{Type: "text", Text: text}}, IsError: call.record.IsError}, nil
}
