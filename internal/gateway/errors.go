package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// apiError is an OpenAI error reply: the HTTP status and the body's
// {"error": {"message", "type", "param", "code"}}.
type apiError struct {
	status  int
	message string
	typ     string
	param   string // the request field at fault; "" is null
	code    string // "" is null
}

func (e *apiError) Error() string { return e.message }

// badRequest names the request field at fault in param and the message.
func badRequest(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: param, message: fmt.Sprintf(format, args...)}
}

func notFound(code, format string, args ...any) *apiError {
	return &apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: code, message: fmt.Sprintf(format, args...)}
}

func serverError(format string, args ...any) *apiError {
	return &apiError{status: http.StatusInternalServerError, typ: "server_error", message: fmt.Sprintf(format, args...)}
}

type errorBody struct {
	Error errorInfo `json:"error"`
}

type errorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// WriteError answers with OpenAI's error JSON {"error": {"message",
// "type", "param", "code"}} ("" type is invalid_request_error, "" param and
// code are null), for servers beside the gateway (serve-engine's dispatch)
// that must fail the way the gateway does.
func WriteError(w http.ResponseWriter, status int, typ, param, code, message string) {
	if typ == "" {
		typ = "invalid_request_error"
	}
	writeError(w, &apiError{status: status, typ: typ, param: param, code: code, message: message})
}

func writeError(w http.ResponseWriter, e *apiError) {
	info := errorInfo{Message: e.message, Type: e.typ}
	if e.param != "" {
		info.Param = &e.param
	}
	if e.code != "" {
		info.Code = &e.code
	}
	writeJSON(w, e.status, errorBody{Error: info})
}

// writeJSON writes v without HTML escaping, so tool-call tags read as
// written.
func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		data, _ = marshal(errorBody{Error: errorInfo{Message: "encoding the reply: " + err.Error(), Type: "server_error"}})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// readBody reads at most limit bytes of the request body (413 beyond).
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, *apiError) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error",
				message: fmt.Sprintf("request body is larger than %d bytes", limit)}
		}
		return nil, badRequest("", "reading the request body: %v", err)
	}
	return data, nil
}

// decodeJSON reads a request body into v, naming the field at fault.
func decodeJSON(data []byte, v any) *apiError {
	if len(bytes.TrimSpace(data)) == 0 {
		return badRequest("", "the request body is empty; send a JSON object")
	}
	err := json.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		if typeErr.Field == "" {
			return badRequest("", "the request body must be a JSON object, not %s", typeErr.Value)
		}
		// The path names Go's embedded struct; the client knows the JSON name.
		field := strings.TrimPrefix(typeErr.Field, "samplingFields.")
		return badRequest(field, "%s: expected %s, got %s", field, typeErr.Type, typeErr.Value)
	}
	return badRequest("", "invalid JSON body: %v", err)
}
