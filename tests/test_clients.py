"""The OpenAI clients apps use, against `edge-eagle serve` on a loopback port: the openai SDK,
litellm, LangChain's ChatOpenAI (with_structured_output and bind_tools) and llm. The server
runs the tiny pair with a template that renders tools (hermes format), so tool calls are real."""

from __future__ import annotations

import json
import os
from typing import Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field

from edge_eagle import EdgeEagle
from tests import chat_templates as CT
from tests.test_server import Served
from tests.tiny_models import write_tiny_target

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm: no fetch of its price list

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
MSGS = [{"role": "user", "content": "What is the weather in Oslo?"}]


class Thing(BaseModel):
    color: Literal["red", "green", "blue"]
    ok: bool
    name: str = Field(max_length=8)


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_drafters):
    path = write_tiny_target(tmp_path_factory.mktemp("clients") / "tiny-hermes.gguf", chat_template=CT.HERMES)
    ee = EdgeEagle(path, tiny_drafters["eagle3.1"][0], k=3, n_ctx=768)
    s = Served(ee, max_queue=2)
    yield s
    s.close()
    ee.close()


def _weather_args(arguments: str | dict) -> None:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, WEATHER["function"]["parameters"])


def test_openai_sdk_structured_output_and_tool_calls(served):
    import openai

    client = openai.OpenAI(base_url=served.url + "/v1", api_key="none", timeout=60)
    parsed = client.chat.completions.parse(model="any", messages=MSGS, response_format=Thing, max_tokens=96,
                                           temperature=0)
    assert isinstance(parsed.choices[0].message.parsed, Thing)
    reply = client.chat.completions.create(model="any", messages=MSGS, tools=[WEATHER], tool_choice="required",
                                           max_tokens=96, temperature=0)
    (call,) = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    _weather_args(call.function.arguments)
    # streamed: the SDK's accumulating stream helper rebuilds the same call
    with client.chat.completions.stream(model="any", messages=MSGS, tools=[WEATHER], tool_choice="required",
                                        max_tokens=96, temperature=0) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.arguments == call.function.arguments
    # the call answered, the conversation goes on
    follow = MSGS + [reply.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "-3 C"}]
    again = client.chat.completions.create(model="any", messages=follow, tools=[WEATHER], max_tokens=8, temperature=0)
    assert again.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_litellm(served):
    import litellm

    common = dict(model="openai/any", api_base=served.url + "/v1", api_key="none", temperature=0, max_tokens=96)
    text = litellm.completion(messages=MSGS, **{**common, "max_tokens": 8})
    assert text.choices[0].message.content
    structured = litellm.completion(messages=MSGS, response_format=Thing, **common)
    Thing.model_validate_json(structured.choices[0].message.content)
    tools = litellm.completion(messages=MSGS, tools=[WEATHER], tool_choice="required", **common)
    (call,) = tools.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    _weather_args(call.function.arguments)


def test_langchain_chat_openai(served):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=served.url + "/v1", api_key="none", model="any", temperature=0, max_tokens=96,
                     timeout=60)
    assert llm.invoke("Say hi.", max_tokens=8).content
    assert "".join(c.content for c in llm.stream("Say hi.", max_tokens=8))
    thing = llm.with_structured_output(Thing).invoke("Describe a thing.")  # json_schema, strict
    assert isinstance(thing, Thing)
    msg = llm.bind_tools([WEATHER], tool_choice="get_weather").invoke("Weather in Oslo?")
    (call,) = msg.tool_calls
    assert call["name"] == "get_weather"
    _weather_args(call["args"])
    via_tools = llm.with_structured_output(Thing, method="function_calling").invoke("Describe a thing.")
    assert isinstance(via_tools, Thing)


def test_llm(served, tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_USER_PATH", str(tmp_path))
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: edge-eagle\n  model_name: any\n  api_base: {served.url}/v1\n  supports_schema: true\n")
    import llm

    model = llm.get_model("edge-eagle")
    assert model.prompt("Say hi.", temperature=0, max_tokens=8).text()
    reply = model.prompt("Describe a thing.", schema=Thing, temperature=0, max_tokens=96, key="none").text()
    Thing.model_validate_json(reply)
