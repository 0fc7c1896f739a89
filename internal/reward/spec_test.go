package reward

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSpecValidate(t *testing.T) {
	tests := []struct {
		name      string
		spec      Spec
		wantField string // "" = valid
		wantMsg   string
	}{
		{"env default", Spec{Name: "env", Kind: KindEnv}, "", ""},
		{"env with aggregation", Spec{Name: "env", Kind: KindEnv, Aggregation: "max", Weight: ptr(2.0)}, "", ""},
		{"expression", Spec{Name: "short", Kind: KindExpression, Expression: "1.0"}, "", ""},
		{"builtin overlong", Spec{Name: "o", Kind: KindBuiltin, Function: "overlong_penalty", MaxLength: 512, Cache: 64}, "", ""},
		{"builtin format", Spec{Name: "f", Kind: KindBuiltin, Function: "tool_call_format"}, "", ""},
		{"builtin length", Spec{Name: "l", Kind: KindBuiltin, Function: "length_penalty", MaxLength: 100}, "", ""},
		{"http", Spec{Name: "judge", Kind: KindHTTP, URL: "http://127.0.0.1:9000/score", Timeout: time.Second, Retries: ptr(0)}, "", ""},

		{"empty name", Spec{Kind: KindEnv}, "name", "letters, digits"},
		{"name with slash", Spec{Name: "a/b", Kind: KindEnv}, "name", `"a/b"`},
		{"unknown kind", Spec{Name: "x", Kind: "python"}, "kind", "allowed: env, expression, builtin, http"},
		{"bad aggregation", Spec{Name: "env", Kind: KindEnv, Aggregation: "median"}, "aggregation", "allowed: last, sum, max, mean"},
		{"aggregation on builtin", Spec{Name: "o", Kind: KindBuiltin, Function: "tool_call_format", Aggregation: "sum"}, "aggregation", "only env, expression and http"},
		{"NaN weight", Spec{Name: "env", Kind: KindEnv, Weight: ptr(nan())}, "weight", "NaN"},
		{"expression missing", Spec{Name: "e", Kind: KindExpression}, "expression", "required"},
		{"expression on env", Spec{Name: "env", Kind: KindEnv, Expression: "1.0"}, "expression", "not used by kind env"},
		{"unknown builtin", Spec{Name: "b", Kind: KindBuiltin, Function: "bleu"}, "function", "length_penalty, overlong_penalty, tool_call_format"},
		{"overlong without max_length", Spec{Name: "o", Kind: KindBuiltin, Function: "overlong_penalty", Cache: 4}, "max_length", "positive max_length"},
		{"overlong cache too big", Spec{Name: "o", Kind: KindBuiltin, Function: "overlong_penalty", MaxLength: 10, Cache: 11}, "cache", "0 < cache <= max_length (10)"},
		{"overlong without cache", Spec{Name: "o", Kind: KindBuiltin, Function: "overlong_penalty", MaxLength: 10}, "cache", "0 < cache"},
		{"length with cache", Spec{Name: "l", Kind: KindBuiltin, Function: "length_penalty", MaxLength: 10, Cache: 2}, "cache", "takes no cache"},
		{"format with max_length", Spec{Name: "f", Kind: KindBuiltin, Function: "tool_call_format", MaxLength: 10}, "max_length", "takes no max_length"},
		{"http without url", Spec{Name: "h", Kind: KindHTTP}, "url", "http:// or https://"},
		{"http ftp url", Spec{Name: "h", Kind: KindHTTP, URL: "ftp://x/score"}, "url", "http:// or https://"},
		{"http negative timeout", Spec{Name: "h", Kind: KindHTTP, URL: "http://x/", Timeout: -time.Second}, "timeout", "positive"},
		{"http negative retries", Spec{Name: "h", Kind: KindHTTP, URL: "http://x/", Retries: ptr(-1)}, "retries", "0 or more"},
		{"url on builtin", Spec{Name: "f", Kind: KindBuiltin, Function: "tool_call_format", URL: "http://x/"}, "url", "not used by kind builtin"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.spec.Validate(3)
			if tt.wantField == "" {
				require.NoError(t, err)
				return
			}
			var fe *FieldError
			require.True(t, errors.As(err, &fe), "want a *FieldError, got %v", err)
			assert.Equal(t, tt.wantField, fe.Field)
			assert.Equal(t, 3, fe.Index)
			assert.Contains(t, err.Error(), "rewards[3]")
			assert.Contains(t, err.Error(), "."+tt.wantField+": ")
			assert.Contains(t, err.Error(), tt.wantMsg)
		})
	}
}

func TestValidateSpecsDuplicateNames(t *testing.T) {
	err := ValidateSpecs([]Spec{
		{Name: "env", Kind: KindEnv},
		{Name: "bonus", Kind: KindExpression, Expression: "1.0"},
		{Name: "env", Kind: KindBuiltin, Function: "tool_call_format"},
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `rewards[2] (env).name: "env" is also the name of rewards[0]`)
}

func TestSpecDefaults(t *testing.T) {
	s := Spec{Name: "h", Kind: KindHTTP, URL: "http://x/"}
	assert.Equal(t, DefaultWeight, s.WeightValue())
	assert.Equal(t, DefaultHTTPTimeout, s.TimeoutValue())
	assert.Equal(t, DefaultHTTPRetries, s.RetriesValue())
	s.Weight, s.Timeout, s.Retries = ptr(0.0), time.Second, ptr(0)
	assert.Equal(t, 0.0, s.WeightValue(), "an explicit weight 0 is kept")
	assert.Equal(t, time.Second, s.TimeoutValue())
	assert.Equal(t, 0, s.RetriesValue())
	assert.Equal(t, []Spec{{Name: "env", Kind: KindEnv}}, DefaultSpecs())
}
