"""Regenerate extra_rendered.json: the templates in this folder rendered with
jinja2 in transformers' apply_chat_template environment
(ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[loopcontrols]), transformers' tojson, raise_exception, and
strftime_now fixed at 2024-07-26 12:00) for eight conversations.

    python3 gen_extra.py > extra_rendered.json     (jinja2 3.1.6, Python 3.11)
"""
import json, glob, datetime, os
import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
def strftime_now(fmt):
    return datetime.datetime(2024, 7, 26, 12, 0, 0).strftime(fmt)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now

tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & 'then'", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City"}, "days": {"type": "integer"}}, "required": ["city"]}}}]
def call(args, id="call00001"):
    return {"id": id, "type": "function", "function": {"name": "get_weather", "arguments": args}}
scen = {
  "simple": dict(messages=[{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi there"}], add_generation_prompt=True),
  "multi": dict(messages=[{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2 ünï 世界\r\n  tail  "}], add_generation_prompt=False),
  "tools_roundtrip": dict(messages=[{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": [call({"city": "Paris", "days": 2})]}, {"role": "tool", "name": "get_weather", "tool_call_id": "call00001", "content": "{\"t\": 22}"}, {"role": "assistant", "content": "Sunny."}], tools=tools, add_generation_prompt=True),
  "tools_strargs": dict(messages=[{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": [call("{\"city\": \"Paris\"}"), call("{\"city\": \"Rome\"}", "call00002")]}, {"role": "tool", "tool_call_id": "call00001", "content": "22"}, {"role": "tool", "tool_call_id": "call00002", "content": "25"}], tools=tools, add_generation_prompt=True),
  "reasoning": dict(messages=[{"role": "user", "content": "Think"}, {"role": "assistant", "reasoning_content": "hmm\n", "content": "Done"}, {"role": "user", "content": "Again"}, {"role": "assistant", "content": "<think>\nx\n</think>\n\nOK"}], add_generation_prompt=False, enable_thinking=False),
  "content_blocks": dict(messages=[{"role": "system", "content": [{"type": "text", "text": "Sys"}]}, {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], add_generation_prompt=True, enable_thinking=False),
  "tool_then_user": dict(messages=[{"role": "user", "content": "W?"}, {"role": "assistant", "content": "Let me check.", "reasoning_content": "need tool", "tool_calls": [call({"city": "Oslo"})]}, {"role": "tool", "tool_call_id": "call00001", "content": "cold"}, {"role": "assistant", "content": "Cold."}, {"role": "user", "content": "Thanks"}], tools=tools, add_generation_prompt=True),
  "no_tools_thinking": dict(messages=[{"role": "user", "content": "Hello"}], add_generation_prompt=True, enable_thinking=True),
}
cases = []
os.chdir(os.path.dirname(os.path.abspath(__file__)))
for path in sorted(glob.glob("*.jinja")):
    src = open(path).read()
    for name, ctx in scen.items():
        vars = {"tools": None, "documents": None, "bos_token": "<s>", "eos_token": "</s>"}
        vars.update(ctx)
        case = {"template": path, "scenario": name, "vars": vars}
        try:
            case["expected"] = env.from_string(src).render(**vars)
        except Exception as e:
            case["expected_error"] = f"{type(e).__name__}: {e}"
        cases.append(case)
print(json.dumps({"generator": "gen_extra.py, jinja2 " + jinja2.__version__, "cases": cases}, ensure_ascii=False, indent=1))
