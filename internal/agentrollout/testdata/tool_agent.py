"""A tool-using agent written with Python's standard library only.

It keeps its own loop: it asks the model (OPENAI_BASE_URL, chat completions
with the task's tools), runs every tool call the model writes on the env's
MCP server (ORTRAIN_MCP_URL), sends the results back in the next call, and
stops when the model answers without a call (after its first answer it asks
once more, so every rollout makes at least two calls). Its last stdout line is the
reward it reports. AGENT_REWRITE=1 makes it drop its history before the
second call (a summarizing agent), AGENT_STEAL=1 makes it also try another
rollout's endpoint with its own key, AGENT_SEED=N makes it send seed N with
every call (as agents that fix their seed do).
"""
import json
import os
import sys
import urllib.error
import urllib.request

BASE = os.environ["OPENAI_BASE_URL"]
KEY = os.environ["OPENAI_API_KEY"]
MODEL = os.environ["ORTRAIN_MODEL"]
MCP = os.environ["ORTRAIN_MCP_URL"]
TASK = json.loads(os.environ["ORTRAIN_TASK"])


def post(url, body, headers=None):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Accept", "application/json, text/event-stream")
    req.add_header("Authorization", "Bearer " + KEY)
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    with urllib.request.urlopen(req, timeout=30) as resp:
        raw = resp.read()
        return resp.headers, (json.loads(raw) if raw else None)


def chat(messages):
    body = {"model": MODEL, "messages": messages, "tools": TASK["tools"], "temperature": 0}
    if os.environ.get("AGENT_SEED"):
        body["seed"] = int(os.environ["AGENT_SEED"])   # an agent that fixes its seed
    _, reply = post(BASE + "/chat/completions", body)
    return reply["choices"][0]["message"]


class MCPClient:
    def __init__(self, url):
        self.url, self.session, self.next_id = url, None, 1

    def request(self, method, params):
        headers = {"Mcp-Session-Id": self.session} if self.session else {}
        body = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.next_id += 1
        hdrs, reply = post(self.url, body, headers)
        if method == "initialize":
            self.session = hdrs.get("Mcp-Session-Id")
            post(self.url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, {"Mcp-Session-Id": self.session})
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply["result"]

    def call(self, name, arguments):
        result = self.request("tools/call", {"name": name, "arguments": arguments})
        return "".join(c.get("text", "") for c in result["content"])


def steal():
    """Calls a neighbour rollout's endpoint with this rollout's key until the
    gateway refuses it with 401 (a neighbour not open yet answers 404)."""
    import time
    rid = os.environ["ORTRAIN_ROLLOUT_ID"]
    prefix, n = rid.rsplit("-", 1)
    root = BASE[: BASE.index("/rollouts/")]
    for _ in range(100):
        for other in (int(n) - 1, int(n) + 1):
            try:
                post(root + "/rollouts/%s-%d/v1/chat/completions" % (prefix, other), {"model": MODEL, "messages": TASK["messages"]})
            except urllib.error.HTTPError as e:
                if e.code == 401:
                    print("steal %d: refused" % other, file=sys.stderr)
                    return
        time.sleep(0.1)
    raise SystemExit("no neighbour rollout was ever open")


def main():
    mcp = MCPClient(MCP)
    mcp.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "tool_agent", "version": "1"}})
    names = [t["name"] for t in mcp.request("tools/list", {})["tools"]]
    assert names == [t["function"]["name"] for t in TASK["tools"]], names
    if os.environ.get("AGENT_STEAL"):
        steal()
    messages = list(TASK["messages"])
    for turn in range(4):
        if turn == 1 and os.environ.get("AGENT_REWRITE"):
            # A summarizing agent: the history is replaced by a summary.
            messages = list(TASK["messages"]) + [{"role": "user", "content": "Summary: " + json.dumps(messages[-1]["content"])}]
        message = chat(messages)
        calls = message.get("tool_calls") or []
        messages.append({"role": "assistant", "content": message.get("content"), "tool_calls": calls} if calls else message)
        if not calls:
            if turn == 0:
                # A model that did not call a tool is asked once more.
                messages.append({"role": "user", "content": "Use the tools."})
                continue
            break
        for call in calls:
            result = mcp.call(call["function"]["name"], json.loads(call["function"]["arguments"]))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    print(json.dumps({"reward": 0.5}))


main()
