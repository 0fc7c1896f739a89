package chat_test

import (
	"encoding/json"
	"fmt"

	"github.com/ortrain/ortrain/internal/chat"
)

// A multi-turn tool rollout with Qwen2.5: sampled ids are kept verbatim,
// the tool turn is rendered by the template, and the loss mask covers only
// what the model sampled.
func ExampleConversation() {
	tok, err := chat.LoadTokenizer("../../testdata/tokenizers/qwen2.5")
	if err != nil {
		panic(err)
	}
	tmpl, err := tok.Template("")
	if err != nil {
		panic(err)
	}
	tools := []chat.Tool{{Name: "get_weather", Description: "Weather in a city.",
		Parameters: json.RawMessage(`{"type": "object", "properties": {"city": {"type": "string"}}}`)}}
	conv, err := chat.NewConversation(tok, tmpl, "Weather in Oslo?", chat.ConversationOptions{Tools: tools})
	if err != nil {
		panic(err)
	}

	// What the policy sampled, ending with its <|im_end|>.
	sampled := tok.Encode("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call><|im_end|>")
	msg, err := conv.AppendSampled(sampled)
	if err != nil {
		panic(err)
	}
	fmt.Println(msg.ToolCalls[0].Name, string(msg.ToolCalls[0].Arguments))

	before := len(conv.IDs())
	next, err := conv.AppendToolResults([]chat.ToolResult{{Name: "get_weather", Content: "-3°C"}})
	if err != nil {
		panic(err)
	}
	fmt.Printf("%q\n", tok.Decode(next[before:], false))

	ones := 0
	for _, m := range conv.LossMask() {
		ones += int(m)
	}
	fmt.Println(ones == len(sampled), len(conv.Divergences()))
	// Output:
	// get_weather {"city": "Oslo"}
	// "\n<|im_start|>user\n<tool_response>\n-3°C\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
	// true 0
}

func ExampleParseToolCalls() {
	content, calls, err := chat.ParseToolCalls(chat.FormatHermes,
		"Checking both.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\"}\n</tool_call>")
	fmt.Println(content, len(calls), calls[0].Name, string(calls[1].Arguments), err)
	_, _, err = chat.ParseToolCalls(chat.FormatHermes, "<tool_call>{\"arguments\": {}}</tool_call>")
	fmt.Println(err)
	// Output:
	// Checking both. 2 a {} <nil>
	// tool call 0 (hermes format) is malformed: "name" must be a non-empty string: "{\"arguments\": {}}"
}

func ExampleParseToolCallsFor() {
	tools := []chat.Tool{{Name: "lookup", Parameters: json.RawMessage(
		`{"type": "object", "properties": {"q": {"type": "string"}, "limit": {"type": "integer"}}, "required": ["q"]}`)}}
	turn := "<tool_call>\n<function=lookup>\n<parameter=q>\n42\n</parameter>\n<parameter=limit>\n3\n</parameter>\n</function>\n" +
		"<function=lookup>\n<parameter=q>\nx\n</parameter>\n<parameter=limit>\nmany\n</parameter>\n</function>\n</tool_call>"
	p := chat.ParseToolCallsFor(chat.FormatQwenXML, turn, tools)
	fmt.Println(p.Calls[0].Name, string(p.Calls[0].Arguments))
	fmt.Println(p.Errors[0].Kind, p.Errors[0].Index, p.Errors[0].Reason)
	// Output:
	// lookup {"q": "42", "limit": 3}
	// schema violation 1 parameter "limit": want integer, got "many"
}
