package openenvserver

import (
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ortrain/ortrain/internal/openenv"
)

func TestParseClientFrame(t *testing.T) {
	tests := []struct {
		frame  string
		typ    string
		data   string
		code   openenv.ErrorCode
		msg    string
		issues string // JSON of the issues, when VALIDATION_ERROR
	}{
		{frame: `{"type":"reset"}`, typ: "reset"},
		{frame: `{"type":"reset","data":{"seed":-5}}`, typ: "reset", data: `{"seed":-5}`},
		{frame: `{"type":"reset","data":null}`, typ: "reset"},
		{frame: `{"type":"step","data":{"guess":1}}`, typ: "step", data: `{"guess":1}`},
		{frame: `{"type":"state"}`, typ: "state"},
		{frame: `{"type":"close"}`, typ: "close"},
		{frame: `{"data":{},"type":"mcp"}`, typ: "mcp", data: `{}`},
		{frame: `not json`, code: openenv.CodeInvalidJSON, msg: "Invalid JSON: Expecting value: line 1 column 1 (char 0)"},
		{frame: ``, code: openenv.CodeInvalidJSON, msg: "Invalid JSON: Expecting value: line 1 column 1 (char 0)"},
		{frame: "\n  x", code: openenv.CodeInvalidJSON, msg: "Invalid JSON: Expecting value: line 2 column 3 (char 3)"},
		{frame: `{"type":"state"} {}`, code: openenv.CodeInvalidJSON, msg: "Invalid JSON: Extra data: line 1 column 18 (char 17)"},
		{frame: `""}`, code: openenv.CodeInvalidJSON, msg: "Invalid JSON: Extra data: line 1 column 3 (char 2)"},
		{frame: `[1,2]`, code: openenv.CodeSessionError, msg: "'list' object has no attribute 'get'"},
		{frame: `"s"`, code: openenv.CodeSessionError, msg: "'str' object has no attribute 'get'"},
		{frame: `3`, code: openenv.CodeSessionError, msg: "'int' object has no attribute 'get'"},
		{frame: `3.5`, code: openenv.CodeSessionError, msg: "'float' object has no attribute 'get'"},
		{frame: `null`, code: openenv.CodeSessionError, msg: "'NoneType' object has no attribute 'get'"},
		{frame: `true`, code: openenv.CodeSessionError, msg: "'bool' object has no attribute 'get'"},
		{frame: `{"type":"bogus"}`, code: openenv.CodeUnknownType, msg: "Unknown message type: bogus"},
		{frame: `{}`, code: openenv.CodeUnknownType, msg: "Unknown message type: "},
		{frame: `{"type":5}`, code: openenv.CodeUnknownType, msg: "Unknown message type: 5"},
		{frame: `{"type":"state","data":{}}`, code: openenv.CodeValidationError, msg: "Invalid message",
			issues: `[{"type":"extra_forbidden","loc":["data"],"msg":"Extra inputs are not permitted","input":{},"url":"https://errors.pydantic.dev/2.13/v/extra_forbidden"}]`},
		{frame: `{"type":"step"}`, code: openenv.CodeValidationError, msg: "Invalid message",
			issues: `[{"type":"missing","loc":["data"],"msg":"Field required","input":{"type":"step"},"url":"https://errors.pydantic.dev/2.13/v/missing"}]`},
		{frame: `{"type":"step","data":[1],"x":2}`, code: openenv.CodeValidationError, msg: "Invalid message",
			issues: `[{"type":"dict_type","loc":["data"],"msg":"Input should be a valid dictionary","input":[1],"url":"https://errors.pydantic.dev/2.13/v/dict_type"},{"type":"extra_forbidden","loc":["x"],"msg":"Extra inputs are not permitted","input":2,"url":"https://errors.pydantic.dev/2.13/v/extra_forbidden"}]`},
	}
	for _, tt := range tests {
		t.Run(tt.frame, func(t *testing.T) {
			f, ferr := parseClientFrame([]byte(tt.frame))
			if tt.typ != "" {
				require.Nil(t, ferr)
				assert.Equal(t, tt.typ, f.Type)
				if tt.data == "" {
					assert.Nil(t, f.Data)
				} else {
					assert.JSONEq(t, tt.data, string(f.Data))
				}
				return
			}
			require.NotNil(t, ferr)
			assert.Equal(t, tt.code, ferr.code)
			assert.Equal(t, tt.msg, ferr.message)
			assert.Equal(t, tt.code == openenv.CodeSessionError, ferr.fatal())
			if tt.issues != "" {
				got, err := json.Marshal(ferr.issues)
				require.NoError(t, err)
				assert.JSONEq(t, tt.issues, string(got))
			}
		})
	}
}

func TestValidateAction(t *testing.T) {
	fields := []Field{
		{Name: "n", Type: Integer, Required: true, Minimum: Bound(1), Maximum: Bound(100)},
		{Name: "x", Type: Number, Maximum: Bound(0.5)},
		{Name: "s", Type: String},
		{Name: "b", Type: Boolean},
	}
	tests := []struct {
		in, norm, issues string
	}{
		{`{"n":5}`, `{"n":5}`, ""},
		{`{"n":"7","metadata":{"k":1}}`, `{"n":7,"metadata":{"k":1}}`, ""},
		{`{"n":7.0,"x":0.25,"s":"a","b":true}`, `{"n":7,"x":0.25,"s":"a","b":true}`, ""},
		{`{}`, "", `[{"type":"missing","loc":["n"],"msg":"Field required","input":{}}]`},
		{`{"n":101}`, "", `[{"type":"less_than_equal","loc":["n"],"msg":"Input should be less than or equal to 100","input":101,"ctx":{"le":100}}]`},
		{`{"n":1,"x":0.75}`, "", `[{"type":"less_than_equal","loc":["x"],"msg":"Input should be less than or equal to 0.5","input":0.75,"ctx":{"le":0.5}}]`},
		{`{"n":1.5}`, "", `[{"type":"int_from_float","loc":["n"],"msg":"Input should be a valid integer, got a number with a fractional part","input":1.5}]`},
		{`{"n":"abc"}`, "", `[{"type":"int_parsing","loc":["n"],"msg":"Input should be a valid integer, unable to parse string as an integer","input":"abc"}]`},
		{`{"n":[1]}`, "", `[{"type":"int_type","loc":["n"],"msg":"Input should be a valid integer","input":[1]}]`},
		{`{"n":1,"s":2,"b":"no","metadata":3,"z":null}`, "", `[{"type":"string_type","loc":["s"],"msg":"Input should be a valid string","input":2},{"type":"bool_type","loc":["b"],"msg":"Input should be a valid boolean","input":"no"},{"type":"dict_type","loc":["metadata"],"msg":"Input should be a valid dictionary","input":3},{"type":"extra_forbidden","loc":["z"],"msg":"Extra inputs are not permitted","input":null}]`},
		{`[1]`, "", `[{"type":"model_type","loc":[],"msg":"Input should be a valid dictionary","input":[1]}]`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			norm, issues := validateAction(json.RawMessage(tt.in), fields)
			if tt.issues == "" {
				require.Empty(t, issues)
				assert.JSONEq(t, tt.norm, string(norm))
				return
			}
			require.Nil(t, norm)
			for i := range issues {
				assert.Equal(t, "https://errors.pydantic.dev/2.13/v/"+issues[i].Type, issues[i].URL)
				issues[i].URL = ""
			}
			got, err := json.Marshal(issues)
			require.NoError(t, err)
			assert.JSONEq(t, tt.issues, string(got))
		})
	}
}

func TestActionSchema(t *testing.T) {
	got := actionSchema("GuessAction", "", []Field{{Name: "guess", Type: Integer, Required: true, Description: "d", Minimum: Bound(1), Maximum: Bound(100)}, {Name: "note_text", Type: String, Default: ""}})
	assert.JSONEq(t, `{"additionalProperties":false,"properties":{"metadata":{"additionalProperties":true,"description":"Additional metadata for the action","title":"Metadata","type":"object"},"guess":{"description":"d","maximum":100,"minimum":1,"title":"Guess","type":"integer"},"note_text":{"default":"","title":"Note Text","type":"string"}},"required":["guess"],"title":"GuessAction","type":"object"}`, string(got))
}

// FuzzParseClientFrame: every input is accepted as a known frame type or
// answered with an error of a §2 code; only SESSION_ERROR is fatal, and
// only for JSON that is not an object. Never a panic.
func FuzzParseClientFrame(f *testing.F) {
	for _, seed := range []string{
		`{"type":"reset","data":{"seed":1,"episode_id":"e"}}`, `{"type":"step","data":{"guess":42}}`,
		`{"type":"state"}`, `{"type":"close"}`, `{"type":"mcp","data":{"jsonrpc":"2.0","id":1,"method":"tools/list"}}`,
		`{"type":"state","data":{}}`, `[1,2]`, `not json`, `{"type":"bogus"}`, "{\"type\":\"step\",\"data\":{\"é\":\"\\u00e9\"}}", `{"type":"reset"} x`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, ferr := parseClientFrame(b)
		if ferr == nil {
			if _, ok := envelopeKeys[fr.Type]; !ok {
				t.Fatalf("accepted type %q", fr.Type)
			}
			if fr.Data != nil && firstByte(fr.Data) != '{' {
				t.Fatalf("accepted non-object data %q", fr.Data)
			}
			return
		}
		switch ferr.code {
		case openenv.CodeInvalidJSON:
			if json.Valid(b) && utf8.Valid(b) {
				t.Fatalf("valid JSON %q called invalid", b)
			}
		case openenv.CodeSessionError:
			if !json.Valid(b) || firstByte(b) == '{' {
				t.Fatalf("SESSION_ERROR for %q", b)
			}
		case openenv.CodeUnknownType:
		case openenv.CodeValidationError:
			if len(ferr.issues) == 0 {
				t.Fatal("VALIDATION_ERROR without issues")
			}
		default:
			t.Fatalf("unexpected code %s", ferr.code)
		}
		// The reply must always encode.
		if _, err := json.Marshal(errorFrame(ferr.code, ferr.message, map[string]any{"errors": ferr.issues})); err != nil {
			t.Fatal(err)
		}
	})
}

func TestPyDumps(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{`{"jsonrpc":"2.0","id":1,"result":{"data":"y","is_error":false}}`, `{"jsonrpc": "2.0", "id": 1, "result": {"data": "y", "is_error": false}}`},
		{`{"a":"x, y: \"z\"","b":[1,2]}`, `{"a": "x, y: \"z\"", "b": [1, 2]}`},
		{`{"é":"café 😀"}`, `{"\u00e9": "caf\u00e9 \ud83d\ude00"}`},
		{`{"k":"\\"}`, `{"k": "\\"}`},
		{`[]`, `[]`},
	} {
		got := pyDumps([]byte(tt.in))
		assert.Equal(t, tt.want, string(got))
		assert.JSONEq(t, tt.in, string(got))
	}
}
