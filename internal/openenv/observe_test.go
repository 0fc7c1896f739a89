package openenv_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/openenv"
)

func TestActionTool(t *testing.T) {
	tests := []struct {
		name, action, tool, field string
	}{
		{"guess", `{"additionalProperties":false,"properties":{"metadata":{"type":"object"},"guess":{"maximum":100,"minimum":1,"type":"integer"}},"required":["guess"],"title":"GuessAction","type":"object"}`,
			`{"additionalProperties":false,"properties":{"guess":{"maximum":100,"minimum":1,"type":"integer"}},"required":["guess"],"title":"GuessAction","type":"object"}`, ""},
		{"wordle", `{"properties":{"metadata":{"type":"object"},"message":{"type":"string"}},"required":["message","metadata"],"type":"object"}`,
			`{"properties":{"message":{"type":"string"}},"required":["message"],"type":"object"}`, "message"},
		{"two strings", `{"properties":{"a":{"type":"string"},"b":{"type":"string"}},"type":"object"}`,
			`{"properties":{"a":{"type":"string"},"b":{"type":"string"}},"type":"object"}`, ""},
		{"no properties", `{"type":"object"}`, `{"type":"object"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openenv.Schema{Action: json.RawMessage(tt.action)}
			tool, err := s.ActionTool()
			require.NoError(t, err)
			assert.JSONEq(t, tt.tool, string(tool))
			field, ok := s.TextActionField()
			assert.Equal(t, tt.field, field)
			assert.Equal(t, tt.field != "", ok)
		})
	}
	_, err := openenv.Schema{Action: json.RawMessage(`[1]`)}.ActionTool()
	require.Error(t, err)
}

func TestObservationField(t *testing.T) {
	obs := json.RawMessage(`{"message":"Go lower.","guesses_left":5,"last_guess":null,"tools":[{"name":"x"}]}`)
	for field, want := range map[string]string{"message": "Go lower.", "guesses_left": "5", "last_guess": "null", "tools": `[{"name":"x"}]`} {
		got, err := openenv.ObservationField(obs, field)
		require.NoError(t, err)
		assert.Equal(t, want, got, field)
	}
	_, err := openenv.ObservationField(obs, "hint")
	require.EqualError(t, err, `observation has no field "hint" (fields: guesses_left, last_guess, message, tools)`)
	_, err = openenv.ObservationField(json.RawMessage(`[]`), "x")
	require.Error(t, err)
}

func TestNewText(t *testing.T) {
	for _, tt := range []struct{ prev, cur, want string }{
		{"", "Welcome.", "Welcome."},
		{"Welcome.", "Welcome. [crane] is wrong.", " [crane] is wrong."},
		{"Welcome.", "Welcome.", ""},
		{"Round 1", "Round 2: new board", "Round 2: new board"},
	} {
		assert.Equal(t, tt.want, openenv.NewText(tt.prev, tt.cur), tt.cur)
	}
}
