"""llama-cpp-python's in-process API on EdgeEagle: create_completion() and create_chat_completion()
take `llama_cpp.Llama`'s arguments, with its defaults, and return its dicts (or, with
stream=True, iterators of its chunks), each with the `edge_eagle` object and llama-server's
`timings` added. An app written against llama-cpp-python switches by changing its constructor.

`grammar` (a llama_cpp.LlamaGrammar or GBNF text), `response_format` and `tools` /
`tool_choice` constrain and read the output as tools.py says, the same as the server does.
Arguments llama-cpp-python has and edge-eagle does not implement raise EdgeEagleError when they
ask for something (typical_p, tfs_z, mirostat, logits processors, stopping criteria, echo,
suffix, the legacy functions); left at their defaults they are accepted, as they change nothing.
The server's bodies are the same builders (server/responses.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from .errors import EdgeEagleError
from .tools import ChatPlan, ToolStream, chat_plan

if TYPE_CHECKING:
    from .api import EdgeEagle, Generation, Token

_DEFAULTS_ONLY = {  # argument: (its "off" value, what to say)
    "suffix": (None, "suffix (insertion) is not implemented"),
    "echo": (False, "echo is not implemented"),
    "typical_p": (1.0, "typical_p is not implemented; pass 1.0"),
    "tfs_z": (1.0, "tfs_z is not implemented; pass 1.0"),
    "mirostat_mode": (0, "mirostat is not implemented; pass 0"),
    "logits_processor": (None, "logits processors are not implemented"),
    "stopping_criteria": (None, "stopping criteria are not implemented; use stop strings"),
    "functions": (None, "the legacy functions are not implemented; pass them as tools"),
    "function_call": (None, "the legacy function_call is not implemented; use tools and tool_choice"),
}


def _refuse_unsupported(args: Mapping[str, Any]) -> None:
    for name, value in args.items():
        off, why = _DEFAULTS_ONLY.get(name, (value, ""))
        if value != off and not (off is None and not value):
            raise EdgeEagleError(f"{name}: {why}.")


def grammar_text(grammar: Any) -> str | None:
    """A llama_cpp.LlamaGrammar's GBNF text (or the text itself)."""
    if grammar is None or isinstance(grammar, str):
        return grammar or None
    text = getattr(grammar, "_grammar", None)
    if not isinstance(text, str):
        raise EdgeEagleError("grammar must be a llama_cpp.LlamaGrammar or GBNF text.")
    return text


def _stops(stop: str | Sequence[str] | None) -> list[str]:
    if not stop:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def logprob_item(engine: "EdgeEagle", tok: "Token") -> tuple[str, bytes, float, list[tuple[str, bytes, float]]] | None:
    """A token's logprob entry for responses.logprobs() (None when none was asked for)."""
    if tok.logprob is None:
        return None

    def text(i: int) -> tuple[str, bytes]:
        raw = engine.target.token_bytes(i)
        return raw.decode("utf-8", errors="replace"), raw

    t, b = text(tok.id)
    return t, b, tok.logprob, [(*text(i), lp) for i, lp in tok.top_logprobs or ()]


def _figures(engine: "EdgeEagle", gen: "Generation") -> dict[str, Any]:
    from .server import responses as R

    drafter = engine.drafter.name if engine.drafter is not None else "none"
    return R.report(gen.stats.to_dict(), len(gen.tokens), drafter, engine.k)


def _model_name(engine: "EdgeEagle", model: str | None) -> str:
    return model or engine.target.path  # llama-cpp-python names the model by its path


def _run(engine: "EdgeEagle", kind: str, gen: "Generation", model: str, stream: bool,
         want_logprobs: bool, plan: ChatPlan | None = None) -> Any:
    from .server import responses as R

    env = R.Envelope.new(kind, model)
    if stream:
        return _stream(engine, env, gen, want_logprobs, plan)
    tokens = list(gen)
    items = [i for i in (logprob_item(engine, t) for t in tokens) if i is not None] if want_logprobs else None
    content, calls = plan.finish(gen.text) if plan is not None else (gen.text, [])
    finish = "tool_calls" if calls else R.finish_reason(gen.finish_reason)
    return R.completion(env, content, finish, _figures(engine, gen), items, calls)


def _stream(engine: "EdgeEagle", env: Any, gen: "Generation", want_logprobs: bool,
            plan: ChatPlan | None) -> Iterator[dict[str, Any]]:
    from .server import responses as R

    if env.kind == "chat":
        yield R.role_chunk(env)
    calls = ToolStream(plan.style if plan is not None else None)
    offset = 0
    for tok in gen:
        item = logprob_item(engine, tok) if want_logprobs else None
        text = calls.feed(tok.text)
        if text or item is not None:
            yield R.token_chunk(env, text, tok.origin, item, offset)
            offset += len(text)
    rest, tool_calls = calls.finish()
    if rest:
        yield R.token_chunk(env, rest, "target")
    if tool_calls:
        yield R.tool_calls_chunk(env, tool_calls)
    finish = "tool_calls" if tool_calls else R.finish_reason(gen.finish_reason)
    yield R.final_chunk(env, finish, _figures(engine, gen))


class LlamaCompat:
    """The llama-cpp-python methods of EdgeEagle (a mixin; `self` is the engine)."""

    def create_completion(self, prompt: str | list[int], suffix: str | None = None, max_tokens: int | None = 16,
                          temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05,
                          typical_p: float = 1.0, logprobs: int | None = None, echo: bool = False,
                          stop: str | list[str] | None = [], frequency_penalty: float = 0.0,  # noqa: B006
                          presence_penalty: float = 0.0, repeat_penalty: float = 1.0, top_k: int = 40,
                          stream: bool = False, seed: int | None = None, tfs_z: float = 1.0, mirostat_mode: int = 0,
                          mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: str | None = None,
                          stopping_criteria: Any = None, logits_processor: Any = None, grammar: Any = None,
                          logit_bias: dict[int, float] | None = None) -> Any:
        """llama_cpp.Llama.create_completion: a text_completion dict, or with stream=True an
        iterator of its chunks. max_tokens None or below 1: up to the end of the window."""
        engine: EdgeEagle = self  # type: ignore[assignment]
        _refuse_unsupported(dict(suffix=suffix, echo=echo, typical_p=typical_p, tfs_z=tfs_z,
                                 mirostat_mode=mirostat_mode, logits_processor=logits_processor,
                                 stopping_criteria=stopping_criteria))
        ids = engine.target.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        limit = max_tokens if max_tokens and max_tokens > 0 else engine.target.n_ctx - len(ids)
        gen = engine.generate(ids, max_tokens=max(1, limit), temperature=temperature, top_k=top_k, top_p=top_p,
                              min_p=min_p, seed=seed if seed is None or seed >= 0 else None, stop=_stops(stop),
                              logprobs=logprobs, logit_bias=logit_bias, presence_penalty=presence_penalty,
                              frequency_penalty=frequency_penalty, repeat_penalty=repeat_penalty,
                              grammar=grammar_text(grammar))
        return _run(engine, "text", gen, _model_name(engine, model), stream, logprobs is not None)

    def create_chat_completion(self, messages: Sequence[Mapping[str, Any]], functions: Any = None,
                               function_call: Any = None, tools: Any = None, tool_choice: Any = None,
                               temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05,
                               typical_p: float = 1.0, stream: bool = False, stop: str | list[str] | None = [],  # noqa: B006
                               seed: int | None = None, response_format: Mapping[str, Any] | None = None,
                               max_tokens: int | None = None, presence_penalty: float = 0.0,
                               frequency_penalty: float = 0.0, repeat_penalty: float = 1.0, tfs_z: float = 1.0,
                               mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                               model: str | None = None, logits_processor: Any = None, grammar: Any = None,
                               logit_bias: dict[int, float] | None = None, logprobs: bool | None = None,
                               top_logprobs: int | None = None) -> Any:
        """llama_cpp.Llama.create_chat_completion: a chat.completion dict, or with stream=True an
        iterator of chat.completion.chunk dicts. The target's own chat template renders `messages`
        (text content parts are joined). max_tokens None: up to the end of the window."""
        engine: EdgeEagle = self  # type: ignore[assignment]
        _refuse_unsupported(dict(functions=functions, function_call=function_call, typical_p=typical_p, tfs_z=tfs_z,
                                 mirostat_mode=mirostat_mode, logits_processor=logits_processor))
        if top_logprobs and not logprobs:
            raise EdgeEagleError("top_logprobs needs logprobs=True.")
        plan = chat_plan(engine, messages, tools=tools, tool_choice=tool_choice, response_format=response_format,
                         grammar=grammar_text(grammar))
        ids = plan.prompt
        limit = max_tokens if max_tokens and max_tokens > 0 else engine.target.n_ctx - len(ids)
        n_top = (top_logprobs or 0) if logprobs else None
        gen = engine.generate(ids, max_tokens=max(1, limit), temperature=temperature, top_k=top_k, top_p=top_p,
                              min_p=min_p, seed=seed if seed is None or seed >= 0 else None, stop=_stops(stop),
                              logprobs=n_top, logit_bias=logit_bias, presence_penalty=presence_penalty,
                              frequency_penalty=frequency_penalty, repeat_penalty=repeat_penalty,
                              grammar=plan.grammar)
        return _run(engine, "chat", gen, _model_name(engine, model), stream, n_top is not None, plan)

