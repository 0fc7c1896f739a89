package chat

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// Adversarial inputs per format: the findings, cut-off calls,
// markers inside strings, nested and repeated wrappers. They seed the fuzz
// targets below.
var fuzzSeeds = map[ToolCallFormat][]string{
	FormatHermes: {
		"<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>",
		"<tool_call>{\"name\": \"a\", \"arguments\": \"{\\\"x\\\"\"}</tool_call><tool_call>",
		"<tool_call>{\"name\": \"e\", \"arguments\": {\"s\": \"</tool_call>\"}}</tool_call>",
		"<tool_call><tool_call>{}</tool_call></tool_call>", "<tool_call>{\"name\": \"a\"} x</tool_call>", "<tool_call>",
	},
	FormatLlama3JSON: {
		"<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": 1}", `{"answer": 42}`, "{", "{\"name\": \"a\", \"parameters\": {}} tail",
		"<|python_tag|>", "{\"name\": \"a\", \"arguments\": \"{}\"};;{\"name\": \"b\", \"parameters\": null}",
	},
	FormatMistral: {
		"[TOOL_CALLS][{\"name\": \"a\", \"arguments\": null}]", "[TOOL_CALLS]a[ARGS]{\"x\": [1, 2]}[TOOL_CALLS][ARGS]",
		"[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}, \"id\": 5}] after", "[TOOL_CALLS]a[CALL_ID][ARGS]{}", "[TOOL_CALLS]",
	},
	FormatQwenXML: {
		"<tool_call><function=f><parameter=a>\n[1, 2]\n</parameter></function></tool_call>",
		"<tool_call><function=><parameter=>x", "<function=a><parameter=s>\n</parameter>\n</parameter>\n</function>",
		"<tool_call>\n<function=a>\n</function>\n<function=b>\n<parameter=x>1</parameter></function></tool_call>",
		"<function=a<parameter=b>>", "<tool_call><tool_call><function=a></function>",
	},
	FormatDeepSeekV3: {
		"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>a\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
		"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>{\"s\": \"<｜tool▁call▁end｜>\"}<｜tool▁call▁end｜>",
		"<｜tool▁call▁begin｜>a<｜tool▁sep｜>", "<｜tool▁calls▁begin｜><｜tool▁calls▁end｜><｜tool▁sep｜>",
	},
	FormatGLM45: {
		"<tool_call>a\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n</tool_call>",
		"<tool_call>a<arg_key>k</arg_key><arg_value></arg_value></arg_value></tool_call>", "<tool_call>a<arg_key>", "<tool_call>\n</tool_call>",
	},
	FormatMiniMaxM2: {
		"<minimax:tool_call>\n<invoke name=\"a\">\n<parameter name=\"k\">v</parameter>\n</invoke>\n</minimax:tool_call>",
		"<minimax:tool_call><invoke name=\"a\"><parameter name=\"\">", "<minimax:tool_call><invoke name=\"a\">>", "<minimax:tool_call>",
	},
	FormatKimiK2: {
		"<|tool_calls_section_begin|><|tool_call_begin|>functions.a:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
		"<|tool_calls_section_begin|><|tool_call_begin|>:<|tool_call_argument_begin|>", "<|tool_calls_section_begin|>x<|tool_calls_section_end|>",
	},
}

// fuzzParser checks the invariants every parser keeps on any input: no
// panic; every call has a tool name and object arguments; every failure
// has a reason; calls and failures are numbered once each, in order.
func fuzzParser(f *testing.F, format ToolCallFormat) {
	for _, seeds := range fuzzSeeds {
		for _, s := range seeds {
			f.Add(s)
		}
	}
	f.Add("text<|im_end|><|eot_id|>")
	f.Add("")
	tools := []Tool{probeTool, strictTool, lookupTool}
	f.Fuzz(func(t *testing.T, text string) {
		for _, offered := range [][]Tool{nil, tools} {
			p := ParseToolCallsFor(format, text, offered)
			for _, c := range p.Calls {
				if c.Name == "" {
					t.Fatalf("call without a name in %q", text)
				}
				var obj map[string]json.RawMessage
				if json.Unmarshal(c.Arguments, &obj) != nil {
					t.Fatalf("arguments %q are not an object (input %q)", c.Arguments, text)
				}
			}
			total := len(p.Calls) + len(p.Errors)
			last := -1
			for _, e := range p.Errors {
				if e.Reason == "" || e.Format != format {
					t.Fatalf("error without a reason or with format %s: %v", e.Format, e)
				}
				if e.Index <= last || e.Index >= total {
					t.Fatalf("error index %d out of order (total %d) in %q", e.Index, total, text)
				}
				last = e.Index
			}
			if total == 0 && p.Content != strings.TrimSpace(stripEndMarkers(text)) {
				t.Fatalf("no call found, but the content %q is not the text %q", p.Content, text)
			}
		}
	})
}

func FuzzParseHermes(f *testing.F)     { fuzzParser(f, FormatHermes) }
func FuzzParseLlama3JSON(f *testing.F) { fuzzParser(f, FormatLlama3JSON) }
func FuzzParseMistral(f *testing.F)    { fuzzParser(f, FormatMistral) }
func FuzzParseQwenXML(f *testing.F)    { fuzzParser(f, FormatQwenXML) }
func FuzzParseDeepSeekV3(f *testing.F) { fuzzParser(f, FormatDeepSeekV3) }
func FuzzParseGLM45(f *testing.F)      { fuzzParser(f, FormatGLM45) }
func FuzzParseMiniMaxM2(f *testing.F)  { fuzzParser(f, FormatMiniMaxM2) }
func FuzzParseKimiK2(f *testing.F)     { fuzzParser(f, FormatKimiK2) }

// FuzzToolCallStringRoundTrip writes a string argument the way each
// template does and parses it back: any string survives, closing tags
// included, unless it holds the exact closing sequence that ends a value
// in that format.
func FuzzToolCallStringRoundTrip(f *testing.F) {
	for _, s := range []string{"42", "true", "null", "1.10", "a </tool_call> b", "</parameter>", " x\n", "ünï 世界 🦙", "", "\n\n", "</arg_value>\n<arg_key>"} {
		f.Add(s)
	}
	tools := []Tool{lookupTool}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		hermesArgs := `{"q": ` + string(jsonString(s)) + `}`
		cases := []struct {
			format    ToolCallFormat
			text      string
			ambiguous bool
		}{
			{FormatHermes, "<tool_call>\n{\"name\": \"lookup\", \"arguments\": " + hermesArgs + "}\n</tool_call>", false},
			{FormatQwenXML, "<tool_call>\n<function=lookup>\n<parameter=q>\n" + s + "\n</parameter>\n</function>\n</tool_call>",
				strings.Contains(s, "</parameter>")},
			{FormatGLM45, "<tool_call>lookup\n<arg_key>q</arg_key>\n<arg_value>" + s + "</arg_value>\n</tool_call>",
				strings.Contains(s, "</arg_value>")},
			{FormatMiniMaxM2, "<minimax:tool_call>\n<invoke name=\"lookup\">\n<parameter name=\"q\">" + s + "</parameter>\n</invoke>\n</minimax:tool_call>",
				strings.Contains(s, "</parameter>")},
			{FormatKimiK2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.lookup:0<|tool_call_argument_begin|>" + hermesArgs + "<|tool_call_end|><|tool_calls_section_end|>", false},
			{FormatDeepSeekV3, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>lookup<｜tool▁sep｜>" + hermesArgs + "<｜tool▁call▁end｜><｜tool▁calls▁end｜>", false},
			{FormatMistral, "[TOOL_CALLS][{\"name\": \"lookup\", \"arguments\": " + hermesArgs + "}]", false},
			{FormatLlama3JSON, "{\"name\": \"lookup\", \"parameters\": " + hermesArgs + "}", false},
		}
		for _, c := range cases {
			if c.ambiguous {
				continue
			}
			p := ParseToolCallsFor(c.format, c.text, tools)
			if len(p.Calls) != 1 || len(p.Errors) != 0 {
				t.Fatalf("%s: %d calls, errors %v for %q", c.format, len(p.Calls), p.Err(), c.text)
			}
			var args struct{ Q *string }
			if err := json.Unmarshal(p.Calls[0].Arguments, &args); err != nil || args.Q == nil || *args.Q != s {
				t.Fatalf("%s: arguments %s, want q = %q", c.format, p.Calls[0].Arguments, s)
			}
		}
	})
}
