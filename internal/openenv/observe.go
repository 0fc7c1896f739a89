package openenv

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// ActionTool is the action schema offered to a model as a tool's
// parameters: the /schema action minus the bookkeeping metadata field.
func (s Schema) ActionTool() (json.RawMessage, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(s.Action, &obj); err != nil || obj == nil {
		return nil, fmt.Errorf("action schema is not a JSON object")
	}
	var props map[string]json.RawMessage
	if raw, ok := obj["properties"]; ok {
		if err := json.Unmarshal(raw, &props); err != nil {
			return nil, fmt.Errorf("action schema properties: %w", err)
		}
		delete(props, "metadata")
		obj["properties"], _ = json.Marshal(props)
	}
	if raw, ok := obj["required"]; ok {
		var req []string
		if err := json.Unmarshal(raw, &req); err != nil {
			return nil, fmt.Errorf("action schema required: %w", err)
		}
		req = slices.DeleteFunc(req, func(n string) bool { return n == "metadata" })
		obj["required"], _ = json.Marshal(req)
	}
	return json.Marshal(obj)
}

// TextActionField names the action's only field when it is a string
// (Wordle's "message"): then the model's plain text can be the action.
func (s Schema) TextActionField() (string, bool) {
	var a struct {
		Properties map[string]struct {
			Type string `json:"type"`
		} `json:"properties"`
	}
	if json.Unmarshal(s.Action, &a) != nil {
		return "", false
	}
	delete(a.Properties, "metadata")
	if len(a.Properties) != 1 {
		return "", false
	}
	for name, p := range a.Properties {
		if p.Type == "string" {
			return name, true
		}
	}
	return "", false
}

// ObservationField renders one field of an observation as text: a string
// as is, anything else as its JSON.
func ObservationField(obs json.RawMessage, field string) (string, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(obs, &m); err != nil {
		return "", fmt.Errorf("observation is not a JSON object: %w", err)
	}
	raw, ok := m[field]
	if !ok {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		return "", fmt.Errorf("observation has no field %q (fields: %s)", field, strings.Join(keys, ", "))
	}
	var s string
	if len(raw) > 0 && raw[0] == '"' && json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	return string(raw), nil
}

// NewText is what a cumulative text adds since last time: cur minus the
// prefix prev, or all of cur when it does not extend prev (TRL's Wordle
// example slices feedback the same way).
func NewText(prev, cur string) string {
	if rest, ok := strings.CutPrefix(cur, prev); ok {
		return rest
	}
	return cur
}
