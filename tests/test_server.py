"""`edge-eagle serve`: the OpenAI-compatible server, over real HTTP (uvicorn on 127.0.0.1)."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Literal

import httpx
import pytest
import uvicorn

from edge_eagle import EdgeEagle
from edge_eagle.server import ServerOptions, create_app


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """An app on a uvicorn server in a thread of this process (so tests can see the engine)."""

    def __init__(self, engine: EdgeEagle, **options):
        self.engine = engine
        self.app = create_app(engine, ServerOptions(**options))
        self.port = _free_port()
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"
        self.http = httpx.Client(base_url=self.url, timeout=60)
        assert self.app.state.server.worker.ready.wait(30), "the batch-cost calibration did not finish"

    def close(self) -> None:
        self.http.close()
        self.server.should_exit = True
        self.thread.join(timeout=20)


@pytest.fixture(scope="module")
def served(served_engine):
    s = Served(served_engine, max_queue=2)
    yield s
    s.close()


CHAT = {"messages": [{"role": "user", "content": "Tell me about the sea."}], "temperature": 0, "max_tokens": 24}


def _sse(lines) -> list:
    events = []
    for line in lines:
        if line.startswith("data:"):
            data = line[5:].strip()
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_health_and_models(served):
    assert served.http.get("/health").json()["status"] == "ok"
    models = served.http.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "tiny-target"
    assert models["data"][0]["edge_eagle"]["k"] == 3


def test_chat_completion_is_the_engines_greedy_reply_with_usage_and_acceptance(served, served_engine):
    r = served.http.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200, r.text
    body = r.json()
    want = served_engine.chat(CHAT["messages"], max_tokens=24).result()
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"] == want.text
    assert body["choices"][0]["finish_reason"] in ("stop", "length")
    usage, ee, timings = body["usage"], body["edge_eagle"], body["timings"]
    assert usage["completion_tokens"] == len(want.tokens)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert ee["drafted"] == timings["draft_n"] > 0 and ee["accepted"] == timings["draft_n_accepted"]
    assert ee["tau"] == pytest.approx(1 + ee["accepted"] / ee["verify_steps"], abs=1e-3)
    assert len(ee["per_position_acceptance"]) == 3 and ee["k"] == 3


def test_streamed_chat_matches_the_plain_response_and_ends_with_usage_and_done(served):
    plain = served.http.post("/v1/chat/completions", json=CHAT).json()
    req = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    with served.http.stream("POST", "/v1/chat/completions", json=req) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _sse(r.iter_lines())
    assert events[-1] == "[DONE]"
    chunks, usage_chunk = events[:-2], events[-2]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == plain["choices"][0]["message"]["content"]
    assert {c["edge_eagle"]["origin"] for c in chunks[1:-1]} <= {"draft", "target"}
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]
    assert last["edge_eagle"]["drafted"] == plain["edge_eagle"]["drafted"]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == plain["usage"]["completion_tokens"]


def test_completions_with_stop_and_the_prompt_cache(served, served_engine):
    body = {"prompt": "Once upon a time", "temperature": 0, "max_tokens": 30}
    full = served.http.post("/v1/completions", json=body).json()
    text = full["choices"][0]["text"]
    assert full["object"] == "text_completion" and text
    stop = text[len(text) // 2:][:3]
    cut = served.http.post("/v1/completions", json={**body, "stop": [stop]}).json()
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["choices"][0]["text"] == text[:text.index(stop)]
    # the same prompt again: its prefix comes from the KV cache
    assert cut["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert cut["edge_eagle"]["prompt_cached_tokens"] + cut["edge_eagle"]["prompt_prefilled_tokens"] == \
        cut["usage"]["prompt_tokens"]
    assert cut["edge_eagle"]["flash_attn"] == "auto"  # a short prompt: llama.cpp's own choice
    stream = {**body, "stream": True}
    with served.http.stream("POST", "/v1/completions", json=stream) as r:
        events = _sse(r.iter_lines())
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == text


@pytest.mark.parametrize("body,status,needle", [
    ("{not json", 400, "not valid JSON"),
    ({"temperature": 0}, 400, "messages"),
    ({"messages": "hello"}, 400, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**9}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "n=1"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400, "temperature"),
    ({"messages": [{"role": "user", "content": "word " * 400}]}, 400, "context window holds 256"),
])
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(served, body, status, needle):
    kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, str) else {"json": body}
    r = served.http.post("/v1/chat/completions", **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["type"] and "message" in err
    assert served.http.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_metrics_count_drafts_and_accepted_tokens_like_vllm(served):
    def counter(text: str, name: str) -> float:
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith(name) and not line.startswith("#"))

    before = served.http.get("/metrics").text
    body = served.http.post("/v1/chat/completions", json=CHAT).json()
    after = served.http.get("/metrics").text
    for name, key in (("edge_eagle:spec_decode_num_draft_tokens_total", "drafted"),
                      ("edge_eagle:spec_decode_num_accepted_tokens_total", "accepted")):
        assert counter(after, name) - counter(before, name) == body["edge_eagle"][key]
    per_pos = counter(after, "edge_eagle:spec_decode_num_accepted_tokens_per_pos_total") - counter(
        before, "edge_eagle:spec_decode_num_accepted_tokens_per_pos_total")
    assert per_pos == body["edge_eagle"]["accepted"]
    generated = "edge_eagle:generation_tokens_total"
    assert counter(after, generated) - counter(before, generated) == body["usage"]["completion_tokens"]
    assert 'edge_eagle:requests_total{endpoint="/v1/chat/completions",status="200"}' in after


def test_api_key_guards_everything_but_health(served_engine):
    s = Served(served_engine, api_key="s3cret")
    try:
        assert s.http.get("/health").status_code == 200
        for path in ("/v1/models", "/metrics"):
            refused = s.http.get(path)
            assert refused.status_code == 401 and refused.headers["WWW-Authenticate"] == "Bearer"
        r = s.http.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        bad_json = s.http.post("/v1/chat/completions", content="{", headers={"Authorization": "Bearer nope"})
        assert bad_json.status_code == 401  # the key is checked before the body is read
        ok = s.http.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert "access-control-allow-origin" not in ok.headers  # no CORS unless asked
    finally:
        s.close()


def test_a_full_queue_answers_503_with_retry_after_and_a_disconnect_cancels(served_engine):
    s = Served(served_engine, max_queue=0)
    try:
        long = {"prompt": "Once upon a time", "temperature": 0.8, "seed": 1, "max_tokens": 200, "stream": True}
        with s.http.stream("POST", "/v1/completions", json=long) as r:
            lines = r.iter_lines()
            next(lines)  # the generation is running
            busy = httpx.post(f"{s.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 4}, timeout=30)
            assert busy.status_code == 503 and int(busy.headers["Retry-After"]) > 0
            assert busy.json()["error"]["code"] == "overloaded"
        # the client closed the stream: the generation stops at its next step
        deadline = time.time() + 20
        while s.http.get("/health").json()["running"]:
            assert time.time() < deadline, "the abandoned generation kept running"
            time.sleep(0.05)
        assert served_engine.last_stats.generated < 200
        metrics = s.http.get("/metrics").text
        assert 'edge_eagle:request_success_total{finished_reason="abort"} 1.0' in metrics
        # and the caches are consistent: the next request is what a fresh served_engine gives
        got = s.http.post("/v1/completions", json={"prompt": "Once upon a time", "temperature": 0,
                                                   "max_tokens": 20}).json()["choices"][0]["text"]
        assert got == served_engine.generate("Once upon a time", max_tokens=20).result().text
    finally:
        s.close()


def test_tokenizing_and_the_chat_template_run_off_the_event_loop(served, served_engine, monkeypatch):
    threads = {"tokenize": [], "template": []}
    tokenize, template = served_engine.target.tokenize, served_engine.apply_chat_template

    def spy(name, fn):
        def wrapper(*args, **kwargs):
            threads[name].append(threading.get_ident())
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(served_engine.target, "tokenize", spy("tokenize", tokenize))
    monkeypatch.setattr(served_engine, "apply_chat_template", spy("template", template))
    assert served.http.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert served.http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2}).status_code == 200
    assert len(threads["tokenize"]) >= 2 and threads["template"]
    loop_thread = served.thread.ident  # uvicorn runs its event loop in this thread
    assert loop_thread not in threads["tokenize"] + threads["template"]


@pytest.mark.smollm
def test_the_openai_client_talks_to_edge_eagle_serve_on_smollm(tmp_path):
    """The real command in a child process, driven by the official openai client."""
    import os
    import subprocess
    import sys

    openai = pytest.importorskip("openai")
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "edge_eagle.cli", "serve", "--port", str(port), "--k", "3",
                             "--n-ctx", "1024"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline
            time.sleep(0.3)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        model = client.models.list().data[0].id
        msgs = [{"role": "user", "content": "Name three colours."}]
        reply = client.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=32)
        text = reply.choices[0].message.content
        assert text and reply.usage.completion_tokens > 0
        stream = client.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=32,
                                                stream=True, stream_options={"include_usage": True})
        pieces, usage = [], None
        for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
            if chunk.usage:
                usage = chunk.usage
        assert "".join(pieces) == text and usage.completion_tokens == reply.usage.completion_tokens
        follow = msgs + [{"role": "assistant", "content": text}, {"role": "user", "content": "And fruits?"}]
        second = client.chat.completions.create(model=model, messages=follow, temperature=0, max_tokens=16)
        assert second.usage.prompt_tokens_details.cached_tokens >= reply.usage.prompt_tokens - 1
        # any model name serves the loaded model, as with llama-server; retrieve() works
        other = client.chat.completions.create(model="gpt-4o-mini", messages=msgs, temperature=0, max_tokens=32)
        assert other.choices[0].message.content == text
        assert client.models.retrieve(model).id == model
        lp = client.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=8, logprobs=True,
                                            top_logprobs=2).choices[0].logprobs.content
        assert lp and all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in lp)
        # structured output on the real model, parsed by the client into its pydantic class
        from pydantic import BaseModel, Field

        class Fruit(BaseModel):
            name: str = Field(max_length=12)
            color: Literal["red", "green", "yellow", "orange"]
            sweet: bool

        parsed = client.chat.completions.parse(model=model, messages=[{"role": "user", "content": "Name a fruit."}],
                                               temperature=0, max_tokens=64, response_format=Fruit)
        assert isinstance(parsed.choices[0].message.parsed, Fruit)
        with pytest.raises(openai.BadRequestError, match="no tool support"):  # SmolLM2's template has no tools
            client.chat.completions.create(model=model, messages=msgs, max_tokens=4, tools=[
                {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
