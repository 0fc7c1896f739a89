package openenvserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"unicode/utf8"

	"github.com/ortrain/ortrain/internal/openenv"
)

const maxHTTPBody = 16 << 20

func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxHTTPBody))
	if err != nil {
		writeJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"detail": "request body too large or unreadable"})
		return nil, false
	}
	return body, true
}

// bodyObject decodes a JSON object body; empty is allowed when optional.
// On failure it answers 422 like FastAPI.
func bodyObject(w http.ResponseWriter, body []byte, optional bool) (map[string]json.RawMessage, bool) {
	if len(bytes.TrimSpace(body)) == 0 {
		if optional {
			return map[string]json.RawMessage{}, true
		}
		unprocessable(w, issue("missing", []any{"body"}, "Field required", nil, nil))
		return nil, false
	}
	var obj map[string]json.RawMessage
	if !json.Valid(body) {
		unprocessable(w, issue("json_invalid", []any{"body", 0}, "JSON decode error", json.RawMessage(`{}`), map[string]string{"error": "Expecting value"}))
		return nil, false
	}
	if json.Unmarshal(body, &obj) != nil || obj == nil {
		unprocessable(w, issue("model_attributes_type", []any{"body"}, "Input should be a valid dictionary or object to extract fields from", body, nil))
		return nil, false
	}
	return obj, true
}

func unprocessable(w http.ResponseWriter, issues ...openenv.ValidationIssue) {
	writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": issues})
}

// statelessSession builds a throwaway session for one HTTP request; it
// does not take a capacity slot, as in the reference.
func (s *Server) statelessSession(w http.ResponseWriter, r *http.Request) (*session, func(), bool) {
	inst, err := s.newInstance(r.Context())
	if err != nil {
		s.log.Warn().Err(err).Str("path", r.URL.Path).Msg("env factory failed")
		internalError(w)
		return nil, nil, false
	}
	return &session{inst: inst}, func() { s.closeInstance(inst) }, true
}

func (s *Server) handleHTTPReset(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	obj, ok := bodyObject(w, body, true)
	if !ok {
		return
	}
	var issues []openenv.ValidationIssue
	if raw, has := obj["seed"]; has && string(raw) != "null" {
		if f, bad := checkField(Field{Name: "seed", Type: Integer, Minimum: Bound(0)}, raw); bad != nil {
			bad.Loc = []any{"body", "seed"}
			issues = append(issues, *bad)
		} else {
			obj["seed"] = f
		}
	}
	if raw, has := obj["episode_id"]; has && string(raw) != "null" {
		var id string
		if json.Unmarshal(raw, &id) != nil {
			issues = append(issues, issue("string_type", []any{"body", "episode_id"}, "Input should be a valid string", raw, nil))
		} else if utf8.RuneCountInString(id) > 255 {
			issues = append(issues, issue("string_too_long", []any{"body", "episode_id"}, "String should have at most 255 characters", raw, map[string]int{"max_length": 255}))
		}
	}
	if len(issues) > 0 {
		unprocessable(w, issues...)
		return
	}
	sess, done, ok := s.statelessSession(w, r)
	if !ok {
		return
	}
	defer done()
	res, err := s.reset(r.Context(), sess, mustMarshal(obj))
	s.writeStep(w, r, res, err)
}

func (s *Server) handleHTTPStep(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	obj, ok := bodyObject(w, body, false)
	if !ok {
		return
	}
	var issues []openenv.ValidationIssue
	action, has := obj["action"]
	switch {
	case !has:
		issues = append(issues, issue("missing", []any{"body", "action"}, "Field required", body, nil))
	case firstByte(action) != '{':
		issues = append(issues, issue("dict_type", []any{"body", "action"}, "Input should be a valid dictionary", action, nil))
	}
	if raw, has := obj["timeout_s"]; has && string(raw) != "null" {
		var t float64
		if json.Unmarshal(raw, &t) != nil {
			issues = append(issues, issue("float_type", []any{"body", "timeout_s"}, "Input should be a valid number", raw, nil))
		} else if t <= 0 {
			issues = append(issues, issue("greater_than", []any{"body", "timeout_s"}, "Input should be greater than 0", raw, map[string]float64{"gt": 0}))
		}
	}
	if raw, has := obj["request_id"]; has && string(raw) != "null" && firstByte(raw) != '"' {
		issues = append(issues, issue("string_type", []any{"body", "request_id"}, "Input should be a valid string", raw, nil))
	}
	if len(issues) > 0 {
		unprocessable(w, issues...)
		return
	}
	sess, done, ok := s.statelessSession(w, r)
	if !ok {
		return
	}
	defer done()
	res, err := s.step(r.Context(), sess, action)
	s.writeStep(w, r, res, err)
}

func (s *Server) writeStep(w http.ResponseWriter, r *http.Request, res openenv.StepResult, err error) {
	var ve *validationError
	switch {
	case errors.As(err, &ve):
		unprocessable(w, ve.issues...)
	case err != nil:
		s.log.Warn().Err(err).Str("path", r.URL.Path).Msg("env raised")
		internalError(w)
	default:
		writeJSON(w, http.StatusOK, res)
	}
}

func (s *Server) handleHTTPState(w http.ResponseWriter, r *http.Request) {
	sess, done, ok := s.statelessSession(w, r)
	if !ok {
		return
	}
	defer done()
	st, err := s.state(r.Context(), sess)
	if err != nil {
		s.log.Warn().Err(err).Msg("env state raised")
		internalError(w)
		return
	}
	// The base State response model drops subclass fields.
	var full map[string]json.RawMessage
	_ = json.Unmarshal(st, &full)
	base := struct {
		EpisodeID json.RawMessage `json:"episode_id"`
		StepCount json.RawMessage `json:"step_count"`
	}{full["episode_id"], full["step_count"]}
	if base.StepCount == nil {
		base.StepCount = json.RawMessage("0")
	}
	writeJSON(w, http.StatusOK, base)
}

// handleHTTPMCP serves POST /mcp: a standard MCP client's lifecycle (see
// stdmcp.go) or OpenEnv's own JSON-RPC.
func (s *Server) handleHTTPMCP(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	if isStandardMCP(r, body) {
		s.serveStandardMCP(w, r, body)
		return
	}
	writeJSON(w, http.StatusOK, s.handleRPC(r.Context(), body, rpcCall{parseF: httpParseError}))
}
