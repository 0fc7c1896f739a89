package jsonschema

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMinimal: the value built from a schema (an OpenEnv step action, a
// tool input) takes const, the first enum value, bounds and lengths into
// account.
func TestMinimal(t *testing.T) {
	tests := []struct {
		name, schema, want string
	}{
		{"guess action", `{"additionalProperties":false,"properties":{"metadata":{"type":"object"},"guess":{"type":"integer","minimum":1,"maximum":100}},"required":["guess"],"type":"object"}`, `{"guess":1}`},
		{"types", `{"type":"object","required":["s","n","b","a","o"],"properties":{"s":{"type":"string"},"n":{"type":"number"},"b":{"type":"boolean"},"a":{"type":"array"},"o":{"type":"object"}}}`, `{"s":"","n":0,"b":false,"a":[],"o":{}}`},
		{"enum and const", `{"type":"object","required":["e","c"],"properties":{"e":{"enum":["up","down"]},"c":{"const":"call_tool"}}}`, `{"e":"up","c":"call_tool"}`},
		{"optional omitted", `{"type":"object","properties":{"x":{"type":"string"}}}`, `{}`},
		{"lengths", `{"type":"object","required":["s","a"],"properties":{"s":{"type":"string","minLength":3},"a":{"type":"array","minItems":2,"items":{"type":"integer","exclusiveMinimum":0}}}}`, `{"s":"aaa","a":[1,1]}`},
		{"nullable number", `{"type":"object","required":["x","y"],"properties":{"x":{"anyOf":[{"type":"null"},{"type":"number","exclusiveMinimum":0}]},"y":{"type":["null","string"]}}}`, `{"x":0.5,"y":""}`},
		{"ref", `{"$defs":{"Move":{"type":"object","required":["dir"],"properties":{"dir":{"enum":["n","s"]}}}},"type":"object","required":["move"],"properties":{"move":{"$ref":"#/$defs/Move"}}}`, `{"move":{"dir":"n"}}`},
		{"ref cycle ends", `{"$defs":{"N":{"type":"object","required":["next"],"properties":{"next":{"$ref":"#/$defs/N"}}}},"$ref":"#/$defs/N"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dec := json.NewDecoder(strings.NewReader(tt.schema))
			dec.UseNumber()
			var s map[string]any
			require.NoError(t, dec.Decode(&s))
			got, err := json.Marshal(Minimal(s))
			require.NoError(t, err)
			if tt.want == "" {
				assert.True(t, json.Valid(got), "a cyclic schema still gives a finite value")
				return
			}
			assert.JSONEq(t, tt.want, string(got))
		})
	}
}

// TestMinimalInput: a tool input is its required properties, each the
// least value of its schema.
func TestMinimalInput(t *testing.T) {
	for _, tc := range []struct{ schema, want string }{
		{``, `{}`},
		{`{"type":"object","properties":{}}`, `{}`},
		{`{"properties":{"code":{"type":"string"}},"required":["code"]}`, `{"code":""}`},
		{`{"properties":{"n":{"type":"integer","minimum":3},"b":{"type":"boolean"},"l":{"type":"array"},"o":{"type":"object"},"x":{"type":"string"}},"required":["n","b","l","o"]}`, `{"n":3,"b":false,"l":[],"o":{}}`},
		{`{"properties":{"mode":{"enum":["fast","slow"]},"t":{"type":["number","null"]}},"required":["mode","t"]}`, `{"mode":"fast","t":0}`},
	} {
		b, err := json.Marshal(MinimalInput(json.RawMessage(tc.schema)))
		require.NoError(t, err)
		assert.JSONEq(t, tc.want, string(b), tc.schema)
	}
}
