"""The tool-using agent of tool_agent.py written with the `openai` client
(v1 API), unchanged: OpenAI() reads OPENAI_BASE_URL and OPENAI_API_KEY.
The env's tools are still called over MCP (ORTRAIN_MCP_URL) with the
standard library. Prints the reward it reports as its last line.
"""
import json
import os
import urllib.request

from openai import OpenAI

TASK = json.loads(os.environ["ORTRAIN_TASK"])
MCP = os.environ["ORTRAIN_MCP_URL"]
KEY = os.environ["OPENAI_API_KEY"]
client = OpenAI(max_retries=0, timeout=60)


def mcp(method, params, session=None, ident=1):
    body = {"jsonrpc": "2.0", "method": method, "params": params}
    if ident is not None:
        body["id"] = ident
    req = urllib.request.Request(MCP, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Accept", "application/json, text/event-stream")
    req.add_header("Authorization", "Bearer " + KEY)
    if session:
        req.add_header("Mcp-Session-Id", session)
    with urllib.request.urlopen(req, timeout=30) as resp:
        raw = resp.read()
        return resp.headers.get("Mcp-Session-Id"), (json.loads(raw) if raw else None)


session, _ = mcp("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "openai_agent", "version": "1"}})
mcp("notifications/initialized", {}, session, ident=None)
messages = list(TASK["messages"])
for turn in range(4):
    stream = turn % 2 == 1  # every other call streamed, as agents mix them
    if stream:
        name, args, call_id, content = "", "", None, ""
        for chunk in client.chat.completions.create(model=os.environ["ORTRAIN_MODEL"], messages=messages, tools=TASK["tools"], stream=True):
            for c in chunk.choices:
                content += c.delta.content or ""
                for d in c.delta.tool_calls or []:
                    call_id = call_id or d.id
                    if d.function is not None:
                        name += d.function.name or ""
                        args += d.function.arguments or ""
        calls = [{"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}] if name else []
        message = {"role": "assistant", "content": content or None}
        if calls:
            message["tool_calls"] = calls
    else:
        reply = client.chat.completions.create(model=os.environ["ORTRAIN_MODEL"], messages=messages, tools=TASK["tools"])
        message = reply.choices[0].message.model_dump(exclude_none=True)
        calls = message.get("tool_calls") or []
    messages.append(message)
    if not calls:
        break
    for i, call in enumerate(calls):
        _, out = mcp("tools/call", {"name": call["function"]["name"], "arguments": json.loads(call["function"]["arguments"])}, session, ident=10 + i)
        text = "".join(p.get("text", "") for p in out["result"]["content"])
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})
print(json.dumps({"reward": 0.75}))
