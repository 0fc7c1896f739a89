package envmcp

import (
	"bytes"
	"encoding/json"
	"net/http"
)

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
	Data    any    `json:"data,omitempty"`
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
	// meta is params._meta when both are objects: where a 2026-07-28
	// request carries its protocol version.
	meta map[string]json.RawMessage
	// target is params.name (params.uri for resources/read), which the
	// Mcp-Name header mirrors on the methods that have one (hasTarget).
	target    string
	hasTarget bool
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
	msg.readParams()
	return msg, nil
}

// readParams fills meta and target from params when it is an object;
// anything else is left to the method's own params check.
func (m *rpcMessage) readParams() {
	var fields map[string]json.RawMessage
	if p := bytes.TrimSpace(m.params); len(p) == 0 || p[0] != '{' || json.Unmarshal(p, &fields) != nil {
		return
	}
	if raw := bytes.TrimSpace(fields["_meta"]); len(raw) > 0 && raw[0] == '{' {
		_ = json.Unmarshal(raw, &m.meta)
	}
	key := "name"
	switch m.method {
	case "tools/call", "prompts/get":
	case "resources/read":
		key = "uri"
	default:
		return
	}
	m.hasTarget = true
	_ = json.Unmarshal(fields[key], &m.target)
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

// replyID is the id an error answer carries: the request's, or null.
func (m *rpcMessage) replyID() json.RawMessage {
	if m.kind == kindRequest {
		return m.id
	}
	return json.RawMessage(nullID)
}
