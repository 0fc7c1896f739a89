package openenvserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/ortrain/ortrain/internal/openenv"
)

// clientFrame is a /ws frame that passed envelope validation.
type clientFrame struct {
	Type string
	Data json.RawMessage // nil when absent
}

// frameError is the reply to a frame that failed; fatal closes the socket.
type frameError struct {
	code    openenv.ErrorCode
	message string
	issues  []openenv.ValidationIssue
}

func (e *frameError) fatal() bool { return e.code.EndsSession() }

// envelopeKeys lists, per frame type, whether data is allowed and required
// (the pydantic WS message models; all extra="forbid").
var envelopeKeys = map[string]struct{ allowed, required bool }{
	openenv.FrameReset: {true, false},
	openenv.FrameStep:  {true, true},
	openenv.FrameState: {false, false},
	openenv.FrameClose: {false, false},
	openenv.FrameMCP:   {true, true},
}

// parseClientFrame validates one client frame as the real server does:
// INVALID_JSON for non-JSON, SESSION_ERROR (fatal) for JSON that is not an
// object, UNKNOWN_TYPE, then VALIDATION_ERROR for the envelope.
func parseClientFrame(b []byte) (clientFrame, *frameError) {
	var v any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return clientFrame{}, &frameError{code: openenv.CodeInvalidJSON, message: "Invalid JSON: " + pyJSONError(b, err)}
	}
	if rest := skipSpace(b, int(dec.InputOffset())); rest < len(b) {
		return clientFrame{}, &frameError{code: openenv.CodeInvalidJSON, message: "Invalid JSON: " + pyPos("Extra data", b, rest)}
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return clientFrame{}, &frameError{code: openenv.CodeSessionError, message: fmt.Sprintf("'%s' object has no attribute 'get'", pyTypeName(v))}
	}
	var raw map[string]json.RawMessage
	_ = json.Unmarshal(b, &raw)
	typ, _ := obj["type"].(string)
	if _, isStr := obj["type"].(string); !isStr {
		typ = pyStr(obj["type"])
	}
	spec, known := envelopeKeys[typ]
	if !known {
		return clientFrame{}, &frameError{code: openenv.CodeUnknownType, message: "Unknown message type: " + typ}
	}
	var issues []openenv.ValidationIssue
	data, hasData := raw["data"]
	switch {
	case hasData && !spec.allowed:
		// reported below as an extra key
	case !hasData && spec.required:
		issues = append(issues, issue("missing", []any{"data"}, "Field required", b, nil))
	case hasData && firstByte(data) != '{' && !(typ == openenv.FrameReset && string(bytes.TrimSpace(data)) == "null"):
		issues = append(issues, issue("dict_type", []any{"data"}, "Input should be a valid dictionary", data, nil))
	}
	for _, k := range sortedKeys(raw) {
		if k == "type" || (k == "data" && spec.allowed) {
			continue
		}
		issues = append(issues, issue("extra_forbidden", []any{k}, "Extra inputs are not permitted", raw[k], nil))
	}
	if len(issues) > 0 {
		return clientFrame{}, &frameError{code: openenv.CodeValidationError, message: "Invalid message", issues: issues}
	}
	if string(bytes.TrimSpace(data)) == "null" {
		data = nil
	}
	return clientFrame{Type: typ, Data: data}, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// pyTypeName is Python's type(x).__name__ for a decoded JSON value.
func pyTypeName(v any) string {
	switch v.(type) {
	case nil:
		return "NoneType"
	case bool:
		return "bool"
	case string:
		return "str"
	case []any:
		return "list"
	case json.Number:
		if strings.ContainsAny(v.(json.Number).String(), ".eE") {
			return "float"
		}
		return "int"
	}
	return "dict"
}

// pyStr is Python's str() of a decoded JSON value (for "Unknown message
// type: ..."; a missing type is the empty string).
func pyStr(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case bool:
		if x {
			return "True"
		}
		return "False"
	case json.Number:
		return x.String()
	case string:
		return x
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// pyJSONError words a decode failure like Python's json module:
// "Expecting value: line 1 column 1 (char 0)" for text that does not start
// a JSON value, else the decoder's message at the failing position.
func pyJSONError(b []byte, err error) string {
	start := skipSpace(b, 0)
	if start >= len(b) || !startsValue(b[start:]) {
		return pyPos("Expecting value", b, start)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return pyPos(se.Error(), b, max(int(se.Offset)-1, 0))
	}
	return pyPos(err.Error(), b, len(b))
}

func startsValue(b []byte) bool {
	switch b[0] {
	case '{', '[', '"', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return true
	}
	for _, lit := range []string{"true", "false", "null", "NaN", "Infinity"} {
		if bytes.HasPrefix(b, []byte(lit)) {
			return true
		}
	}
	return false
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// pyPos appends Python's position suffix; columns and chars count runes.
func pyPos(msg string, b []byte, pos int) string {
	pos = min(pos, len(b))
	prefix := string(b[:pos])
	line := strings.Count(prefix, "\n") + 1
	col := len([]rune(prefix[strings.LastIndex(prefix, "\n")+1:])) + 1
	return fmt.Sprintf("%s: line %d column %d (char %d)", msg, line, col, len([]rune(prefix)))
}
