"""Drives a rollout's Responses API with the real `openai` client.

Usage: openai_responses_client.py BASE_URL API_KEY

Runs, with client.responses: a plain call, the same streamed (raw events
from create(stream=True), and the stream() helper, whose accumulator needs
the events in OpenAI's order), a function-call round trip that sends the
output items back as the client returned them, a continuation by
previous_response_id, and two refusals. Prints what the Go test checks as
one JSON object; asserts what only Python can see (the client's types).
"""

import json
import sys

import openai
from openai import OpenAI
from openai.types.responses import Response, ResponseFunctionToolCall, ResponseOutputMessage

MODEL = "gpt-5-codex"  # any name is accepted

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "strict": False,
}


def summary(r):
    assert isinstance(r, Response), type(r)
    items = []
    for o in r.output:
        if o.type == "message":
            assert isinstance(o, ResponseOutputMessage), type(o)
            items.append({"type": "message", "text": "".join(c.text for c in o.content)})
        else:
            assert isinstance(o, ResponseFunctionToolCall), type(o)
            items.append({"type": o.type, "name": o.name, "arguments": o.arguments, "call_id": o.call_id})
    return {
        "id": r.id,
        "status": r.status,
        "text": r.output_text,
        "output": items,
        "input_tokens": r.usage.input_tokens,
        "output_tokens": r.usage.output_tokens,
        "previous_response_id": r.previous_response_id,
    }


def refusal(fn):
    try:
        fn()
    except openai.BadRequestError as e:
        return {"status": e.status_code, "param": e.param, "code": e.code, "type": e.type}
    raise AssertionError("the request was not refused")


def main():
    base, key = sys.argv[1], sys.argv[2]
    client = OpenAI(base_url=base, api_key=key, max_retries=0, timeout=60)
    out = {}

    out["plain"] = summary(client.responses.create(model=MODEL, instructions="Be brief.", input="Hello"))

    events, deltas, final = [], "", None
    for ev in client.responses.create(model=MODEL, input="Hello", stream=True):
        events.append(ev.type)
        if ev.type == "response.output_text.delta":
            deltas += ev.delta
        elif ev.type == "response.completed":
            final = ev.response
    assert final is not None, events
    out["streamed"] = summary(final)
    out["stream_events"] = events
    out["stream_text"] = deltas

    with client.responses.stream(model=MODEL, input="Hello") as stream:
        helper_events = [ev.type for ev in stream]
        helper_final = stream.get_final_response()
    out["helper"] = summary(helper_final)
    out["helper_events"] = helper_events

    # A tool round trip as OpenAI's guide writes it: the output items are
    # appended to the input as the client returned them.
    history = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.responses.create(model=MODEL, input=history, tools=[WEATHER], store=False)
    call = next(o for o in first.output if o.type == "function_call")
    history += first.output
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "22C, sunny"})
    second = client.responses.create(model=MODEL, input=history, tools=[WEATHER])
    third = client.responses.create(
        model=MODEL, previous_response_id=second.id, tools=[WEATHER],
        input=[{"role": "user", "content": [{"type": "input_text", "text": "And tomorrow?"}]}],
    )
    out["tool1"], out["tool2"], out["tool3"] = summary(first), summary(second), summary(third)

    out["image_refused"] = refusal(lambda: client.responses.create(model=MODEL, input=[{
        "role": "user",
        "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA=="}],
    }]))
    out["not_stored"] = refusal(lambda: client.responses.create(
        model=MODEL, previous_response_id=first.id, input="again"))

    print(json.dumps(out))


if __name__ == "__main__":
    main()
