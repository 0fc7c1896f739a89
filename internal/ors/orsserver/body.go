package orsserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ortrain/ortrain/internal/ors"
)

const maxBodyBytes = 16 << 20

// maxEchoBytes caps the input a validation item repeats: pydantic echoes
// the whole input per item, so an unbounded echo turns one large body into
// a reply several times its size.
const maxEchoBytes = 1 << 10

// truncatedMark ends an echoed input that was cut at maxEchoBytes.
const truncatedMark = "... [truncated]"

type fieldKind int

const (
	kindString fieldKind = iota
	kindInt
	kindObject
	kindStringMap
)

// bodyField declares one key of a request body; optional keys may be null.
type bodyField struct {
	name     string
	kind     fieldKind
	required bool
}

// validationItem is one entry of a FastAPI-style 422 detail list. Build it
// with newItem, which caps the echoed input.
type validationItem struct {
	Type  string `json:"type"`
	Loc   []any  `json:"loc"`
	Msg   string `json:"msg"`
	Input any    `json:"input"`
	// InputTruncated marks an Input cut to its first maxEchoBytes of JSON
	// text (then a string ending in truncatedMark).
	InputTruncated bool `json:"input_truncated,omitempty"`
}

func newItem(typ string, loc []any, msg string, input any) validationItem {
	in, cut := echoInput(input)
	return validationItem{Type: typ, Loc: loc, Msg: msg, Input: in, InputTruncated: cut}
}

// echoInput returns input unchanged when its JSON text fits maxEchoBytes,
// and otherwise that text's first maxEchoBytes (on a rune boundary) plus
// truncatedMark, as a string. Only one byte past the cap is copied.
func echoInput(input any) (any, bool) {
	var text string
	switch v := input.(type) {
	case json.RawMessage:
		if len(v) <= maxEchoBytes {
			return v, false
		}
		text = string(v[:maxEchoBytes+1])
	case string:
		if len(v) <= maxEchoBytes {
			return v, false
		}
		text = v[:maxEchoBytes+1]
	default:
		b, err := ors.MarshalJSON(v)
		if err != nil || len(b) <= maxEchoBytes {
			return v, false
		}
		text = string(b[:maxEchoBytes+1])
	}
	return truncateText(text, maxEchoBytes) + truncatedMark, true
}

// truncateText cuts s to at most n bytes without splitting a rune.
func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// decodeBody reads a JSON object body that may hold only fields, checks
// each kind (ints accept 3, "3" and 3.0, as pydantic's lax mode does) and
// answers 422 on any violation. Null optional values are dropped.
func decodeBody(w http.ResponseWriter, r *http.Request, fields []bodyField) (map[string]json.RawMessage, bool) {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		// Not a validation failure: the body was never read whole.
		writeDetail(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("Request body too large: the limit is %d bytes", maxBodyBytes))
		return nil, false
	case err != nil:
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": []validationItem{newItem("json_invalid", []any{"body", 0}, "JSON decode error", err.Error())}})
		return nil, false
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = []byte("{}")
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": []validationItem{newItem("model_attributes_type", []any{"body"}, "Input should be a valid dictionary or object to extract fields from", string(raw))}})
		return nil, false
	}
	var items []validationItem
	known := map[string]bool{}
	for _, f := range fields {
		known[f.name] = true
		v, ok := obj[f.name]
		if ok && string(v) == "null" && !f.required {
			delete(obj, f.name)
			ok = false
		}
		if !ok {
			if f.required {
				items = append(items, newItem("missing", []any{"body", f.name}, "Field required", json.RawMessage(raw)))
			}
			continue
		}
		norm, item := checkBodyKind(f, v)
		if item != nil {
			items = append(items, *item)
			continue
		}
		obj[f.name] = norm
	}
	for k, v := range obj {
		if !known[k] {
			items = append(items, newItem("extra_forbidden", []any{"body", k}, "Extra inputs are not permitted", v))
		}
	}
	if len(items) > 0 {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": items})
		return nil, false
	}
	return obj, true
}

func checkBodyKind(f bodyField, v json.RawMessage) (json.RawMessage, *validationItem) {
	c := firstByte(v)
	bad := func(typ, msg string) *validationItem {
		item := newItem(typ, []any{"body", f.name}, msg, v)
		return &item
	}
	switch f.kind {
	case kindString:
		if c != '"' {
			return nil, bad("string_type", "Input should be a valid string")
		}
	case kindObject:
		if c != '{' {
			return nil, bad("dict_type", "Input should be a valid dictionary")
		}
	case kindStringMap:
		var m map[string]string
		if c != '{' || json.Unmarshal(v, &m) != nil {
			return nil, bad("dict_type", "Input should be a valid dictionary with string values")
		}
	case kindInt:
		text := string(v)
		if c == '"' {
			_ = json.Unmarshal(v, &text)
			text = strings.TrimSpace(text)
		} else if c != '-' && (c < '0' || c > '9') {
			return nil, bad("int_type", "Input should be a valid integer")
		}
		if n, err := strconv.ParseInt(text, 10, 64); err == nil {
			return json.RawMessage(strconv.FormatInt(n, 10)), nil
		}
		fv, err := strconv.ParseFloat(text, 64)
		if err != nil {
			return nil, bad("int_parsing", "Input should be a valid integer, unable to parse string as an integer")
		}
		if fv != float64(int64(fv)) {
			return nil, bad("int_from_float", "Input should be a valid integer, got a number with a fractional part")
		}
		return json.RawMessage(strconv.FormatInt(int64(fv), 10)), nil
	}
	return v, nil
}

func bodyString(obj map[string]json.RawMessage, key string) (string, bool) {
	v, ok := obj[key]
	if !ok {
		return "", false
	}
	var s string
	_ = json.Unmarshal(v, &s)
	return s, true
}

func bodyInt(obj map[string]json.RawMessage, key string) (int, bool) {
	v, ok := obj[key]
	if !ok {
		return 0, false
	}
	n, _ := strconv.Atoi(string(v))
	return n, true
}

func unprocessable(w http.ResponseWriter, msg string, input any) {
	writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": []validationItem{newItem("value_error", []any{"body"}, msg, input)}})
}
