"""Serving one generation request: validate it, queue it on the worker, and answer with one
JSON body or a stream of server-sent events. A client that goes away cancels its job."""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

from fastapi import Request
from sse_starlette.sse import EventSourceResponse

from .. import compat
from ..api import Token, check_logit_bias
from ..errors import EdgeEagleError
from ..grammar import Grammar
from ..tools import ChatPlan, ToolStream
from . import responses
from .errors import APIError
from .schemas import Sampling
from .state import ServerState
from .worker import Job


def check_model(state: ServerState, name: str | None) -> None:
    """Any model name serves the loaded model, as with llama-server (an app configured for another
    model's name works); with the strict option, only its id or "default"."""
    if state.options.strict_model and name not in (None, "", state.model_id, "default"):
        raise APIError(404, f"The model '{name}' does not exist here; use '{state.model_id}' "
                       "(GET /v1/models).", param="model", code="model_not_found")


def generate_options(state: ServerState, body: Sampling, plan: ChatPlan) -> dict[str, Any]:
    """The engine's generate() options for this request; APIError when the request cannot run."""
    prompt = plan.prompt
    n_ctx = state.engine.target.n_ctx
    if not prompt:
        raise APIError(400, "The prompt is empty; send some text.", param="prompt")
    if len(prompt) >= n_ctx:
        raise APIError(400, f"The prompt has {len(prompt)} tokens but the context window holds {n_ctx}; "
                       "shorten it or start the server with a larger --n-ctx.", code="context_length_exceeded")
    try:  # checked here, not in the worker: a 400 before the request is queued
        check_logit_bias(body.logit_bias, state.engine.target.n_vocab)
    except EdgeEagleError as exc:
        raise APIError(400, str(exc), param="logit_bias") from None
    if plan.grammar:
        try:
            Grammar(state.engine.target, plan.grammar).close()
        except EdgeEagleError as exc:
            raise APIError(400, str(exc), param="grammar" if body.grammar else "response_format") from None
    limit = body.limit()
    if limit is not None and not 1 <= limit <= n_ctx:
        raise APIError(400, f"max_tokens must be between 1 and the context window ({n_ctx}), got {limit}.",
                       param="max_tokens")
    return dict(max_tokens=limit if limit is not None else n_ctx - len(prompt), temperature=body.temperature,
                top_k=body.top_k, top_p=body.top_p, seed=body.seed, stop=body.stops(), k=state.options.k,
                logprobs=body.logprobs_n(), logit_bias=body.logit_bias, presence_penalty=body.presence_penalty,
                frequency_penalty=body.frequency_penalty, repeat_penalty=body.repeat_penalty, grammar=plan.grammar)


def figures(state: ServerState, job: Job) -> dict[str, Any]:
    """`usage`, `edge_eagle` and `timings` for a finished job."""
    gen = job.generation
    if gen is None:
        return responses.unstarted_report(len(job.tokens))
    drafter = gen.drafter_name if gen.drafter_name != "none" else state.drafter_name
    return responses.report(gen.stats.to_dict(), len(gen.tokens), drafter, state.options.k, gen.drafter_version,
                            gen.flash_attn)


def job_finish_reason(job: Job) -> str:
    return responses.finish_reason(job.generation.finish_reason if job.generation else None)


async def respond(state: ServerState, request: Request, body: Sampling, plan: ChatPlan, kind: str) -> Any:
    """Run `plan` (its prompt and grammar) for a request of `kind` ("chat" or "text"): a response
    body, or an SSE stream."""
    check_model(state, body.model)
    opts = state.options
    job = Job(plan.prompt, generate_options(state, body, plan), asyncio.get_running_loop())
    if not state.worker.submit(job):
        raise APIError(503, f"The server is busy ({state.worker.admitted} requests admitted); retry in "
                       f"{opts.retry_after_s} s.", type_="server_error", code="overloaded",
                       headers={"Retry-After": str(opts.retry_after_s)})
    endpoint = request.url.path
    env = responses.Envelope.new(kind, state.model_id)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        state.metrics.requests.labels(endpoint, "200").inc()
        return EventSourceResponse(stream(state, job, env, include_usage, plan.stream()), ping=15, send_timeout=30)
    tokens, error = await collect(request, job)
    if error is not None:
        state.metrics.requests.labels(endpoint, "500").inc()
        raise APIError(500, f"Generation failed: {error}", type_="server_error")
    state.metrics.requests.labels(endpoint, "200").inc()
    items = [compat.logprob_item(state.engine, t) for t in tokens] if job.options.get("logprobs") is not None else None
    content, calls = plan.finish("".join(t.text for t in tokens))
    return responses.completion(env, content, "tool_calls" if calls else job_finish_reason(job), figures(state, job),
                                [i for i in items if i is not None] if items is not None else None, calls)


async def _cancel_on_disconnect(request: Request, job: Job) -> None:
    """Wait for the client's disconnect (the body has been read: the next ASGI message is it)
    and cancel the job: it stops at its next step, whether tokens are flowing or not."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return


async def collect(request: Request, job: Job) -> tuple[list[Token], Exception | None]:
    """The job's tokens and its error, if any; cancels the job if the client disconnects."""
    parts: list[Token] = []
    error = None
    watcher = asyncio.ensure_future(_cancel_on_disconnect(request, job))
    try:
        while True:
            kind, value = await job.events.get()
            if kind == "token":
                parts.append(value)
            elif kind == "error":
                error = value
            else:
                return parts, error
    finally:
        watcher.cancel()


async def stream(state: ServerState, job: Job, env: responses.Envelope, include_usage: bool,
                 calls: ToolStream) -> AsyncIterator[str]:
    """The SSE data lines of a streamed response, ending with "[DONE]"; `calls` holds back text
    that may be a tool call and parses it at the end."""
    try:
        if env.kind == "chat":
            yield json.dumps(responses.role_chunk(env))
        offset = 0
        while True:
            what, value = await job.events.get()
            if what == "token":
                tok: Token = value
                item = compat.logprob_item(state.engine, tok)
                text = calls.feed(tok.text)
                if text or item is not None:  # else: the first bytes of a character, nothing to send
                    yield json.dumps(responses.token_chunk(env, text, tok.origin, item, offset))
                    offset += len(text)
            elif what == "error":
                yield json.dumps(responses.error_body(f"Generation failed: {value}", "server_error"))
            else:
                break
        rest, tool_calls = calls.finish()
        if rest:
            yield json.dumps(responses.token_chunk(env, rest, "target"))
        if tool_calls:
            yield json.dumps(responses.tool_calls_chunk(env, tool_calls))
        rep = figures(state, job)
        yield json.dumps(responses.final_chunk(env, "tool_calls" if tool_calls else job_finish_reason(job), rep))
        if include_usage:
            yield json.dumps(responses.usage_chunk(env, rep))
        yield "[DONE]"
    finally:  # the client went away (the task is cancelled) or the stream ended
        if job.generation is None or job.generation.finish_reason is None:
            job.cancel()
