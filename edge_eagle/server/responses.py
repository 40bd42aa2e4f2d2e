"""The OpenAI-shaped bodies the server sends, built from plain values.

Stats arrive as `SpecStats.to_dict()`: the `edge_eagle` object and llama-server's `timings`
read its keys, so the server reports the same figures, rounded the same way, as every other
report. Every function here is pure, apart from Envelope.new(), which draws an id and reads
the clock."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Mapping

Stats = Mapping[str, Any]  # SpecStats.to_dict()


@dataclass(frozen=True)
class Envelope:
    """What every object of one response repeats. kind: "chat" (/v1/chat/completions) or
    "text" (/v1/completions)."""

    kind: str
    id: str
    created: int
    model: str

    @classmethod
    def new(cls, kind: str, model: str) -> "Envelope":
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        return cls(kind, prefix + uuid.uuid4().hex[:24], int(time.time()), model)

    def head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.kind == "chat" else "text_completion"


def finish_reason(reason: str | None) -> str:
    """OpenAI's finish_reason for a generation's: a full context window is a "length" stop too;
    a cancelled (or never started) generation reads as "stop"."""
    return "length" if reason in ("length", "context") else "stop"


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


# --- the figures every response ends with ------------------------------------------------


def usage(stats: Stats, completion_tokens: int) -> dict[str, Any]:
    prompt = stats["prompt_tokens"]
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": stats["prompt_cached_tokens"]}}


def edge_eagle_stats(stats: Stats, drafter: str, k: int | str | None, drafter_version: int = 0,
                     flash_attn: str | None = None) -> dict[str, Any]:
    """The acceptance figures of one generation, and the flash attention it ran with."""
    return {"drafter": drafter, "drafter_version": drafter_version, "flash_attn": flash_attn, "k": k,
            "k_mean": stats["k_mean"],
            "tau": stats["tau"],
            "drafted": stats["drafted"], "accepted": stats["accepted"], "verify_steps": stats["verify_steps"],
            "acceptance_rate": stats["acceptance_rate"],
            "per_position_acceptance": list(stats["per_position_acceptance"]),
            "tokens_per_second": stats["tokens_per_second"],
            "prompt_cached_tokens": stats["prompt_cached_tokens"],
            "prompt_prefilled_tokens": stats["prompt_prefilled_tokens"]}


def timings(stats: Stats, completion_tokens: int) -> dict[str, Any]:
    """llama-server's `timings` object, which clients such as its web UI read."""
    return {"prompt_n": stats["prompt_prefilled_tokens"], "cache_n": stats["prompt_cached_tokens"],
            "prompt_ms": stats["time_ms"]["prefill"], "predicted_n": completion_tokens,
            "predicted_ms": stats["time_ms"]["total"], "predicted_per_second": stats["tokens_per_second"],
            "draft_n": stats["drafted"], "draft_n_accepted": stats["accepted"]}


def report(stats: Stats, completion_tokens: int, drafter: str, k: int | str | None,
           drafter_version: int = 0, flash_attn: str | None = None) -> dict[str, Any]:
    """`usage`, `edge_eagle` and `timings` of a generation that ran."""
    return {"usage": usage(stats, completion_tokens), "edge_eagle": edge_eagle_stats(stats, drafter, k,
                                                                                   drafter_version, flash_attn),
            "timings": timings(stats, completion_tokens)}


def unstarted_report(prompt_tokens: int) -> dict[str, Any]:
    """The figures of a request whose generation never started (cancelled while it waited, or
    failed to start): only the prompt's length is known."""
    return {"usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens},
            "edge_eagle": {}, "timings": {}}


# --- bodies ------------------------------------------------------------------------------


#: one emitted token's logprob entry: (text, bytes, logprob, [(text, bytes, logprob) of the most probable])
LogprobItem = tuple[str, bytes, float, list[tuple[str, bytes, float]]]


def logprobs(kind: str, items: list[LogprobItem], offset: int = 0) -> dict[str, Any]:
    """OpenAI's `logprobs` object: chat's {"content": [...]} or completions' parallel lists
    (text_offset counted from `offset`, the characters before these tokens)."""
    if kind == "chat":
        return {"content": [{"token": t, "logprob": lp, "bytes": list(b),
                             "top_logprobs": [{"token": tt, "logprob": tlp, "bytes": list(tb)} for tt, tb, tlp in top]}
                            for t, b, lp, top in items], "refusal": None}
    offsets, at = [], offset
    for t, _, _, _ in items:
        offsets.append(at)
        at += len(t)
    return {"tokens": [t for t, _, _, _ in items], "token_logprobs": [lp for _, _, lp, _ in items],
            "top_logprobs": [{tt: tlp for tt, _, tlp in top} for _, _, _, top in items], "text_offset": offsets}


def completion(env: Envelope, text: str | None, finish: str, figures: Mapping[str, Any],
               logprob_items: list[LogprobItem] | None = None,
               tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A non-streaming response; `figures` is report()'s or unstarted_report()'s. A chat answer
    with tool calls has them in its message (its content: the text outside them, or null)."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish,
                              "logprobs": None if logprob_items is None else logprobs(env.kind, logprob_items)}
    if env.kind == "chat":
        choice["message"] = {"role": "assistant", "content": text}
        if tool_calls:
            choice["message"]["tool_calls"] = tool_calls
    else:
        choice["text"] = text
    obj = "chat.completion" if env.kind == "chat" else "text_completion"
    return {**env.head(obj), "choices": [choice], **figures}


def _chunk(env: Envelope, delta: dict[str, Any], text: str, finish: str | None, **extra: Any) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
    if env.kind == "chat":
        choice["delta"] = delta
    else:
        choice["text"] = text
    return {**env.head(env.chunk_object), "choices": [choice], **extra}


def role_chunk(env: Envelope) -> dict[str, Any]:
    """A chat stream's first chunk, which names the speaker before any text."""
    return _chunk(env, {"role": "assistant", "content": ""}, "", None)


def token_chunk(env: Envelope, text: str, origin: str, logprob_item: LogprobItem | None = None,
                offset: int = 0) -> dict[str, Any]:
    """One token's text; origin: "draft" (an accepted draft token) or "target"."""
    chunk = _chunk(env, {"content": text}, text, None, edge_eagle={"origin": origin})
    if logprob_item is not None:
        chunk["choices"][0]["logprobs"] = logprobs(env.kind, [logprob_item], offset)
    return chunk


def tool_calls_chunk(env: Envelope, tool_calls: list[dict[str, Any]]) -> dict[str, Any]:
    """A chat stream's tool calls, whole, in one chunk (each with its index, as OpenAI streams them)."""
    return _chunk(env, {"tool_calls": [{"index": i, **call} for i, call in enumerate(tool_calls)]}, "", None)


def final_chunk(env: Envelope, finish: str, figures: Mapping[str, Any]) -> dict[str, Any]:
    """The chunk that closes a stream: no text, the finish reason and the acceptance figures."""
    return _chunk(env, {}, "", finish, edge_eagle=figures["edge_eagle"], timings=figures["timings"])


def usage_chunk(env: Envelope, figures: Mapping[str, Any]) -> dict[str, Any]:
    """stream_options.include_usage's extra chunk: no choices, the usage."""
    return {**env.head(env.chunk_object), "choices": [], "usage": figures["usage"]}


def model_list(model: str, created: int, drafter: str, k: int | str | None, n_ctx: int) -> dict[str, Any]:
    return {"object": "list", "data": [{
        "id": model, "object": "model", "created": created, "owned_by": "edge-eagle",
        "edge_eagle": {"drafter": drafter, "k": k, "n_ctx": n_ctx}}]}


def health(model: str, running: int, waiting: int, ready: bool = True,
           calibration: dict[str, Any] | None = None, learn: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"status": "ok" if ready else "loading", "model": model, "running": running,
                            "waiting": waiting}
    if calibration is not None:
        body["calibration"] = dict(calibration)
    if learn is not None:
        body["learn"] = learn
    return body
