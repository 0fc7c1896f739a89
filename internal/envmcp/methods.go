package envmcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"

	"github.com/rs/zerolog"

	"github.com/ortrain/ortrain/internal/envtarget"
)

// Keys of the _meta object on every tools/call result, so an agent loop can
// see the episode's state without parsing text: MetaFinished is whether the
// episode is over (true on the call that ended it and on every call after),
// MetaReward the reward this call gave (null: none).
const (
	MetaFinished = "ortrain/finished"
	MetaReward   = "ortrain/reward"
)

// reqEra says how a request came: a stateless (2026-07-28) request gets
// resultType, cache hints and serverInfo in its results.
type reqEra struct {
	modern  bool
	version string
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

func (s *Server) serverInfo() implementation {
	return implementation{Name: "ortrain", Version: s.opts.Version}
}

// initialize opens a legacy MCP session on the episode and answers with its
// id in the Mcp-Session-Id header.
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
		ServerInfo:      s.serverInfo(),
	}})
}

// discoverResult is server/discover's answer (2026-07-28). Nothing is worth
// caching past a rollout, and the answer sits behind the rollout's key:
// ttlMs 0, cacheScope private.
type discoverResult struct {
	ResultType        string             `json:"resultType"`
	SupportedVersions []string           `json:"supportedVersions"`
	Capabilities      serverCapabilities `json:"capabilities"`
	Meta              map[string]any     `json:"_meta"`
	TTLMs             int                `json:"ttlMs"`
	CacheScope        string             `json:"cacheScope"`
}

func (s *Server) discover() discoverResult {
	return discoverResult{
		ResultType:        "complete",
		SupportedVersions: supportedVersions(),
		Capabilities:      serverCapabilities{Tools: toolsCapability{ListChanged: false}},
		Meta:              map[string]any{metaServerInfo: s.serverInfo()},
		CacheScope:        "private",
	}
}

// dispatch answers one request: of an established legacy session, or a
// stateless one.
func (s *Server) dispatch(ctx context.Context, ep *Episode, msg *rpcMessage, era reqEra) (any, *rpcError) {
	switch msg.method {
	case "ping":
		// Gone from 2026-07-28, but answering it harms no client.
		return struct{}{}, nil
	case methodDiscover:
		return s.discover(), nil
	case "tools/list":
		res := toolsListResult{Tools: ep.tools}
		if era.modern {
			res.TTLMs, res.CacheScope = new(int), "private"
		}
		return res, nil
	case "tools/call":
		return s.callTool(ctx, ep, msg.params)
	case "initialize":
		if era.modern {
			return nil, &rpcError{Code: codeMethodNotFound, Message: "Method not found: initialize is not part of MCP " + era.version + "; send requests directly, with _meta"}
		}
		return nil, &rpcError{Code: codeInvalidRequest, Message: "Invalid Request: initialize must be a request with an id"}
	}
	return nil, &rpcError{Code: codeMethodNotFound, Message: "Method not found: " + msg.method}
}

// modernResult adds what every 2026-07-28 result carries: resultType and
// the server's identity in _meta (beside any keys already there).
func (s *Server) modernResult(result any) (json.RawMessage, error) {
	b, err := json.Marshal(result)
	if err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return nil, fmt.Errorf("a result must be a JSON object: %w", err)
	}
	meta := map[string]any{}
	if raw, ok := fields["_meta"]; ok {
		if err := json.Unmarshal(raw, &meta); err != nil {
			return nil, fmt.Errorf("result _meta: %w", err)
		}
	}
	meta[metaServerInfo] = s.serverInfo()
	if fields["_meta"], err = json.Marshal(meta); err != nil {
		return nil, err
	}
	if _, ok := fields["resultType"]; !ok {
		fields["resultType"] = json.RawMessage(`"complete"`)
	}
	return json.Marshal(fields)
}

// mcpTool is a tool as tools/list shows it.
type mcpTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"inputSchema"`
	Annotations json.RawMessage `json:"annotations,omitempty"`
}

type toolsListResult struct {
	Tools []mcpTool `json:"tools"`
	// The 2026-07-28 cache hints: the list may change with the next
	// rollout, so it is never reused (0), and never shared (private).
	TTLMs      *int   `json:"ttlMs,omitempty"`
	CacheScope string `json:"cacheScope,omitempty"`
}

// emptyObjectSchema is the inputSchema of a tool that takes no arguments:
// MCP requires an object schema on every tool.
const emptyObjectSchema = `{"type":"object"}`

// mcpTools renders the env's tools, each with the annotations annotate
// gives it (none when annotate is nil or gives nil; ones that do not encode
// are dropped and logged, as a tool without annotations still works).
func mcpTools(specs []envtarget.ToolSpec, annotate func(tool string) map[string]any, log zerolog.Logger) []mcpTool {
	out := make([]mcpTool, len(specs))
	for i, spec := range specs {
		schema := bytes.TrimSpace(spec.InputSchema)
		if len(schema) == 0 || string(schema) == "null" {
			schema = []byte(emptyObjectSchema)
		}
		out[i] = mcpTool{Name: spec.Name, Description: spec.Description, InputSchema: append(json.RawMessage(nil), schema...)}
		if annotate == nil {
			continue
		}
		if a := annotate(spec.Name); a != nil {
			raw, err := json.Marshal(a)
			if err != nil {
				log.Warn().Err(err).Str("tool", spec.Name).Msg("mcp tool annotations do not encode as JSON: the tool is listed without them")
				continue
			}
			out[i].Annotations = raw
		}
	}
	return out
}

type callParams struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

type callResult struct {
	Content []textContent `json:"content"`
	// StructuredContent is set on the call that ended the episode only
	// (finishState): no tool declares an outputSchema, so it is free form.
	StructuredContent *finishState   `json:"structuredContent,omitempty"`
	IsError           bool           `json:"isError"`
	Meta              map[string]any `json:"_meta"`
}

// finishState is the structuredContent of the call that ended the episode.
type finishState struct {
	Finished bool     `json:"finished"`
	Reward   *float64 `json:"reward"` // null: the call gave none
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
	return toolCallResult(call.record), nil
}

// toolCallResult renders a recorded call for the agent. The call that ended
// the episode says so three ways: structuredContent and _meta for loops
// that read them, a last text line for those that read text only. A call
// after the end is an error result saying the episode is over.
func toolCallResult(rec ToolCall) callResult {
	reward := finiteReward(rec.Reward)
	res := callResult{
		IsError: rec.IsError,
		Meta:    map[string]any{MetaFinished: rec.Finished || rec.AfterFinish, MetaReward: reward},
	}
	text := rec.Result
	switch {
	case rec.IsError:
		text = rec.Err
	case rec.Finished:
		res.StructuredContent = &finishState{Finished: true, Reward: reward}
		if text != "" {
			text += "\n\n"
		}
		text += finishedLine(reward)
	}
	res.Content = []textContent{{Type: "text", Text: text}}
	return res
}

// finishedLine is the text an agent reading text only sees last.
func finishedLine(reward *float64) string {
	if reward == nil {
		return "[episode finished — no more tool calls are needed]"
	}
	return "[episode finished: reward " + strconv.FormatFloat(*reward, 'g', -1, 64) + " — no more tool calls are needed]"
}

// finiteReward is r, or nil when JSON cannot carry it (NaN, ±Inf).
func finiteReward(r *float64) *float64 {
	if r == nil || math.IsNaN(*r) || math.IsInf(*r, 0) {
		return nil
	}
	return copyReward(r)
}
