"""The real `openai` Python client (v1 API) against serve-engine, unchanged:
a chat completion with a tool, the tool's result sent back, the same chat
streamed, and a text completion from a string prompt. Run by
TestServeChatFromOpenAIClient.

Usage: python3 openai_sdk_client.py BASE_URL API_KEY MODEL
Prints "ok" and exits 0, or fails with the reason.
"""

import json
import sys

from openai import OpenAI

BASE, KEY, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
client = OpenAI(base_url=BASE, api_key=KEY, max_retries=0, timeout=30)
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]


def check(cond, what):
    if not cond:
        sys.exit("check failed: " + what)


messages = [{"role": "user", "content": "What is the weather in Paris?"}]
reply = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=128)
choice = reply.choices[0]
check(choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason!r}")
calls = choice.message.tool_calls or []
check(len(calls) == 1 and calls[0].function.name == "get_weather", f"tool_calls {calls!r}")
check(json.loads(calls[0].function.arguments) == {"city": "Paris"}, f"arguments {calls[0].function.arguments!r}")
check(reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens, "usage adds up")

messages += [choice.message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": calls[0].id, "content": json.dumps({"sky": "clear"})}]
follow = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=128)
check(follow.usage.prompt_tokens > reply.usage.prompt_tokens, "the second turn's prompt holds the first")

stream = client.chat.completions.create(model=MODEL, messages=messages[:1], tools=TOOLS, max_tokens=128,
                                        stream=True, stream_options={"include_usage": True})
name, arguments, call_id, finish, usage = "", "", None, None, None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        for d in c.delta.tool_calls or []:
            call_id = call_id or d.id
            if d.function is not None:
                name += d.function.name or ""
                arguments += d.function.arguments or ""
        finish = c.finish_reason or finish
check(finish == "tool_calls", f"streamed finish_reason {finish!r}")
check(name == "get_weather" and json.loads(arguments) == {"city": "Paris"}, f"streamed call {name!r} {arguments!r}")
check(call_id is not None, "streamed call id")
check(usage is not None and usage.completion_tokens == reply.usage.completion_tokens, f"streamed usage {usage!r}")

text = client.completions.create(model=MODEL, prompt="hello", max_tokens=8)
check(text.object == "text_completion" and len(text.choices) == 1, f"text completion {text!r}")
check(text.usage.prompt_tokens > 0, "text usage")
print("ok")
