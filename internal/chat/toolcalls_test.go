package chat

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type wantCall struct{ name, args string }

// wantErr is one expected failed call: its kind and a fragment of its
// reason.
type wantErr struct {
	kind   ToolCallErrorKind
	reason string
}

func TestParseToolCalls(t *testing.T) {
	cases := []struct {
		name        string
		format      ToolCallFormat
		text        string
		wantContent string
		wantCalls   []wantCall
		wantErrs    []wantErr
	}{
		{"hermes single", FormatHermes,
			"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>",
			"", []wantCall{{"get_weather", `{"city": "Paris"}`}}, nil},
		{"hermes text around and two calls", FormatHermes,
			"Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 1}\"}\n</tool_call>",
			"Let me check.", []wantCall{{"a", `{}`}, {"b", `{"x": 1}`}}, nil},
		{"hermes unclosed last call", FormatHermes,
			"<tool_call>{\"name\": \"a\", \"arguments\": {\"q\": 1}}",
			"", []wantCall{{"a", `{"q": 1}`}}, nil},
		{"hermes missing arguments means {}", FormatHermes,
			"<tool_call>{\"name\": \"ping\"}</tool_call>", "", []wantCall{{"ping", `{}`}}, nil},
		{"hermes no calls", FormatHermes, "Just text.<|im_end|>\n", "Just text.", nil, nil},
		{"hermes bad json keeps good calls and the text after", FormatHermes,
			"<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{name: b}</tool_call>done",
			"done", []wantCall{{"a", `{}`}}, []wantErr{{Malformed, "not a JSON object"}}},
		{"hermes missing name", FormatHermes, "<tool_call>{\"arguments\": {}}</tool_call>", "", nil, []wantErr{{Malformed, `"name"`}}},
		{"hermes arguments not an object", FormatHermes,
			"<tool_call>{\"name\": \"a\", \"arguments\": [1]}</tool_call>", "", nil, []wantErr{{Malformed, "JSON object"}}},
		{"hermes close tag inside a string", FormatHermes,
			"<tool_call>\n{\"name\": \"echo\", \"arguments\": {\"s\": \"a </tool_call> b\"}}\n</tool_call>",
			"", []wantCall{{"echo", `{"s": "a </tool_call> b"}`}}, nil},
		{"hermes text after the object", FormatHermes,
			"<tool_call>{\"name\": \"a\"} trailing</tool_call><tool_call>{\"name\": \"b\"}</tool_call>",
			"", []wantCall{{"b", `{}`}}, []wantErr{{Malformed, "text after the JSON object"}}},
		{"hermes xml body is reported", FormatHermes,
			"<tool_call>\n<function=a>\n</function>\n</tool_call>", "", nil, []wantErr{{Malformed, "want a JSON object"}}},
		{"hermes every bad call is reported", FormatHermes,
			"<tool_call>{</tool_call><tool_call>{\"name\": \"\"}</tool_call><tool_call>[1]</tool_call>", "", nil,
			[]wantErr{{Malformed, "not a JSON object"}, {Malformed, `"name"`}, {Malformed, "want a JSON object"}}},
		{"llama3 json", FormatLlama3JSON,
			"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>",
			"", []wantCall{{"get_weather", `{"city": "Paris"}`}}, nil},
		{"llama3 python tag and two calls", FormatLlama3JSON,
			"<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"k\": \"v\"}}",
			"", []wantCall{{"a", `{}`}, {"b", `{"k": "v"}`}}, nil},
		{"llama3 plain text", FormatLlama3JSON, "The weather is fine.", "The weather is fine.", nil, nil},
		{"llama3 plain JSON answer", FormatLlama3JSON, `{"answer": 42}`, `{"answer": 42}`, nil, nil},
		{"llama3 JSON answer with a name", FormatLlama3JSON, `{"name": "Bob", "age": 3}`, `{"name": "Bob", "age": 3}`, nil, nil},
		{"llama3 braces in prose", FormatLlama3JSON, "{curly} prose", "{curly} prose", nil, nil},
		{"llama3 truncated call", FormatLlama3JSON, "{\"name\": \"a\", \"parameters\": {", "", nil, []wantErr{{Malformed, "not a JSON object"}}},
		{"llama3 second call truncated", FormatLlama3JSON, "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"par",
			"", []wantCall{{"a", `{}`}}, []wantErr{{Malformed, "not a JSON object"}}},
		{"llama3 python tag with a non-call", FormatLlama3JSON, `<|python_tag|>{"answer": 1}`, "", nil, []wantErr{{Malformed, `want {"name"`}}},
		{"mistral array", FormatMistral,
			"[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}, \"id\": \"abcdefghi\"}]</s>",
			"", []wantCall{{"a", `{"x": 1}`}}, nil},
		{"mistral array after a space", FormatMistral,
			"[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"s\": \"]\"}}, {\"name\": \"b\", \"arguments\": {}}]",
			"", []wantCall{{"a", `{"s": "]"}`}, {"b", `{}`}}, nil},
		{"mistral name args form", FormatMistral,
			"Sure.[TOOL_CALLS]a[ARGS]{\"x\": 1}[TOOL_CALLS]b[ARGS]{}",
			"Sure.", []wantCall{{"a", `{"x": 1}`}, {"b", `{}`}}, nil},
		{"mistral call id form", FormatMistral,
			"[TOOL_CALLS]a[CALL_ID]abc123xyz[ARGS]{\"x\": 1}",
			"", []wantCall{{"a", `{"x": 1}`}}, nil},
		{"mistral bad array", FormatMistral, "[TOOL_CALLS][{\"name\": ", "", nil, []wantErr{{Malformed, "JSON array"}}},
		{"mistral one bad of two", FormatMistral, "[TOOL_CALLS]a[ARGS]{\"x\": [TOOL_CALLS]b[ARGS]{}",
			"", []wantCall{{"b", `{}`}}, []wantErr{{Malformed, "not JSON"}}},
		{"qwen xml", FormatQwenXML,
			"Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"unit\": \"c\"}\n</parameter>\n</function>\n</tool_call><|im_end|>",
			"Checking.", []wantCall{{"get_weather", `{"city": "San Francisco", "days": 3, "opts": {"unit": "c"}}`}}, nil},
		{"qwen xml no parameters", FormatQwenXML, "<tool_call><function=ping></function></tool_call>", "", []wantCall{{"ping", `{}`}}, nil},
		{"qwen xml unclosed parameter", FormatQwenXML,
			"<tool_call><function=a><parameter=x>1</tool_call>", "", nil, []wantErr{{Malformed, "not closed"}}},
		{"qwen xml two functions in one wrapper", FormatQwenXML,
			"<tool_call>\n<function=a>\n<parameter=x>\n1\n</parameter>\n</function>\n<function=b>\n</function>\n</tool_call>",
			"", []wantCall{{"a", `{"x": 1}`}, {"b", `{}`}}, nil},
		{"qwen xml bare function", FormatQwenXML,
			"Let me look.\n<function=search>\n<parameter=q>\ncats\n</parameter>\n</function>",
			"Let me look.", []wantCall{{"search", `{"q": "cats"}`}}, nil},
		{"qwen xml closing tags inside a value", FormatQwenXML,
			"<tool_call>\n<function=echo>\n<parameter=s>\na </tool_call> b </parameter> c\n</parameter>\n</function>\n</tool_call>",
			"", []wantCall{{"echo", `{"s": "a </tool_call> b </parameter> c"}`}}, nil},
		{"qwen xml garbage inside the wrapper", FormatQwenXML,
			"<tool_call>{\"name\": \"a\"}</tool_call>after", "after", nil, []wantErr{{Malformed, "want <function=NAME>"}}},
		{"qwen xml duplicate parameter", FormatQwenXML,
			"<function=a><parameter=x>1</parameter><parameter=x>2</parameter></function>", "", nil, []wantErr{{SchemaViolation, "given twice"}}},
		{"deepseek v3", FormatDeepSeekV3,
			"Sure<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>b\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
			"Sure", []wantCall{{"get_weather", `{"city": "Paris"}`}, {"b", `{}`}}, nil},
		{"deepseek v3.1", FormatDeepSeekV3,
			"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"<｜tool▁call▁end｜>\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
			"", []wantCall{{"get_weather", `{"city": "<｜tool▁call▁end｜>"}`}}, nil},
		{"deepseek bad arguments", FormatDeepSeekV3,
			"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>{oops}<｜tool▁call▁end｜><｜tool▁call▁begin｜>b<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
			"", []wantCall{{"b", `{}`}}, []wantErr{{Malformed, "not JSON"}}},
		{"deepseek cut off", FormatDeepSeekV3, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>{\"x\": ", "", nil, []wantErr{{Malformed, "not JSON"}}},
		{"glm45", FormatGLM45,
			"Checking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call><tool_call>ping\n</tool_call>",
			"Checking.", []wantCall{{"get_weather", `{"city": "Paris", "days": 2}`}, {"ping", `{}`}}, nil},
		{"glm45 unclosed value", FormatGLM45, "<tool_call>a\n<arg_key>x</arg_key>\n<arg_value>1</tool_call>", "", nil, []wantErr{{Malformed, "not closed"}}},
		{"glm45 json body is reported", FormatGLM45, "<tool_call>{\"name\": \"a\"}</tool_call>", "", nil, []wantErr{{Malformed, "NAME"}}},
		{"minimax m2", FormatMiniMaxM2,
			"Ok.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n<parameter name=\"days\">2</parameter>\n</invoke>\n<invoke name=\"ping\">\n</invoke>\n</minimax:tool_call>[e~[",
			"Ok.", []wantCall{{"get_weather", `{"city": "Paris", "days": 2}`}, {"ping", `{}`}}, nil},
		{"minimax bad invoke", FormatMiniMaxM2, "<minimax:tool_call><invoke name=get>\n</invoke></minimax:tool_call>", "", nil, []wantErr{{Malformed, "invoke"}}},
		{"kimi k2", FormatKimiK2,
			"Let me see.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.ping:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|><|im_end|>",
			"Let me see.", []wantCall{{"get_weather", `{"city": "Paris"}`}, {"ping", `{}`}}, nil},
		{"kimi bad arguments", FormatKimiK2,
			"<|tool_calls_section_begin|><|tool_call_begin|>functions.a:0<|tool_call_argument_begin|>{x}<|tool_call_end|><|tool_calls_section_end|>", "", nil, []wantErr{{Malformed, "not JSON"}}},
		{"none format", FormatNone, "<tool_call>{}</tool_call>", "<tool_call>{}</tool_call>", nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := ParseToolCallsFor(tc.format, tc.text, nil)
			require.Len(t, p.Errors, len(tc.wantErrs), "errors: %v", p.Err())
			for i, w := range tc.wantErrs {
				assert.Equal(t, w.kind, p.Errors[i].Kind, p.Errors[i].Error())
				assert.Contains(t, p.Errors[i].Reason, w.reason)
			}
			assert.Equal(t, tc.wantContent, p.Content)
			require.Len(t, p.Calls, len(tc.wantCalls))
			for i, w := range tc.wantCalls {
				assert.Equal(t, w.name, p.Calls[i].Name)
				assert.JSONEq(t, w.args, string(p.Calls[i].Arguments))
			}

			content, calls, err := ParseToolCalls(tc.format, tc.text)
			assert.Equal(t, p.Content, content)
			assert.Equal(t, p.Calls, calls)
			if len(tc.wantErrs) == 0 {
				assert.NoError(t, err)
				return
			}
			var tcErr *ToolCallError
			require.True(t, errors.As(err, &tcErr), "want *ToolCallError, got %v", err)
			assert.Equal(t, p.Errors[0], tcErr)
		})
	}
}

func TestParseToolCallsIDs(t *testing.T) {
	p := ParseToolCallsFor(FormatKimiK2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.a:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>", nil)
	require.Len(t, p.Calls, 1)
	assert.Equal(t, "functions.a:0", p.Calls[0].ID)
	p = ParseToolCallsFor(FormatMistral, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}, \"id\": \"abcdefghi\"}]", nil)
	require.Len(t, p.Calls, 1)
	assert.Equal(t, "abcdefghi", p.Calls[0].ID)
	p = ParseToolCallsFor(FormatHermes, "<tool_call>{</tool_call><tool_call>{\"name\": \"b\"}</tool_call><tool_call>{\"name\": 1}</tool_call>", nil)
	require.Len(t, p.Errors, 2)
	assert.Equal(t, []int{0, 2}, []int{p.Errors[0].Index, p.Errors[1].Index})
}

// probeTool has one property of each JSON Schema type.
var probeTool = Tool{Name: "probe", Parameters: json.RawMessage(`{"type": "object", "properties": {
	"text": {"type": "string"}, "count": {"type": "integer"}, "ratio": {"type": "number"},
	"flag": {"type": "boolean"}, "opts": {"type": "object"}, "tags": {"type": "array", "items": {"type": "string"}},
	"mode": {"type": "string", "enum": ["fast", "slow"]}, "level": {"enum": [1, 2, "max"]},
	"maybe": {"anyOf": [{"type": "integer"}, {"type": "null"}]}, "either": {"anyOf": [{"type": "boolean"}, {"type": "string"}]}, "free": {}},
	"required": ["text"]}`)}

var strictTool = Tool{Name: "strict", Parameters: json.RawMessage(`{"type": "object", "properties": {"a": {"type": "string"}, "n": {"type": ["integer", "null"]}}, "additionalProperties": false}`)}

func TestParseToolCallsForSchemaTyping(t *testing.T) {
	xml := func(name string, kv ...string) string {
		var b strings.Builder
		b.WriteString("<tool_call>\n<function=" + name + ">\n")
		for i := 0; i < len(kv); i += 2 {
			b.WriteString("<parameter=" + kv[i] + ">\n" + kv[i+1] + "\n</parameter>\n")
		}
		b.WriteString("</function>\n</tool_call>")
		return b.String()
	}
	tools := []Tool{probeTool, strictTool}
	cases := []struct {
		name      string
		text      string
		wantArgs  string
		violation string
	}{
		{"string stays string", xml("probe", "text", "42"), `{"text": "42"}`, ""},
		{"strings that look like other types", xml("probe", "text", "true", "mode", "fast"), `{"text": "true", "mode": "fast"}`, ""},
		{"string null and decimal", xml("probe", "text", "null", "either", "1.10"), `{"text": "null", "either": "1.10"}`, ""},
		{"typed values", xml("probe", "text", " x ", "count", "-7", "ratio", "1.10", "flag", "True", "opts", `{"a": [1]}`, "tags", `["x"]`),
			`{"text": " x ", "count": -7, "ratio": 1.10, "flag": true, "opts": {"a": [1]}, "tags": ["x"]}`, ""},
		{"nullable integer", xml("probe", "text", "a", "maybe", "None"), `{"text": "a", "maybe": null}`, ""},
		{"untyped enum", xml("probe", "text", "a", "level", "2", "either", "false"), `{"text": "a", "level": 2, "either": false}`, ""},
		{"untyped enum string", xml("probe", "text", "a", "level", "max"), `{"text": "a", "level": "max"}`, ""},
		{"free property is JSON when it parses", xml("probe", "text", "a", "free", "1.5"), `{"text": "a", "free": 1.5}`, ""},
		{"unknown property of an open schema", xml("probe", "text", "a", "extra", "[1]"), `{"text": "a", "extra": [1]}`, ""},
		{"unknown tool stays untyped", xml("other", "n", "42"), `{"n": 42}`, ""},
		{"multi-line string", xml("probe", "text", "line 1\n\nline 3\n"), `{"text": "line 1\n\nline 3\n"}`, ""},
		{"integer with a zero fraction", xml("probe", "text", "a", "count", "-3.00"), `{"text": "a", "count": -3}`, ""},
		{"integer with a fraction", xml("probe", "text", "a", "count", "1.5"), "", `parameter "count": want integer, got "1.5"`},
		{"not a number", xml("probe", "text", "a", "ratio", "many"), "", `parameter "ratio": want number`},
		{"boolean spelled yes", xml("probe", "text", "a", "flag", "yes"), "", `parameter "flag": want boolean`},
		{"python dict is not JSON", xml("probe", "text", "a", "opts", "{'a': 1}"), "", `parameter "opts": want object`},
		{"enum", xml("probe", "text", "a", "mode", "medium"), "", `parameter "mode": want one of "fast", "slow", got "medium"`},
		{"missing required", xml("probe", "count", "1"), "", `missing required parameter "text"`},
		{"type list", xml("strict", "a", "x", "n", "null"), `{"a": "x", "n": null}`, ""},
		{"type list integer", xml("strict", "n", "12"), `{"n": 12}`, ""},
		{"closed schema", xml("strict", "a", "x", "b", "y"), "", `unknown parameter "b" (the tool takes: a, n)`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := ParseToolCallsFor(FormatQwenXML, tc.text, tools)
			if tc.violation != "" {
				require.Empty(t, p.Calls, "a violating call is not executed")
				require.Len(t, p.Errors, 1)
				assert.Equal(t, SchemaViolation, p.Errors[0].Kind)
				assert.Contains(t, p.Errors[0].Reason, tc.violation)
				assert.NotEmpty(t, p.Errors[0].Name)
				assert.Contains(t, p.Errors[0].Error(), "does not match the tool's schema")
				return
			}
			require.NoError(t, p.Err())
			require.Len(t, p.Calls, 1)
			assert.JSONEq(t, tc.wantArgs, string(p.Calls[0].Arguments))
			if tc.name == "typed values" {
				assert.Contains(t, string(p.Calls[0].Arguments), `"ratio": 1.10`, "numbers keep their spelling")
			}
		})
	}
	// The same typing applies to GLM-4.5 and MiniMax-M2, without newline trimming.
	p := ParseToolCallsFor(FormatGLM45, "<tool_call>probe\n<arg_key>text</arg_key>\n<arg_value>\n42</arg_value>\n<arg_key>count</arg_key>\n<arg_value>42</arg_value>\n</tool_call>", tools)
	require.NoError(t, p.Err())
	require.Len(t, p.Calls, 1)
	assert.JSONEq(t, `{"text": "\n42", "count": 42}`, string(p.Calls[0].Arguments))
	p = ParseToolCallsFor(FormatMiniMaxM2, "<minimax:tool_call>\n<invoke name=\"probe\">\n<parameter name=\"text\">null</parameter>\n<parameter name=\"flag\">1</parameter>\n</invoke>\n</minimax:tool_call>", tools)
	require.Len(t, p.Errors, 1)
	assert.Contains(t, p.Errors[0].Reason, `parameter "flag": want boolean, got "1"`)
}

// templateFormats is the format detected from each fixture template.
var templateFormats = map[string]ToolCallFormat{
	"qwen2.5/chat_template.jinja":                                 FormatHermes,
	"qwen3/chat_template.jinja":                                   FormatHermes,
	"qwen3/chat_template.2025-04-original.jinja":                  FormatHermes,
	"llama.cpp/NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": FormatHermes,
	"llama.cpp/meta-llama-Llama-3.1-8B-Instruct.jinja":            FormatLlama3JSON,
	"llama.cpp/meta-llama-Llama-3.2-3B-Instruct.jinja":            FormatLlama3JSON,
	"llama.cpp/mistralai-Mistral-Nemo-Instruct-2407.jinja":        FormatMistral,
	"extra/mistralai-Mistral-Small-3.1-24B-Instruct-2503.jinja":   FormatMistral,
	"llama.cpp/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja":    FormatDeepSeekV3,
	"extra/deepseek-ai-DeepSeek-V3.1.jinja":                       FormatDeepSeekV3,
	"extra/glm_4_5.jinja":                                         FormatGLM45,
	"extra/unsloth-MiniMax-M2.jinja":                              FormatMiniMaxM2,
	"llama.cpp/google-gemma-2-2b-it.jinja":                        FormatNone,
	"llama.cpp/microsoft-Phi-3.5-mini-instruct.jinja":             FormatNone,
}

func readTemplateFixture(t *testing.T, path string) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("../../testdata/chat-templates", path))
	require.NoError(t, err)
	return string(src)
}

func TestDetectToolCallFormat(t *testing.T) {
	for path, want := range templateFormats {
		t.Run(path, func(t *testing.T) {
			got, err := DetectToolCallFormat(readTemplateFixture(t, path))
			assert.Equal(t, want, got)
			if want != FormatNone {
				require.NoError(t, err)
				return
			}
			var unknown *UnknownToolCallFormatError
			require.True(t, errors.As(err, &unknown), "got %v", err)
			assert.Contains(t, err.Error(), "chat.tool_call_format")
			assert.Contains(t, err.Error(), "hermes, llama3_json, mistral, qwen_xml, deepseek_v3, glm45, minimax_m2, kimi_k2")
		})
	}
	// Formats without a fixture template: the markers their templates write.
	for src, want := range map[string]ToolCallFormat{
		"<tool_call>\n<function={{ name }}>\n<parameter={{ k }}>":                                                FormatQwenXML,
		"{{- '<|tool_calls_section_begin|>' }}{{ '<|tool_call_begin|>' + id + '<|tool_call_argument_begin|>' }}": FormatKimiK2,
	} {
		got, err := DetectToolCallFormat(src)
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
	for _, name := range ToolCallFormatNames() {
		f, err := ParseToolCallFormat(name)
		require.NoError(t, err)
		assert.Equal(t, name, f.String())
	}
	_, err := ParseToolCallFormat("xml")
	assert.ErrorContains(t, err, "allowed: none, hermes, llama3_json, mistral, qwen_xml, deepseek_v3, glm45, minimax_m2, kimi_k2")
}
