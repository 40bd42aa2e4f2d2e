"""The endpoints: /health, /metrics, /v1/models, /v1/chat/completions, /v1/completions and
/history/reset.

Each route gets its app's ServerState from the get_state dependency. Tokenizing and rendering
the chat template run in a thread, off the event loop; they only read the vocabulary, so they
may run while the worker generates."""

from __future__ import annotations

import os
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from ..errors import EdgeEagleError
from ..tools import ChatPlan, chat_plan, grammar_for
from . import responses
from .errors import APIError
from .generation import check_model, respond
from .schemas import ChatRequest, CompletionRequest
from .state import ServerState, get_state

router = APIRouter()


@router.get("/health")
async def health(state: ServerState = Depends(get_state)) -> Any:
    """200 "ok" when ready; 503 "loading" while the batch costs are being measured (as
    llama-server answers while it loads), so a client that waits for ready never waits on them."""
    worker = state.worker
    store = state.engine.learn_store
    learn: dict[str, Any] = {"on": False}
    if store is not None:  # what --learn has kept (a count over the store: well under a millisecond)
        kept = store.status()
        learn = {"on": True, "path": kept["path"], "requests": kept["requests"], "tokens": kept["tokens"],
                 "drafter_version": state.engine.drafter_version}
        if state.adapter is not None:
            last = state.adapter.reports[-1] if state.adapter.reports else None
            learn["adaptation"] = {"state": state.adapter.state, "runs": len(state.adapter.reports),
                                   "last": None if last is None else {k: last.get(k) for k in (
                                       "accepted", "reason", "tau_before", "tau_after", "version")}}
    body = responses.health(state.model_id, worker.running, worker.admitted - worker.running,
                            ready=worker.ready.is_set(), calibration=state.engine.calibration, learn=learn)
    if not worker.ready.is_set():
        return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})
    return body


@router.get("/metrics")
async def prometheus(state: ServerState = Depends(get_state)) -> Response:
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/v1/models")
async def models(state: ServerState = Depends(get_state)) -> dict[str, Any]:
    state.metrics.requests.labels("/v1/models", "200").inc()
    target = state.engine.target
    return responses.model_list(state.model_id, int(os.path.getmtime(target.path)), state.drafter_name,
                                state.options.k, target.n_ctx)


@router.get("/v1/models/{model_id:path}")
async def model(model_id: str, state: ServerState = Depends(get_state)) -> dict[str, Any]:
    """The loaded model (client.models.retrieve); any name is it, unless the server is strict."""
    check_model(state, model_id)
    state.metrics.requests.labels("/v1/models/{id}", "200").inc()
    target = state.engine.target
    return responses.model_list(state.model_id, int(os.path.getmtime(target.path)), state.drafter_name,
                                state.options.k, target.n_ctx)["data"][0]


@router.post("/history/reset")
async def reset_history(state: ServerState = Depends(get_state)) -> dict[str, Any]:
    """Forget the earlier requests' text that suffix drafts draw on (kept in memory only); it
    waits for the running generation, like any request."""
    await run_in_threadpool(state.engine.reset_history)
    state.metrics.requests.labels("/history/reset", "200").inc()
    return {"status": "ok", "history": state.engine.suffix.stats()}


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, body: ChatRequest, state: ServerState = Depends(get_state)) -> Any:
    messages = [m.for_template() for m in body.messages]
    try:
        plan = await run_in_threadpool(chat_plan, state.engine, messages, tools=body.tools,
                                       tool_choice=body.tool_choice, response_format=body.response_format,
                                       grammar=body.grammar)
    except EdgeEagleError as exc:  # a field that cannot run, or a message the template or tokenizer refuses
        raise APIError(400, str(exc), param=getattr(exc, "param", "messages")) from None
    return await respond(state, request, body, plan, "chat")


@router.post("/v1/completions")
async def completions(request: Request, body: CompletionRequest, state: ServerState = Depends(get_state)) -> Any:
    prompt = await _tokenize(state, body.text(), "prompt")
    try:
        plan = ChatPlan(prompt, grammar=grammar_for(body.response_format, body.grammar))
    except EdgeEagleError as exc:
        raise APIError(400, str(exc), param=getattr(exc, "param", "response_format")) from None
    return await respond(state, request, body, plan, "text")


async def _tokenize(state: ServerState, text: str, param: str, add_special: bool = True) -> list[int]:
    try:
        return await run_in_threadpool(state.engine.target.tokenize, text, add_special=add_special)
    except EdgeEagleError as exc:  # text that is not valid Unicode
        raise APIError(400, str(exc), param=param) from None
