"""What real clients send: each input gets its answer, or a 4xx OpenAI-style JSON error, and the
next request on the same connection succeeds (uvicorn on 127.0.0.1, one keep-alive client)."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.test_server import CHAT, Served

TEXT = {"prompt": "Once upon a time", "max_tokens": 6}


@pytest.fixture(scope="module")
def served(served_engine):
    s = Served(served_engine, max_queue=2, max_body_bytes=64 << 10)
    yield s
    s.close()


def _ok_after(s: Served) -> None:
    """The same connection still serves: the next request succeeds."""
    r = s.http.post("/v1/completions", json={**TEXT, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"]


@pytest.mark.parametrize("body", [
    {**TEXT, "temperature": None, "top_p": None, "n": None, "stream": None, "stop": None, "seed": None},
    {**TEXT, "seed": -1, "temperature": 0.8},
    {**TEXT, "temperature": 1e-308},
    {**TEXT, "top_p": 0},
    {**TEXT, "model": "gpt-4o-mini"},
    {**TEXT, "presence_penalty": 0.5, "frequency_penalty": 1, "repeat_penalty": 1.2},
    {**TEXT, "logprobs": False, "top_logprobs": 0, "presence_penalty": 0, "frequency_penalty": 0.0,
     "logit_bias": {}, "tools": [], "echo": False, "best_of": 1, "response_format": {"type": "text"},
     "tool_choice": "auto"},
])
def test_inputs_real_clients_send_are_answered(served, body):
    r = served.http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    _ok_after(served)


def test_top_p_zero_and_a_tiny_temperature_keep_the_most_probable_token(served):
    greedy = served.http.post("/v1/completions", json={**TEXT, "temperature": 0}).json()["choices"][0]["text"]
    for extra in ({"top_p": 0, "temperature": 1.0, "seed": 3}, {"temperature": 1e-308, "seed": 3}):
        assert served.http.post("/v1/completions", json={**TEXT, **extra}).json()["choices"][0]["text"] == greedy


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded", "text/plain"])
def test_json_is_read_as_json_whatever_the_content_type(served, content_type):
    headers = {} if content_type is None else {"content-type": content_type}
    r = served.http.post("/v1/completions", content=b'{"prompt": "Hello", "max_tokens": 4}', headers=headers)
    assert r.status_code == 200, r.text
    _ok_after(served)


@pytest.mark.parametrize("body,param", [
    ('{"prompt": "hi \\udc80", "max_tokens": 4}', "prompt"),  # a lone surrogate: no text
    ({**TEXT, "logprobs": 21}, "logprobs"),
    ({**TEXT, "top_logprobs": 2}, "top_logprobs"),
    ({**TEXT, "presence_penalty": 2.5}, "presence_penalty"),
    ({**TEXT, "repeat_penalty": 0}, "repeat_penalty"),
    ({**TEXT, "logit_bias": {"42": 500}}, "logit_bias"),
    ({**TEXT, "logit_bias": {"99999999": 5}}, "logit_bias"),
    ({**TEXT, "echo": True}, "echo"),
    ({**TEXT, "suffix": "The end."}, "suffix"),
    ({**TEXT, "best_of": 2}, "best_of"),
    ({**TEXT, "response_format": {"type": "xml"}}, "response_format"),
    ({**TEXT, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ({**TEXT, "grammar": "root ::= ("}, "grammar"),
    ({**TEXT, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({**TEXT, "tool_choice": "required"}, "tool_choice"),
])
def test_inputs_that_cannot_be_honoured_get_a_400_that_names_them(served, body, param):
    kw = {"content": body.encode()} if isinstance(body, str) else {"json": body}
    r = served.http.post("/v1/completions", **kw)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert (param if param != "prompt" else "surrogate") in err["message"]
    _ok_after(served)


@pytest.mark.parametrize("extra,param,says", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools", "no tool support"),
    ({"tool_choice": "required"}, "tool_choice", "no tools"),
    ({"tools": [{"type": "function"}]}, "tools", "Each tool"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/nowhere"}}}},
     "response_format", "schema"),
    ({"grammar": "root ::= (", "max_tokens": 4}, "grammar", "grammar"),
])
def test_chat_fields_that_cannot_run_get_a_400_that_names_them(served, extra, param, says):
    r = served.http.post("/v1/chat/completions", json={**CHAT, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and says in err["message"], err
    _ok_after(served)


def test_a_lone_surrogate_in_a_chat_message_is_a_400(served):
    r = served.http.post("/v1/chat/completions", content=b'{"messages": [{"role": "user", "content": "a \\ud800"}]}')
    assert r.status_code == 400 and "surrogate" in r.json()["error"]["message"]
    _ok_after(served)


def test_models_retrieve_openapi_and_method_errors(served):
    mid = served.http.get("/v1/models").json()["data"][0]["id"]
    one = served.http.get(f"/v1/models/{mid}")
    assert one.status_code == 200 and one.json()["id"] == mid and one.json()["object"] == "model"
    assert served.http.get("/v1/models/gpt-4o-mini").json()["id"] == mid  # any name is the loaded model
    spec = served.http.get("/openapi.json")
    assert spec.status_code == 200 and "/v1/chat/completions" in spec.json()["paths"]
    wrong = served.http.get("/v1/chat/completions")
    assert wrong.status_code == 405 and wrong.headers["Allow"] == "POST" and wrong.json()["error"]
    missing = served.http.get("/v2/nothing")
    assert missing.status_code == 404 and missing.json()["error"]
    _ok_after(served)


def test_a_body_over_the_limit_is_413(served):
    r = httpx.post(f"{served.url}/v1/completions", json={**TEXT, "junk": "x" * (70 << 10)}, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    _ok_after(served)


def test_a_strict_server_refuses_other_model_names(served_engine):
    s = Served(served_engine, strict_model=True)
    try:
        r = s.http.post("/v1/chat/completions", json={**CHAT, "model": "gpt-9"})
        assert r.status_code == 404 and "gpt-9" in r.json()["error"]["message"]
        assert s.http.get("/v1/models/gpt-9").status_code == 404
        assert s.http.post("/v1/chat/completions", json={**CHAT, "model": "default"}).status_code == 200
    finally:
        s.close()


def test_a_non_streaming_client_that_leaves_is_cancelled_within_a_few_steps(served, served_engine):
    long = {"prompt": "Once upon a time", "max_tokens": 200, "temperature": 0.9, "seed": 5}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{served.url}/v1/completions", json=long, timeout=httpx.Timeout(30, read=0.3))
    deadline = time.monotonic() + 20
    while served.http.get("/health").json()["running"]:
        assert time.monotonic() < deadline, "the abandoned generation kept running"
        time.sleep(0.02)
    assert served_engine.last_stats is not None and served_engine.last_stats.generated < 200
    _ok_after(served)


def test_logprobs_in_openai_shapes_for_drafted_and_target_tokens(served, served_engine):
    chat = served.http.post("/v1/chat/completions", json={**CHAT, "logprobs": True, "top_logprobs": 3}).json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert "".join(e["token"] for e in content) == chat["choices"][0]["message"]["content"]
    for e in content:
        assert e["logprob"] <= 0 and len(e["top_logprobs"]) == 3
        assert bytes(e["bytes"]).decode(errors="replace") == e["token"]
        tops = [t["logprob"] for t in e["top_logprobs"]]
        assert tops == sorted(tops, reverse=True) and e["logprob"] <= tops[0] + 1e-6
    assert e["logprob"] == pytest.approx(tops[0])  # greedy: the emitted token is the most probable
    text = served.http.post("/v1/completions", json={**TEXT, "temperature": 0, "logprobs": 2}).json()["choices"][0]
    lp = text["logprobs"]
    assert "".join(lp["tokens"]) == text["text"] and len(lp["token_logprobs"]) == len(lp["tokens"])
    assert lp["text_offset"][0] == 0 and all(len(d) == 2 for d in lp["top_logprobs"])
    with served.http.stream("POST", "/v1/completions", json={**TEXT, "temperature": 0, "logprobs": 1,
                                                                 "stream": True}) as r:
        chunks = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:") and "[DONE]" not in line]
    streamed = [c["choices"][0]["logprobs"] for c in chunks if c["choices"][0]["logprobs"]]
    assert [x["token_logprobs"][0] for x in streamed] == pytest.approx(lp["token_logprobs"], abs=1e-4)
    assert served.http.post("/v1/completions", json=TEXT).json()["choices"][0]["logprobs"] is None


def test_logprobs_are_the_targets_whether_a_token_was_drafted_or_not(served_engine):
    from tests.drafters import OracleDrafter

    plain = list(served_engine.generate("Once upon a time", max_tokens=20, logprobs=2, speculative=False))
    ids = served_engine.target.tokenize("Once upon a time") + [t.id for t in plain]
    drafted = list(served_engine.generate("Once upon a time", max_tokens=20, logprobs=2, k=4))
    assert [t.id for t in drafted] == [t.id for t in plain]
    assert [t.logprob for t in drafted] == pytest.approx([t.logprob for t in plain], abs=1e-3)
    assert ids  # the reference continuation exists
    oracle = served_engine.drafter
    try:
        served_engine.drafter = OracleDrafter(ids)
        spec = list(served_engine.generate("Once upon a time", max_tokens=20, logprobs=2, k=4))
    finally:
        served_engine.drafter = oracle
    assert any(t.origin == "draft" for t in spec)
    assert [t.logprob for t in spec] == pytest.approx([t.logprob for t in plain], abs=1e-3)


def test_logit_bias_bans_a_token_and_stays_lossless(served, served_engine):
    greedy = served.http.post("/v1/completions", json={**TEXT, "max_tokens": 12, "temperature": 0}).json()
    first = served_engine.target.tokenize(greedy["choices"][0]["text"], add_special=False)[0]
    body = {**TEXT, "max_tokens": 12, "temperature": 0, "logit_bias": {str(first): -100}}
    banned = served.http.post("/v1/completions", json=body).json()["choices"][0]["text"]
    assert banned != greedy["choices"][0]["text"]
    ban = dict(max_tokens=12, logit_bias={first: -100})
    plain = served_engine.generate(TEXT["prompt"], speculative=False, **ban).result()
    assert first not in plain.tokens and plain.text == banned
    for k in (3, "auto"):
        assert served_engine.generate(TEXT["prompt"], k=k, **ban).result().text == banned
    seeded = {served_engine.generate(TEXT["prompt"], k=k, temperature=0.9, seed=4, **ban).result().text
              for k in (0, 3)}
    assert len(seeded) == 1


def test_penalties_change_the_text_and_stay_lossless(served_engine):
    prompt, n = "Once upon a time", 40
    plain = served_engine.generate(prompt, max_tokens=n, speculative=False).result().tokens
    args = dict(max_tokens=n, presence_penalty=0.4, frequency_penalty=0.6, repeat_penalty=1.3)
    penalized = served_engine.generate(prompt, speculative=False, **args).result().tokens
    assert penalized != plain
    for kw in ({"k": 3}, {"k": "auto"}, {"tree": 5}):
        assert served_engine.generate(prompt, **args, **kw).result().tokens == penalized, kw
    seeded = {tuple(served_engine.generate(prompt, temperature=0.9, seed=2, k=k, **args).result().tokens)
              for k in (0, 3)}
    assert len(seeded) == 1


def test_requests_feed_the_history_and_reset_clears_it(served, served_engine):
    served_engine.reset_history()
    r = served.http.post("/v1/completions", json={**TEXT, "temperature": 0})
    assert r.status_code == 200
    assert served_engine.suffix.stats()["history_tokens"] > 0  # the request's prompt and answer
    reset = served.http.post("/history/reset")
    assert reset.status_code == 200 and reset.json()["history"]["history_tokens"] == 0
    _ok_after(served)
