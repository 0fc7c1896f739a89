package openenvserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ortrain/ortrain/internal/openenv"
)

// rpcErr builds a JSON-RPC error (data always present, null by default).
func rpcErr(code int, msg string, data any) *openenv.RPCError {
	e := &openenv.RPCError{Code: code, Message: msg, Data: json.RawMessage("null")}
	if data != nil {
		e.Data = mustMarshal(data)
	}
	return e
}

func capacityRPC(ce *capacityError) *openenv.RPCError {
	return rpcErr(openenv.RPCCapacity, ce.Error(), map[string]int{"active_sessions": ce.active, "max_sessions": ce.max})
}

// rpcCall is the transport a JSON-RPC request came on.
type rpcCall struct {
	own    *session // the socket's own session; nil on HTTP
	parseF func(body []byte, err error, rest int) string
}

// handleRPC answers one JSON-RPC request body.
func (s *Server) handleRPC(ctx context.Context, body []byte, call rpcCall) openenv.RPCResponse {
	reply := openenv.RPCResponse{JSONRPC: "2.0", ID: json.RawMessage("null")}
	var v any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	err := dec.Decode(&v)
	if rest := skipSpace(body, int(dec.InputOffset())); err != nil || rest < len(body) {
		reply.Error = rpcErr(openenv.RPCParseError, call.parseF(body, err, rest), nil)
		return reply
	}
	var req map[string]json.RawMessage
	if json.Unmarshal(body, &req) != nil || req == nil {
		reply.Error = rpcErr(openenv.RPCInvalidRequest, "Invalid Request", nil)
		return reply
	}
	var version, method string
	validID := true
	if id, ok := req["id"]; ok {
		switch firstByte(id) {
		case '"', 'n', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			validID = !bytes.ContainsAny(id, ".eE") || firstByte(id) == '"'
		default:
			validID = false
		}
	}
	params := map[string]json.RawMessage{}
	invalid := json.Unmarshal(req["jsonrpc"], &version) != nil || version != "2.0" ||
		json.Unmarshal(req["method"], &method) != nil || !validID
	if p, ok := req["params"]; ok && (firstByte(p) != '{' || json.Unmarshal(p, &params) != nil) {
		invalid = true
	}
	for k := range req {
		switch k {
		case "jsonrpc", "id", "method", "params":
		default:
			invalid = true
		}
	}
	if invalid {
		reply.Error = rpcErr(openenv.RPCInvalidRequest, "Invalid Request", nil)
		return reply
	}
	if id, ok := req["id"]; ok {
		reply.ID = id
	}
	res, rerr := s.dispatchRPC(ctx, method, params, call)
	if rerr != nil {
		reply.Error = rerr
		return reply
	}
	reply.Result = res
	return reply
}

func (s *Server) dispatchRPC(ctx context.Context, method string, params map[string]json.RawMessage, call rpcCall) (json.RawMessage, *openenv.RPCError) {
	var sid string
	if raw, ok := params["session_id"]; ok {
		if json.Unmarshal(raw, &sid) != nil {
			return nil, rpcErr(openenv.RPCInvalidParams, "session_id must be a string", nil)
		}
	}
	switch method {
	case "openenv/session/create":
		if call.own != nil {
			return mustMarshal(map[string]string{"session_id": call.own.id}), nil
		}
		sess, err := s.openSession(ctx, "http", nil)
		var ce *capacityError
		if errors.As(err, &ce) {
			return nil, capacityRPC(ce)
		}
		if err != nil {
			return nil, rpcErr(openenv.RPCInternalError, err.Error(), nil)
		}
		return mustMarshal(map[string]string{"session_id": sess.id}), nil
	case "openenv/session/close":
		if sid == "" {
			return nil, rpcErr(openenv.RPCInvalidParams, "Missing required parameter: session_id", nil)
		}
		if call.own != nil && sid == call.own.id {
			return nil, rpcErr(openenv.RPCInvalidRequest, "Cannot close the session of this WebSocket; close the socket instead", nil)
		}
		sess := s.lookup(sid)
		if sess == nil || sess.kind != "http" {
			return nil, rpcErr(openenv.RPCInvalidParams, "Session not found: "+sid, nil)
		}
		s.endSession(sess, "closed by client")
		return mustMarshal(map[string]any{"session_id": sid, "closed": true}), nil
	case "tools/list", "tools/call":
	default:
		return nil, rpcErr(openenv.RPCMethodNotFound, "Method not found: "+method, nil)
	}
	if !s.env.MCP {
		return nil, rpcErr(openenv.RPCInternalError, "Environment does not support MCP", nil)
	}
	var name string
	var args json.RawMessage
	if method == "tools/call" {
		if json.Unmarshal(params["name"], &name) != nil || name == "" {
			return nil, rpcErr(openenv.RPCInvalidParams, "Missing required parameter: name", nil)
		}
		args = params["arguments"]
		if len(args) == 0 || string(args) == "null" {
			args = json.RawMessage(`{}`)
		}
	}
	sess := call.own
	if sid != "" {
		if sess = s.lookup(sid); sess == nil {
			return nil, rpcErr(openenv.RPCInvalidParams, "Session not found: "+sid, nil)
		}
	}
	if sess == nil {
		// A stateless call: a fresh instance for this request alone.
		inst, err := s.newInstance(ctx)
		if err != nil {
			return nil, rpcErr(openenv.RPCInternalError, err.Error(), nil)
		}
		defer s.closeInstance(inst)
		sess = &session{inst: inst}
	}
	defer sess.begin()()
	mcp, ok := sess.inst.(MCPInstance)
	if !ok {
		return nil, rpcErr(openenv.RPCInternalError, "Environment does not support MCP", nil)
	}
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if method == "tools/list" {
		tools, err := safely(func() ([]openenv.Tool, error) { return mcp.ListTools(ctx) })
		if err != nil {
			return nil, rpcErr(openenv.RPCInternalError, err.Error(), nil)
		}
		dumps := make([]sdkTool, len(tools))
		for i, t := range tools {
			dumps[i] = sdkTool{Name: t.Name, Description: t.Description, InputSchema: t.InputSchema,
				Meta: json.RawMessage(`{"fastmcp":{"tags":[]}}`)}
		}
		return mustMarshal(map[string]any{"tools": dumps}), nil
	}
	out, err := safely(func() (ToolOutput, error) { return mcp.CallTool(ctx, name, args) })
	if err != nil {
		return nil, rpcErr(openenv.RPCInternalError, err.Error(), nil)
	}
	res, err := toolResult(out.Value)
	if err != nil {
		return nil, rpcErr(openenv.RPCInternalError, err.Error(), nil)
	}
	return mustMarshal(res), nil
}

// sdkTool is the MCP SDK's Tool dump that JSON-RPC tools/list returns.
type sdkTool struct {
	Name         string          `json:"name"`
	Title        *string         `json:"title"`
	Description  string          `json:"description"`
	InputSchema  json.RawMessage `json:"inputSchema"`
	OutputSchema json.RawMessage `json:"outputSchema"`
	Icons        json.RawMessage `json:"icons"`
	Annotations  json.RawMessage `json:"annotations"`
	Meta         json.RawMessage `json:"meta"`
	Execution    json.RawMessage `json:"execution"`
}

func httpParseError([]byte, error, int) string { return "Parse error" }

// wsParseError words the /mcp socket's parse error like Python's json;
// rest is where extra data starts when the value itself decoded.
func wsParseError(body []byte, err error, rest int) string {
	if err == nil {
		return "Parse error: " + pyPos("Extra data", body, rest)
	}
	return fmt.Sprintf("Parse error: %s", pyJSONError(body, err))
}
