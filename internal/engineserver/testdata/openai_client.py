"""An OpenAI chat client written with the standard library only, run by
TestServeChatFromPython against serve-engine: a chat completion with a tool,
the tool's result sent back, and a streamed completion read as SSE lines.

Usage: python3 openai_client.py BASE_URL API_KEY MODEL
Prints "ok" and exits 0, or fails with the reason.
"""

import json
import sys
import urllib.error
import urllib.request

BASE, KEY, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]


def post(path, body):
    req = urllib.request.Request(
        BASE + path, data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
    try:
        return urllib.request.urlopen(req, timeout=30)
    except urllib.error.HTTPError as e:
        sys.exit(f"POST {path}: HTTP {e.code}: {e.read().decode()}")


def check(cond, what):
    if not cond:
        sys.exit("check failed: " + what)


messages = [{"role": "user", "content": "What is the weather in Paris?"}]
with post("/chat/completions", {"model": MODEL, "messages": messages, "tools": TOOLS, "max_tokens": 128}) as r:
    reply = json.load(r)
check(reply["object"] == "chat.completion", f"object {reply['object']!r}")
check(reply["model"] == MODEL, f"model {reply['model']!r}")
choice = reply["choices"][0]
check(choice["finish_reason"] == "tool_calls", f"finish_reason {choice['finish_reason']!r}")
msg = choice["message"]
calls = msg.get("tool_calls") or []
check(len(calls) == 1, f"tool_calls {calls!r}")
call = calls[0]
check(call["function"]["name"] == "get_weather", f"call {call!r}")
check(json.loads(call["function"]["arguments"]) == {"city": "Paris"}, f"arguments {call['function']['arguments']!r}")
check(reply["usage"]["total_tokens"] == reply["usage"]["prompt_tokens"] + reply["usage"]["completion_tokens"], "usage adds up")

# The agent's next turn: the reply as sent, then the tool's result.
messages += [msg, {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"sky": "clear"})}]
with post("/chat/completions", {"model": MODEL, "messages": messages, "tools": TOOLS, "max_tokens": 128}) as r:
    follow = json.load(r)
check(follow["usage"]["prompt_tokens"] > reply["usage"]["prompt_tokens"], "the second turn's prompt holds the first")

# Streamed: data lines up to [DONE], accumulated as the openai client does.
body = {"model": MODEL, "messages": messages[:1], "tools": TOOLS, "max_tokens": 128,
        "stream": True, "stream_options": {"include_usage": True}}
with post("/chat/completions", body) as r:
    check(r.headers["Content-Type"].startswith("text/event-stream"), f"content type {r.headers['Content-Type']!r}")
    role, finish, usage, done = None, None, None, False
    streamed = {}  # tool call index -> {"id", "name", "arguments"}
    for raw in r:
        line = raw.decode().rstrip("\r\n")
        if not line:
            continue
        check(not done, "data after [DONE]")
        check(line.startswith("data: "), f"SSE line {line!r}")
        data = line[len("data: "):]
        if data == "[DONE]":
            done = True
            continue
        chunk = json.loads(data)
        check(chunk["object"] == "chat.completion.chunk", f"chunk object {chunk['object']!r}")
        if chunk.get("usage"):
            usage = chunk["usage"]
        for c in chunk["choices"]:
            delta = c["delta"]
            role = delta.get("role", role)
            for tc in delta.get("tool_calls") or []:
                acc = streamed.setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
                acc["id"] += tc.get("id", "")
                acc["name"] += tc["function"].get("name", "")
                acc["arguments"] += tc["function"].get("arguments", "")
            finish = c.get("finish_reason") or finish
check(done, "the stream ends with [DONE]")
check(role == "assistant", f"role {role!r}")
check(finish == "tool_calls", f"streamed finish_reason {finish!r}")
check(list(streamed) == [0], f"streamed calls {streamed!r}")
check(streamed[0]["name"] == "get_weather", f"streamed call {streamed[0]!r}")
check(json.loads(streamed[0]["arguments"]) == {"city": "Paris"}, f"streamed arguments {streamed[0]['arguments']!r}")
check(usage is not None and usage["completion_tokens"] > 0, f"usage {usage!r}")
print("ok")
