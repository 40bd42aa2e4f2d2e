"""The ASGI app (FastAPI): /v1/models, /v1/chat/completions, /v1/completions, /health, /metrics.

Responses carry OpenAI's `usage`, an `edge_eagle` object with the acceptance figures, and
llama-server's `timings` (draft_n, draft_n_accepted, ...) so clients that read those work.
Errors are OpenAI-shaped JSON: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..api import EdgeEagle, Token
from ..errors import EdgeEagleError
from .metrics import Metrics
from .schemas import ChatRequest, CompletionRequest, Sampling
from .worker import Job, Worker


@dataclass
class ServerOptions:
    api_key: str | None = None
    max_queue: int = 8  # requests that may wait behind the running one; more get 503
    cors_origins: tuple[str, ...] = ()
    k: int | str | None = None  # draft length for every request (None: the engine's)
    retry_after_s: int = 2


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers


def _error(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
           code: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                        status_code=status, headers=headers)


def _finish_reason(reason: str | None) -> str:
    return "length" if reason in ("length", "context") else "stop"


class ApiKeyMiddleware:
    """Every endpoint but /health (and CORS preflights) needs 'Authorization: Bearer KEY',
    compared in constant time; checked before the body is read."""

    def __init__(self, app: Any, key: str, metrics: Metrics):
        self.app, self.key, self.metrics = app, key.encode(), metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] != "/health" and scope["method"] != "OPTIONS":
            header = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, given = header.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.key):
                self.metrics.requests.labels(scope["path"], "401").inc()
                response = _error(401, "Missing or wrong API key; send the header 'Authorization: Bearer <key>'.",
                                  code="invalid_api_key")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(engine: EdgeEagle, options: ServerOptions | None = None) -> FastAPI:
    """The app over one engine (which it does not close)."""
    opts = options or ServerOptions()
    if opts.k is None:
        opts = dataclasses.replace(opts, k=engine.k)
    metrics = Metrics()
    model_id = os.path.basename(engine.target.path).removesuffix(".gguf")
    drafter_name = engine.drafter.name if engine.drafter is not None else "none"
    def finished(job: Job) -> None:
        gen = job.generation
        reason = "abort" if gen.finish_reason == "cancelled" else _finish_reason(gen.finish_reason)
        metrics.record(gen.stats, len(gen.tokens), reason)

    worker = Worker(engine, opts.max_queue, on_finish=finished,
                    on_change=lambda running, waiting: (metrics.running.set(running), metrics.waiting.set(waiting)))
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        worker.close()

    app = FastAPI(title="edge-eagle", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.worker, app.state.metrics, app.state.model_id = worker, metrics, model_id
    if opts.api_key is not None:
        app.add_middleware(ApiKeyMiddleware, key=opts.api_key, metrics=metrics)
    if opts.cors_origins:  # added last, so outermost: a 401 carries CORS headers too
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(opts.cors_origins), allow_methods=["*"],
                           allow_headers=["*"])

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        metrics.requests.labels(request.url.path, str(exc.status)).inc()
        return _error(exc.status, exc.message, exc.type, exc.param, exc.code, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        metrics.requests.labels(request.url.path, "400").inc()
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            return _error(400, "The request body is not valid JSON; send a JSON object.")
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        where = ".".join(loc) or "body"
        return _error(400, f"Invalid '{where}': {first.get('msg', 'invalid value')}; fix it and retry.", param=where)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, f"{exc.detail}; see GET /v1/models and the README for the endpoints.",
                      code=str(exc.status_code))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_id, "running": worker.running,
                "waiting": worker.admitted - worker.running}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        metrics.requests.labels("/v1/models", "200").inc()
        return {"object": "list", "data": [{
            "id": model_id, "object": "model", "created": int(os.path.getmtime(engine.target.path)),
            "owned_by": "edge-eagle",
            "edge_eagle": {"drafter": drafter_name, "k": opts.k, "n_ctx": engine.target.n_ctx}}]}

    # --- generation --------------------------------------------------------------------

    def check_model(body: Sampling) -> None:
        if body.model not in (None, "", model_id, "default"):
            raise APIError(404, f"The model '{body.model}' does not exist here; use '{model_id}' (GET /v1/models).",
                           param="model", code="model_not_found")

    def prepare(body: Sampling, prompt: list[int]) -> dict[str, Any]:
        n_ctx = engine.target.n_ctx
        if not prompt:
            raise APIError(400, "The prompt is empty; send some text.", param="prompt")
        if len(prompt) >= n_ctx:
            raise APIError(400, f"The prompt has {len(prompt)} tokens but the context window holds {n_ctx}; "
                           "shorten it or start the server with a larger --n-ctx.", code="context_length_exceeded")
        limit = body.limit()
        if limit is not None and not 1 <= limit <= n_ctx:
            raise APIError(400, f"max_tokens must be between 1 and the context window ({n_ctx}), got {limit}.",
                           param="max_tokens")
        return dict(max_tokens=limit if limit is not None else n_ctx - len(prompt), temperature=body.temperature,
                    top_k=body.top_k, top_p=body.top_p, seed=body.seed, stop=body.stops(), k=opts.k)

    async def run(request: Request, body: Sampling, prompt: list[int], kind: str) -> Any:
        check_model(body)
        job = Job(prompt, prepare(body, prompt), asyncio.get_running_loop())
        if not worker.submit(job):
            raise APIError(503, f"The server is busy ({worker.admitted} requests admitted); retry in "
                           f"{opts.retry_after_s} s.", type_="server_error", code="overloaded",
                           headers={"Retry-After": str(opts.retry_after_s)})
        endpoint = request.url.path
        rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            metrics.requests.labels(endpoint, "200").inc()
            return EventSourceResponse(stream(job, kind, rid, created, include_usage), ping=15,
                                       send_timeout=30)
        text, error = await collect(request, job)
        if error is not None:
            metrics.requests.labels(endpoint, "500").inc()
            raise APIError(500, f"Generation failed: {error}", type_="server_error")
        metrics.requests.labels(endpoint, "200").inc()
        gen = job.generation
        finish = _finish_reason(gen.finish_reason if gen else None)
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if kind == "chat":
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {"id": rid, "object": "chat.completion" if kind == "chat" else "text_completion",
                "created": created, "model": model_id, "choices": [choice], **report(job)}

    async def collect(request: Request, job: Job) -> tuple[str, Exception | None]:
        parts: list[str] = []
        error = None
        while True:
            try:
                kind, value = await asyncio.wait_for(job.events.get(), timeout=0.5)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    job.cancel()
                continue
            if kind == "token":
                parts.append(value.text)
            elif kind == "error":
                error = value
            else:
                return "".join(parts), error

    async def stream(job: Job, kind: str, rid: str, created: int, include_usage: bool) -> AsyncIterator[str]:
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"

        def chunk(delta: dict[str, Any] | None, text: str | None, finish: str | None, **extra: Any) -> str:
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
            if kind == "chat":
                choice["delta"] = delta or {}
            else:
                choice["text"] = text or ""
            return json.dumps({"id": rid, "object": obj, "created": created, "model": model_id,
                               "choices": [choice], **extra})

        try:
            if kind == "chat":
                yield chunk({"role": "assistant", "content": ""}, None, None)
            while True:
                what, value = await job.events.get()
                if what == "token":
                    tok: Token = value
                    if tok.text:
                        yield chunk({"content": tok.text}, tok.text, None,
                                    edge_eagle={"origin": tok.origin})
                elif what == "error":
                    yield json.dumps({"error": {"message": f"Generation failed: {value}", "type": "server_error",
                                                "param": None, "code": None}})
                else:
                    break
            gen = job.generation
            rep = report(job)
            finish = _finish_reason(gen.finish_reason if gen else None)
            yield chunk({}, "", finish, edge_eagle=rep["edge_eagle"], timings=rep["timings"])
            if include_usage:
                yield json.dumps({"id": rid, "object": obj, "created": created, "model": model_id, "choices": [],
                                  "usage": rep["usage"]})
            yield "[DONE]"
        finally:  # the client went away (the task is cancelled) or the stream ended
            if job.generation is None or job.generation.finish_reason is None:
                job.cancel()

    def report(job: Job) -> dict[str, Any]:
        gen = job.generation
        if gen is None:
            return {"usage": {"prompt_tokens": len(job.tokens), "completion_tokens": 0,
                              "total_tokens": len(job.tokens)}, "edge_eagle": {}, "timings": {}}
        s = gen.stats
        completion = len(gen.tokens)
        return {
            "usage": {"prompt_tokens": s.prompt_tokens, "completion_tokens": completion,
                      "total_tokens": s.prompt_tokens + completion,
                      "prompt_tokens_details": {"cached_tokens": s.prompt_cached}},
            "edge_eagle": {"drafter": drafter_name, "k": opts.k, "k_mean": round(s.k_mean, 3), "tau": round(s.tau, 4),
                           "drafted": s.drafted, "accepted": s.accepted, "verify_steps": s.verify_steps,
                           "acceptance_rate": round(s.acceptance_rate, 4),
                           "per_position_acceptance": [round(x, 4) for x in s.per_position_acceptance],
                           "tokens_per_second": round(s.tokens_per_second, 3),
                           "prompt_cached_tokens": s.prompt_cached,
                           "prompt_prefilled_tokens": s.prompt_tokens - s.prompt_cached},
            "timings": {"prompt_n": s.prompt_tokens - s.prompt_cached, "cache_n": s.prompt_cached,
                        "prompt_ms": round(1000 * s.t_prefill, 3), "predicted_n": completion,
                        "predicted_ms": round(1000 * s.t_total, 3),
                        "predicted_per_second": round(s.tokens_per_second, 3),
                        "draft_n": s.drafted, "draft_n_accepted": s.accepted},
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatRequest) -> Any:
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                    for m in body.messages]
        try:
            text = engine.apply_chat_template(messages)
        except EdgeEagleError as exc:
            raise APIError(400, str(exc), param="messages") from None
        prompt = engine.target.tokenize(text, add_special=False)
        return await run(request, body, prompt, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest) -> Any:
        return await run(request, body, engine.target.tokenize(body.text()), "text")

    return app
