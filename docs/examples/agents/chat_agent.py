"""A tool-using agent with Python's standard library only: the README's agent.

It asks the model (OPENAI_BASE_URL, chat completions with the task's tools),
runs each tool call the model writes on the env's MCP server
(ORTRAIN_MCP_URL, the same bearer key) and sends the result back, until the
model answers without a tool call or a tool result says the episode is over
(structuredContent.finished): a loop that asked the model once more would
only spend tokens the trainer does not train on.
"""
import json, os, urllib.request

BASE, KEY, MCP = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], os.environ["ORTRAIN_MCP_URL"]
TASK = json.loads(os.environ["ORTRAIN_TASK"])

def post(url, body, session=None):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Authorization": "Bearer " + KEY, "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream", **({"Mcp-Session-Id": session} if session else {})})
    with urllib.request.urlopen(req, timeout=60) as resp:
        raw = resp.read()
        return resp.headers.get("Mcp-Session-Id"), json.loads(raw) if raw else None

session, _ = post(MCP, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "chat-agent", "version": "1"}}})
post(MCP, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)

messages, finished = list(TASK["messages"]), False
for turn in range(8):
    _, reply = post(BASE + "/chat/completions", {"model": os.environ["ORTRAIN_MODEL"], "messages": messages, "tools": TASK["tools"]})
    message = reply["choices"][0]["message"]
    messages.append(message)
    for call in message.get("tool_calls") or []:
        _, out = post(MCP, {"jsonrpc": "2.0", "id": 2 + turn, "method": "tools/call", "params": {
            "name": call["function"]["name"], "arguments": json.loads(call["function"]["arguments"])}}, session)
        result = out["result"]
        messages.append({"role": "tool", "tool_call_id": call["id"],
                         "content": "".join(part.get("text", "") for part in result["content"])})
        finished = finished or (result.get("structuredContent") or {}).get("finished", False)
    if finished or not message.get("tool_calls"):
        break   # the env's rewards (through MCP) score the rollout
