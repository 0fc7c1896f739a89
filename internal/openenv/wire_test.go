package openenv

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseFrame(t *testing.T) {
	tests := []struct {
		name, frame string
		typ         string
		code        ErrorCode
		protocol    string // substring of the *ProtocolError
	}{
		{"observation", `{"type":"observation","data":{"observation":{},"reward":0.0,"done":false}}`, FrameObservation, "", ""},
		{"state", `{"type":"state","data":{"episode_id":null,"step_count":0}}`, FrameState, "", ""},
		{"mcp", `{"type":"mcp","data":{"jsonrpc":"2.0","id":1,"result":{}}}`, FrameMCP, "", ""},
		{"capacity", `{"type":"error","data":{"message":"Server at capacity: 4/4 sessions active. Cannot accept new connections.","code":"CAPACITY_REACHED","active_sessions":4,"max_sessions":4}}`, "", CodeCapacityReached, ""},
		{"validation", `{"type":"error","data":{"message":"Invalid message","code":"VALIDATION_ERROR","errors":[{"type":"missing","loc":["tool_name"],"msg":"Field required","input":{}}]}}`, "", CodeValidationError, ""},
		{"spaces", " \n{\"type\":\"state\",\"data\":{}}\n", FrameState, "", ""},
		{"not an object", `[1]`, "", "", "not a JSON object"},
		{"empty", ``, "", "", "not a JSON object"},
		{"bad json", `{"type":`, "", "", "not valid JSON"},
		{"unknown type", `{"type":"bogus","data":{}}`, "", "", `unknown frame type "bogus"`},
		{"no data", `{"type":"observation"}`, "", "", "observation frame has no data"},
		{"null data", `{"type":"state","data":null}`, "", "", "state frame has no data"},
		{"error without code", `{"type":"error","data":{"message":"x"}}`, "", "", "error frame without a code"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := ParseFrame([]byte(tt.frame))
			switch {
			case tt.typ != "":
				require.NoError(t, err)
				assert.Equal(t, tt.typ, f.Type)
			case tt.code != "":
				var se *ServerError
				require.ErrorAs(t, err, &se)
				assert.Equal(t, tt.code, se.Code)
			default:
				var pe *ProtocolError
				require.ErrorAs(t, err, &pe)
				assert.Contains(t, pe.Detail, tt.protocol)
			}
		})
	}
	_, err := ParseFrame([]byte(tests[3].frame))
	var se *ServerError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, ServerError{Code: CodeCapacityReached, Message: "Server at capacity: 4/4 sessions active. Cannot accept new connections.", ActiveSessions: 4, MaxSessions: 4}, *se)
	assert.True(t, se.Code.EndsSession())
}

func TestErrorCodesEndSession(t *testing.T) {
	for code, ends := range map[ErrorCode]bool{
		CodeInvalidJSON: false, CodeUnknownType: false, CodeValidationError: false, CodeExecutionError: false,
		CodeCapacityReached: true, CodeFactoryError: true, CodeSessionError: true, "SOMETHING_NEW": true,
	} {
		assert.Equal(t, ends, code.EndsSession(), code)
		assert.Equal(t, ends, IsInfrastructure(&ServerError{Code: code}), code)
	}
	assert.False(t, IsInfrastructure(nil))
	assert.False(t, IsInfrastructure(&RPCError{Code: RPCInternalError}))
	assert.True(t, IsInfrastructure(&RPCError{Code: RPCCapacity}))
	assert.True(t, IsInfrastructure(&HTTPError{Status: 503}))
	assert.False(t, IsInfrastructure(&HTTPError{Status: 422}))
	assert.True(t, IsInfrastructure(ErrSessionClosed))
	assert.True(t, errors.Is(&TimeoutError{Op: "x"}, errDeadline()))
}

func errDeadline() error {
	var te TimeoutError
	return te.Unwrap()
}

func TestToolDecodesBothSchemaSpellings(t *testing.T) {
	var a, b Tool
	require.NoError(t, json.Unmarshal([]byte(`{"name":"x","description":"d","input_schema":{"type":"object"}}`), &a))
	require.NoError(t, json.Unmarshal([]byte(`{"name":"x","title":null,"description":"d","inputSchema":{"type":"object"},"outputSchema":null}`), &b))
	assert.Equal(t, a, b)
	assert.JSONEq(t, `{"type":"object"}`, string(a.InputSchema))
}

// FuzzParseFrame: any bytes give a frame of a known type with data, a
// *ServerError with a code, or a *ProtocolError; never a panic.
func FuzzParseFrame(f *testing.F) {
	for _, seed := range []string{
		`{"type":"observation","data":{"observation":{"hint":"start"},"reward":0.0,"done":false}}`,
		`{"type":"error","data":{"message":"m","code":"VALIDATION_ERROR","errors":[{"type":"missing","loc":["a",0],"msg":"x","input":null}]}}`,
		`{"type":"error","data":{"message":"m","code":"CAPACITY_REACHED","active_sessions":1,"max_sessions":1}}`,
		`{"type":"mcp","data":{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error","data":null}}}`,
		`{"type":"state","data":{}}`, `[1,2]`, `not json`, `{"type":null}`, `{"type":"error","data":[]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := ParseFrame(b)
		if err == nil {
			switch fr.Type {
			case FrameObservation, FrameState, FrameMCP:
			default:
				t.Fatalf("accepted frame type %q", fr.Type)
			}
			if !json.Valid(fr.Data) {
				t.Fatalf("accepted invalid data %q", fr.Data)
			}
			if fr.Type == FrameObservation {
				_, _ = decodeStep(fr.Data)
			}
			return
		}
		var se *ServerError
		var pe *ProtocolError
		switch {
		case errors.As(err, &se):
			if se.Code == "" {
				t.Fatal("server error without code")
			}
			_ = se.Error()
		case errors.As(err, &pe):
			_ = pe.Error()
		default:
			t.Fatalf("untyped error %T: %v", err, err)
		}
	})
}
