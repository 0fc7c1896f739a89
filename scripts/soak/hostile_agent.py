"""A soak agent: most rollouts play lockbox as the README's agent does;
some also misbehave on purpose, by their task index:

  index % 8 == 1  one oversized prompt (far beyond the model's context)
  index % 8 == 2  one malformed JSON body
  index % 8 == 3  one slow body (a byte every 2 s, given up after 10 s)
  index % 8 == 4  200 unauthenticated requests to random rollout ids, and
                  a request with a sibling-style stolen key shape

The misbehaving ones are refused by the gateway (the rollout is masked,
counted); the run must finish with nothing lost. Standard library only.
"""
import json, os, random, socket, threading, time, urllib.error, urllib.parse, urllib.request

BASE, KEY, MCP = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], os.environ["ORTRAIN_MCP_URL"]
TASK = json.loads(os.environ["ORTRAIN_TASK"])
MODE = TASK["index"] % 8
# SOAK_MODES="1,3" keeps only those misbehaviours (to find which one costs what).
if "SOAK_MODES" in os.environ and str(MODE) not in os.environ["SOAK_MODES"].split(","):
    MODE = 0


def post(url, body, session=None, key=KEY, raw=None):
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={
        "Authorization": "Bearer " + key, "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream", **({"Mcp-Session-Id": session} if session else {})})
    with urllib.request.urlopen(req, timeout=60) as resp:
        out = resp.read()
        return resp.headers.get("Mcp-Session-Id"), json.loads(out) if out else None


def refused(fn):
    try:
        fn()
    except urllib.error.HTTPError as e:
        return e.code
    return 200


def slow_body():
    u = urllib.parse.urlsplit(BASE)
    s = socket.create_connection((u.hostname, u.port), timeout=30)
    head = (f"POST {u.path}/chat/completions HTTP/1.1\r\nHost: {u.netloc}\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
    s.sendall(head.encode())
    end = time.time() + 10
    try:
        while time.time() < end:
            s.sendall(b" ")
            time.sleep(2)
    except OSError:
        pass  # the gateway hung up: that is the point
    s.close()


def flood():
    u = urllib.parse.urlsplit(BASE)
    root = f"{u.scheme}://{u.netloc}"
    for i in range(200):
        rid = "".join(random.choice("0123456789abcdef") for _ in range(16))
        refused(lambda: post(f"{root}/rollouts/{rid}/v1/chat/completions", {"messages": []}, key="sk-" + rid))


if MODE == 1:
    print("oversized:", refused(lambda: post(BASE + "/chat/completions", {"model": os.environ["ORTRAIN_MODEL"],
          "messages": [{"role": "user", "content": "x" * 400_000}]})), flush=True)
elif MODE == 2:
    print("malformed:", refused(lambda: post(BASE + "/chat/completions", None, raw=b'{"messages": [')), flush=True)
elif MODE == 3:
    threading.Thread(target=slow_body, daemon=True).start()
elif MODE == 4:
    flood()

session, _ = post(MCP, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "soak-agent", "version": "1"}}})
post(MCP, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
messages, finished = list(TASK["messages"]), False
for turn in range(4):
    _, reply = post(BASE + "/chat/completions", {"model": os.environ["ORTRAIN_MODEL"], "messages": messages, "tools": TASK["tools"]})
    message = reply["choices"][0]["message"]
    messages.append(message)
    for call in message.get("tool_calls") or []:
        _, out = post(MCP, {"jsonrpc": "2.0", "id": 2 + turn, "method": "tools/call", "params": {
            "name": call["function"]["name"], "arguments": json.loads(call["function"]["arguments"] or "{}")}}, session)
        result = out["result"]
        messages.append({"role": "tool", "tool_call_id": call["id"],
                         "content": "".join(part.get("text", "") for part in result["content"])})
        finished = finished or (result.get("structuredContent") or {}).get("finished", False)
    if finished or not message.get("tool_calls"):
        break
if MODE == 3:
    time.sleep(11)  # the slow body ends (refused or timed out) within the rollout
