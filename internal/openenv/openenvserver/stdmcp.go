package openenvserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"

	"github.com/ortrain/ortrain/internal/openenv"
)

// The standard MCP lifecycle on POST /mcp, beside OpenEnv's own JSON-RPC.
//
// OpenEnv's /mcp is not the standard transport: no initialize, no
// Mcp-Session-Id, snake_case results, HTTP 200 always. OpenEnv's client
// sends none of the standard headers and none of the lifecycle methods, so
// a POST that has them is a standard MCP client's and is served as the
// streamable HTTP transport of MCP 2024-11-05..2025-11-25 specifies:
// initialize opens a session (one env instance, sharing the server's
// capacity) named by Mcp-Session-Id, DELETE ends it, results are MCP's
// camelCase shapes, tool failures are isError results.
//
// MCP 2026-07-28 is stateless, and an env episode is not: server/discover
// advertises only the initialize revisions (as the Go SDK's stateful server
// does), which makes the 2026 SDK clients fall back to initialize, and any
// other request claiming a 2026 version gets -32022 naming them.

const (
	hdrSessionID       = "Mcp-Session-Id"
	hdrProtocolVersion = "Mcp-Protocol-Version"
	metaVersionKey     = "io.modelcontextprotocol/protocolVersion"
	metaServerInfoKey  = "io.modelcontextprotocol/serverInfo"
	// codeUnsupportedVersion is MCP's UnsupportedProtocolVersion error.
	codeUnsupportedVersion = -32022
)

// mcpVersions are the initialize revisions served, newest first.
func mcpVersions() []string { return []string{"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"} }

func servesVersion(v string) bool {
	for _, x := range mcpVersions() {
		if x == v {
			return true
		}
	}
	return false
}

// stdRequest is one standard JSON-RPC message.
type stdRequest struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  *string         `json:"method"`
	Params  json.RawMessage `json:"params"`
	Result  json.RawMessage `json:"result"`
	Error   json.RawMessage `json:"error"`
}

type stdReply struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  any             `json:"result,omitempty"`
	Error   *stdError       `json:"error,omitempty"`
}

type stdError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

// isStandardMCP tells a standard MCP client's POST from OpenEnv's own
// JSON-RPC by what only the former sends.
func isStandardMCP(r *http.Request, body []byte) bool {
	if r.Header.Get(hdrSessionID) != "" || r.Header.Get(hdrProtocolVersion) != "" {
		return true
	}
	var head struct {
		Method string `json:"method"`
		Params struct {
			Meta map[string]json.RawMessage `json:"_meta"`
		} `json:"params"`
	}
	if json.Unmarshal(body, &head) != nil {
		return false
	}
	switch {
	case head.Method == "initialize", head.Method == "ping", head.Method == "server/discover",
		strings.HasPrefix(head.Method, "notifications/"):
		return true
	}
	_, claimed := head.Params.Meta[metaVersionKey]
	return claimed
}

func unsupportedMCPVersion(requested string) *stdError {
	return &stdError{Code: codeUnsupportedVersion,
		Message: fmt.Sprintf("Unsupported protocol version %q: this server speaks %s (initialize first)", requested, strings.Join(mcpVersions(), ", ")),
		Data:    map[string]any{"supported": mcpVersions(), "requested": requested}}
}

// serveStandardMCP answers one standard MCP POST.
func (s *Server) serveStandardMCP(w http.ResponseWriter, r *http.Request, body []byte) {
	reply := stdReply{JSONRPC: "2.0", ID: json.RawMessage("null")}
	fail := func(status int, e *stdError) {
		reply.Error = e
		writeJSON(w, status, reply)
	}
	var req stdRequest
	switch {
	case !json.Valid(body):
		fail(http.StatusBadRequest, &stdError{Code: openenv.RPCParseError, Message: "Parse error"})
		return
	case firstByte(body) != '{' || json.Unmarshal(body, &req) != nil || req.JSONRPC != "2.0":
		fail(http.StatusBadRequest, &stdError{Code: openenv.RPCInvalidRequest, Message: "Invalid Request: one JSON-RPC 2.0 message object per POST"})
		return
	case req.Method == nil:
		if req.Result != nil || req.Error != nil {
			w.WriteHeader(http.StatusAccepted) // a response to no request of ours
			return
		}
		fail(http.StatusBadRequest, &stdError{Code: openenv.RPCInvalidRequest, Message: `Invalid Request: no "method"`})
		return
	}
	method := *req.Method
	if req.ID == nil {
		// notifications/initialized, cancelled, ...: nothing to answer.
		w.WriteHeader(http.StatusAccepted)
		return
	}
	switch firstByte(req.ID) {
	case '"', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		reply.ID = req.ID
	default:
		fail(http.StatusBadRequest, &stdError{Code: openenv.RPCInvalidRequest, Message: `Invalid Request: "id" must be a string or a number`})
		return
	}
	params := map[string]json.RawMessage{}
	if p := bytes.TrimSpace(req.Params); len(p) > 0 && string(p) != "null" {
		if p[0] != '{' || json.Unmarshal(p, &params) != nil {
			fail(http.StatusOK, &stdError{Code: openenv.RPCInvalidParams, Message: "Invalid params: params must be an object"})
			return
		}
	}
	if method == "server/discover" {
		writeJSON(w, http.StatusOK, stdReply{JSONRPC: "2.0", ID: reply.ID, Result: s.discoverResult()})
		return
	}
	var meta map[string]json.RawMessage
	_ = json.Unmarshal(params["_meta"], &meta)
	if raw, ok := meta[metaVersionKey]; ok {
		var claim string
		_ = json.Unmarshal(raw, &claim)
		fail(http.StatusBadRequest, unsupportedMCPVersion(claim))
		return
	}
	if method == "initialize" {
		s.stdInitialize(w, r, reply.ID, params)
		return
	}
	if v := r.Header.Get(hdrProtocolVersion); v != "" && !servesVersion(v) {
		fail(http.StatusBadRequest, unsupportedMCPVersion(v))
		return
	}
	var sess *session
	if sid := r.Header.Get(hdrSessionID); sid != "" {
		if sess = s.lookup(sid); sess == nil || sess.kind != "http" {
			// The spec's answer to an ended session: initialize again.
			fail(http.StatusNotFound, &stdError{Code: -32001, Message: "Session not found: it ended or was reaped; initialize again"})
			return
		}
	}
	res, rerr := s.stdDispatch(r.Context(), method, params, sess)
	if rerr != nil {
		fail(http.StatusOK, rerr)
		return
	}
	reply.Result = res
	writeJSON(w, http.StatusOK, reply)
}

// stdInitialize opens a session for the client: the env instance its tool
// calls share, until DELETE, openenv/session/close or the idle reaper.
func (s *Server) stdInitialize(w http.ResponseWriter, r *http.Request, id json.RawMessage, params map[string]json.RawMessage) {
	var client string
	_ = json.Unmarshal(params["protocolVersion"], &client)
	version := mcpVersions()[0]
	if servesVersion(client) {
		version = client
	}
	sess, err := s.openSession(r.Context(), "http", nil)
	if err != nil {
		reply := stdReply{JSONRPC: "2.0", ID: id, Error: &stdError{Code: openenv.RPCInternalError, Message: err.Error()}}
		var ce *capacityError
		if errors.As(err, &ce) {
			reply.Error = &stdError{Code: openenv.RPCCapacity, Message: ce.Error(), Data: map[string]int{"active_sessions": ce.active, "max_sessions": ce.max}}
		}
		writeJSON(w, http.StatusOK, reply)
		return
	}
	s.log.Debug().Str("session", sess.id).Str("client_version", client).Str("version", version).Msg("mcp session opened")
	w.Header().Set(hdrSessionID, sess.id)
	writeJSON(w, http.StatusOK, stdReply{JSONRPC: "2.0", ID: id, Result: map[string]any{
		"protocolVersion": version,
		"capabilities":    s.mcpCapabilities(),
		"serverInfo":      s.mcpServerInfo(),
	}})
}

func (s *Server) mcpCapabilities() map[string]any {
	if !s.env.MCP {
		return map[string]any{}
	}
	return map[string]any{"tools": map[string]bool{"listChanged": false}}
}

func (s *Server) mcpServerInfo() map[string]string {
	version := s.env.Version
	if version == "" {
		version = "1.0.0"
	}
	return map[string]string{"name": s.env.Name, "version": version}
}

// discoverResult answers MCP 2026-07-28's server/discover with the
// initialize revisions only: clients then fall back to initialize.
func (s *Server) discoverResult() map[string]any {
	return map[string]any{
		"resultType":        "complete",
		"supportedVersions": mcpVersions(),
		"capabilities":      s.mcpCapabilities(),
		"_meta":             map[string]any{metaServerInfoKey: s.mcpServerInfo()},
		"ttlMs":             0,
		"cacheScope":        "private",
	}
}

// stdDispatch answers a request of a session (sess) or, without one, on a
// fresh instance for this request alone, as OpenEnv's stateless calls do.
func (s *Server) stdDispatch(ctx context.Context, method string, params map[string]json.RawMessage, sess *session) (any, *stdError) {
	switch method {
	case "ping":
		return struct{}{}, nil
	case "tools/list", "tools/call":
	default:
		return nil, &stdError{Code: openenv.RPCMethodNotFound, Message: "Method not found: " + method}
	}
	if !s.env.MCP {
		return nil, &stdError{Code: openenv.RPCMethodNotFound, Message: "Method not found: " + method + " (this environment has no MCP tools)"}
	}
	var name string
	args := params["arguments"]
	if method == "tools/call" {
		if json.Unmarshal(params["name"], &name) != nil || name == "" {
			return nil, &stdError{Code: openenv.RPCInvalidParams, Message: `Invalid params: "name" is required`}
		}
		if a := bytes.TrimSpace(args); len(a) == 0 || string(a) == "null" {
			args = json.RawMessage(`{}`)
		} else if a[0] != '{' {
			return nil, &stdError{Code: openenv.RPCInvalidParams, Message: `Invalid params: "arguments" must be an object`}
		}
	}
	if sess == nil {
		inst, err := s.newInstance(ctx)
		if err != nil {
			return nil, &stdError{Code: openenv.RPCInternalError, Message: err.Error()}
		}
		defer s.closeInstance(inst)
		sess = &session{inst: inst}
	}
	defer sess.begin()()
	mcp, ok := sess.inst.(MCPInstance)
	if !ok {
		return nil, &stdError{Code: openenv.RPCInternalError, Message: "Environment does not support MCP"}
	}
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if method == "tools/list" {
		tools, err := safely(func() ([]openenv.Tool, error) { return mcp.ListTools(ctx) })
		if err != nil {
			return nil, &stdError{Code: openenv.RPCInternalError, Message: err.Error()}
		}
		out := make([]map[string]any, len(tools))
		for i, t := range tools {
			schema := t.InputSchema
			if firstByte(schema) != '{' {
				schema = json.RawMessage(`{"type":"object"}`)
			}
			out[i] = map[string]any{"name": t.Name, "description": t.Description, "inputSchema": schema}
		}
		return map[string]any{"tools": out}, nil
	}
	out, err := safely(func() (ToolOutput, error) { return mcp.CallTool(ctx, name, args) })
	if err != nil {
		// The tool's failure goes to the model, which may correct itself.
		return stdToolResult(err.Error(), nil, true, nil, false), nil
	}
	res, err := toolResult(out.Value)
	if err != nil {
		return stdToolResult(err.Error(), nil, true, nil, false), nil
	}
	reward := out.Reward
	if reward != nil && (math.IsNaN(*reward) || math.IsInf(*reward, 0)) {
		reward = nil // JSON cannot carry it
	}
	return stdToolResult(res.Content[0].Text, res.StructuredContent, false, reward, out.Done), nil
}

// stdToolResult is MCP's CallToolResult; _meta carries the step's reward
// and done under the keys ortrain's own MCP server uses.
func stdToolResult(text string, structured json.RawMessage, isError bool, reward *float64, done bool) map[string]any {
	res := map[string]any{
		"content": []map[string]string{{"type": "text", "text": text}},
		"isError": isError,
		"_meta":   map[string]any{"ortrain/finished": done, "ortrain/reward": reward},
	}
	if len(structured) > 0 {
		res["structuredContent"] = structured
	}
	return res
}

// handleMCPDelete ends the standard MCP session named by Mcp-Session-Id.
func (s *Server) handleMCPDelete(w http.ResponseWriter, r *http.Request) {
	sid := r.Header.Get(hdrSessionID)
	if sid == "" {
		writeJSON(w, http.StatusBadRequest, stdReply{JSONRPC: "2.0", ID: json.RawMessage("null"),
			Error: &stdError{Code: openenv.RPCInvalidRequest, Message: "DELETE /mcp needs the Mcp-Session-Id header"}})
		return
	}
	sess := s.lookup(sid)
	if sess == nil || sess.kind != "http" {
		writeJSON(w, http.StatusNotFound, stdReply{JSONRPC: "2.0", ID: json.RawMessage("null"),
			Error: &stdError{Code: -32001, Message: "Session not found: " + sid}})
		return
	}
	s.endSession(sess, "closed by client")
	w.WriteHeader(http.StatusOK)
}
