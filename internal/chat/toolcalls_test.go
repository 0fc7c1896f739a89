package chat

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type wantCall struct{ name, args string }

func TestParseToolCalls(t *testing.T) {
	cases := []struct {
		name        string
		format      ToolCallFormat
		text        string
		wantContent string
		wantCalls   []wantCall
		wantErr     bool
	}{
		{"hermes single", FormatHermes,
			"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>",
			"", []wantCall{{"get_weather", `{"city": "Paris"}`}}, false},
		{"hermes text around and two calls", FormatHermes,
			"Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 1}\"}\n</tool_call>",
			"Let me check.", []wantCall{{"a", `{}`}, {"b", `{"x": 1}`}}, false},
		{"hermes unclosed last call", FormatHermes,
			"<tool_call>{\"name\": \"a\", \"arguments\": {\"q\": 1}}",
			"", []wantCall{{"a", `{"q": 1}`}}, false},
		{"hermes missing arguments means {}", FormatHermes,
			"<tool_call>{\"name\": \"ping\"}</tool_call>", "", []wantCall{{"ping", `{}`}}, false},
		{"hermes no calls", FormatHermes, "Just text.<|im_end|>\n", "Just text.", nil, false},
		{"hermes bad json keeps good calls", FormatHermes,
			"<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{name: b}</tool_call>",
			"", []wantCall{{"a", `{}`}}, true},
		{"hermes missing name", FormatHermes, "<tool_call>{\"arguments\": {}}</tool_call>", "", nil, true},
		{"hermes arguments not an object", FormatHermes,
			"<tool_call>{\"name\": \"a\", \"arguments\": [1]}</tool_call>", "", nil, true},
		{"llama3 json", FormatLlama3JSON,
			"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>",
			"", []wantCall{{"get_weather", `{"city": "Paris"}`}}, false},
		{"llama3 python tag and two calls", FormatLlama3JSON,
			"<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"k\": \"v\"}}",
			"", []wantCall{{"a", `{}`}, {"b", `{"k": "v"}`}}, false},
		{"llama3 plain text", FormatLlama3JSON, "The weather is fine.", "The weather is fine.", nil, false},
		{"llama3 truncated json", FormatLlama3JSON, "{\"name\": \"a\", \"parameters\": {", "", nil, true},
		{"mistral array", FormatMistral,
			"[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}, \"id\": \"abcdefghi\"}]</s>",
			"", []wantCall{{"a", `{"x": 1}`}}, false},
		{"mistral name args form", FormatMistral,
			"Sure.[TOOL_CALLS]a[ARGS]{\"x\": 1}[TOOL_CALLS]b[ARGS]{}",
			"Sure.", []wantCall{{"a", `{"x": 1}`}, {"b", `{}`}}, false},
		{"mistral bad array", FormatMistral, "[TOOL_CALLS][{\"name\": ", "", nil, true},
		{"qwen xml", FormatQwenXML,
			"Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"unit\": \"c\"}\n</parameter>\n</function>\n</tool_call><|im_end|>",
			"Checking.", []wantCall{{"get_weather", `{"city": "San Francisco", "days": 3, "opts": {"unit": "c"}}`}}, false},
		{"qwen xml no parameters", FormatQwenXML, "<tool_call><function=ping></function></tool_call>", "", []wantCall{{"ping", `{}`}}, false},
		{"qwen xml unclosed parameter", FormatQwenXML,
			"<tool_call><function=a><parameter=x>1</tool_call>", "", nil, true},
		{"none format", FormatNone, "<tool_call>{}</tool_call>", "<tool_call>{}</tool_call>", nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			content, calls, err := ParseToolCalls(tc.format, tc.text)
			if tc.wantErr {
				var tcErr *ToolCallError
				require.True(t, errors.As(err, &tcErr), "want *ToolCallError, got %v", err)
				assert.NotEmpty(t, tcErr.Reason)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.wantContent, content)
			require.Len(t, calls, len(tc.wantCalls))
			for i, w := range tc.wantCalls {
				assert.Equal(t, w.name, calls[i].Name)
				assert.JSONEq(t, w.args, string(calls[i].Arguments))
			}
		})
	}
}

func TestDetectToolCallFormat(t *testing.T) {
	cases := map[string]ToolCallFormat{
		"qwen2.5/chat_template.jinja":                                 FormatHermes,
		"qwen3/chat_template.jinja":                                   FormatHermes,
		"llama.cpp/NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": FormatHermes,
		"llama.cpp/meta-llama-Llama-3.1-8B-Instruct.jinja":            FormatLlama3JSON,
		"llama.cpp/meta-llama-Llama-3.2-3B-Instruct.jinja":            FormatLlama3JSON,
		"llama.cpp/mistralai-Mistral-Nemo-Instruct-2407.jinja":        FormatMistral,
		"llama.cpp/google-gemma-2-2b-it.jinja":                        FormatNone,
		"llama.cpp/microsoft-Phi-3.5-mini-instruct.jinja":             FormatNone,
	}
	for path, want := range cases {
		src, err := os.ReadFile(filepath.Join("../../testdata/chat-templates", path))
		require.NoError(t, err)
		assert.Equal(t, want, DetectToolCallFormat(string(src)), path)
	}
	assert.Equal(t, FormatQwenXML, DetectToolCallFormat("<tool_call>\n<function={{ name }}>\n<parameter={{ k }}>"))
	for _, name := range []string{"hermes", "llama3_json", "mistral", "qwen_xml", "none"} {
		f, err := ParseToolCallFormat(name)
		require.NoError(t, err)
		assert.Equal(t, name, f.String())
	}
	_, err := ParseToolCallFormat("xml")
	assert.ErrorContains(t, err, "allowed: none, hermes, llama3_json, mistral, qwen_xml")
}

// FuzzParseToolCalls checks that no input makes a parser panic, and that
// every returned call has a name and object arguments.
func FuzzParseToolCalls(f *testing.F) {
	seeds := []string{
		"<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>",
		"<tool_call>{\"name\": \"a\", \"arguments\": \"{\\\"x\\\"\"}</tool_call><tool_call>",
		"<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": 1}",
		"[TOOL_CALLS][{\"name\": \"a\", \"arguments\": null}]",
		"[TOOL_CALLS]a[ARGS]{\"x\": [1, 2]}[TOOL_CALLS][ARGS]",
		"text<|im_end|><|eot_id|>",
		"<tool_call><function=f><parameter=a>\n[1, 2]\n</parameter></function></tool_call>",
		"<tool_call><function=><parameter=>x", "{", "<tool_call>", "[TOOL_CALLS]", "",
	}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		for _, format := range []ToolCallFormat{FormatNone, FormatHermes, FormatLlama3JSON, FormatMistral, FormatQwenXML} {
			_, calls, err := ParseToolCalls(format, text)
			if err != nil {
				var tcErr *ToolCallError
				if !errors.As(err, &tcErr) {
					t.Fatalf("format %s: error is %T, want *ToolCallError", format, err)
				}
			}
			for _, c := range calls {
				if c.Name == "" {
					t.Fatalf("format %s: call without a name", format)
				}
				var obj map[string]json.RawMessage
				if json.Unmarshal(c.Arguments, &obj) != nil {
					t.Fatalf("format %s: arguments %q are not an object", format, c.Arguments)
				}
			}
		}
	})
}
