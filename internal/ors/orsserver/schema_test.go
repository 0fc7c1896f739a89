package orsserver

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type RichParams struct {
	Query    string   `json:"query" desc:"what to look for"`
	MaxItems int      `json:"max_items"`
	Scale    float64  `json:"scale,omitempty"`
	Tags     []string `json:"tags,omitempty"`
	Strict   *bool    `json:"strict"`
	Hidden   string   `json:"-"`
	private  int
}

func TestSchemaFor(t *testing.T) {
	s, err := SchemaFor[RichParams]()
	require.NoError(t, err)
	assert.Equal(t, `{"properties":{`+
		`"query":{"description":"what to look for","title":"Query","type":"string"},`+
		`"max_items":{"title":"Max Items","type":"integer"},`+
		`"scale":{"default":0,"title":"Scale","type":"number"},`+
		`"tags":{"default":null,"items":{"type":"string"},"title":"Tags","type":"array"},`+
		`"strict":{"anyOf":[{"type":"boolean"},{"type":"null"}],"default":null,"title":"Strict"}},`+
		`"required":["query","max_items"],"title":"RichParams","type":"object"}`, string(s))
	_, err = SchemaFor[int]()
	require.Error(t, err)
}

func TestDecodeParams(t *testing.T) {
	_, fields, err := schemaFor[RichParams]()
	require.NoError(t, err)
	tests := []struct {
		name, input string
		want        RichParams
		errPrefix   string
	}{
		{name: "full", input: `{"query":"q","max_items":3,"scale":0.5,"tags":["a"],"strict":true}`,
			want: RichParams{Query: "q", MaxItems: 3, Scale: 0.5, Tags: []string{"a"}, Strict: ptr(true)}},
		{name: "lax numbers", input: `{"query":"q","max_items":"4","scale":"2.5"}`, want: RichParams{Query: "q", MaxItems: 4, Scale: 2.5}},
		{name: "integral float", input: `{"query":"q","max_items":5.0}`, want: RichParams{Query: "q", MaxItems: 5}},
		{name: "optional null", input: `{"query":"q","max_items":1,"strict":null}`, want: RichParams{Query: "q", MaxItems: 1}},
		{name: "extra keys ignored", input: `{"query":"q","max_items":1,"zzz":[]}`, want: RichParams{Query: "q", MaxItems: 1}},
		{name: "missing", input: `{"query":"q"}`, errPrefix: "Tool input validation error: [{'type': 'missing', 'loc': ('max_items',), 'msg': 'Field required', 'input': {'query': 'q'}}]"},
		{name: "number for string", input: `{"query":5,"max_items":1}`, errPrefix: "Tool input validation error: [{'type': 'string_type', 'loc': ('query',)"},
		{name: "fractional int", input: `{"query":"q","max_items":1.5}`, errPrefix: "Tool input validation error: [{'type': 'int_from_float'"},
		{name: "bad bool", input: `{"query":"q","max_items":1,"strict":"yes"}`, errPrefix: "Tool input validation error: [{'type': 'bool_type'"},
		{name: "not a list", input: `{"query":"q","max_items":1,"tags":"a"}`, errPrefix: "Tool input validation error: [{'type': 'list_type'"},
		{name: "wrong list items", input: `{"query":"q","max_items":1,"tags":[1]}`, errPrefix: "Tool input validation error: [{'type': 'value_error'"},
		{name: "not an object", input: `[1]`, errPrefix: "Tool input validation error: [{'type': 'model_type'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got RichParams
			err := decodeParams(json.RawMessage(tt.input), fields, &got)
			if tt.errPrefix != "" {
				var ie *InputError
				require.ErrorAs(t, err, &ie)
				assert.Contains(t, err.Error(), tt.errPrefix)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func ptr[T any](v T) *T { return &v }
