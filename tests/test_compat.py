"""llama-cpp-python's in-process API on EdgeEagle: the same calls on llama_cpp.Llama and on
EdgeEagle (the embedded SmolLM2) give dicts and chunk streams of the same shape, key by key."""

from __future__ import annotations

import numbers
from typing import Any

import pytest

from edge_eagle import EdgeEagle, EdgeEagleError


def _shape_missing(theirs: Any, ours: Any, path: str = "") -> list[str]:
    """Every key path of `theirs` that `ours` lacks, or holds with another type (where theirs is
    None ours may hold anything; any real numbers match; lists compare their first elements)."""
    if isinstance(theirs, dict):
        if not isinstance(ours, dict):
            return [f"{path}: {type(ours).__name__} instead of a dict"]
        out = []
        for key, value in theirs.items():
            if key not in ours:
                out.append(f"{path}.{key} missing")
            else:
                out += _shape_missing(value, ours[key], f"{path}.{key}")
        return out
    if isinstance(theirs, list):
        if not isinstance(ours, list):
            return [f"{path}: {type(ours).__name__} instead of a list"]
        return _shape_missing(theirs[0], ours[0], f"{path}[0]") if theirs and ours else []
    number = numbers.Real  # llama-cpp-python gives some figures as numpy float32
    if theirs is None:  # a field llama-cpp-python leaves empty (e.g. a chat logprob's bytes): ours may fill it
        return []
    if ours is None:
        return [f"{path}: None against {theirs!r}"]
    if isinstance(theirs, number) and not isinstance(theirs, bool):
        return [] if isinstance(ours, number) and not isinstance(ours, bool) else [f"{path}: not a number"]
    return [] if type(theirs) is type(ours) else [f"{path}: {type(ours).__name__} against {type(theirs).__name__}"]


@pytest.fixture(scope="module")
def pair(smollm):
    from llama_cpp import Llama

    from edge_eagle._llama import llama_cpp_python_repack

    # as edge-eagle loads its models: on a CPU and build with AMX kernels, llama.cpp's AMX
    # matmul stops with "Illegal instruction" on the prompt's batch (system.AMX_BUG)
    with llama_cpp_python_repack():
        llama = Llama(model_path=str(smollm), n_ctx=512, n_threads=2, verbose=False, logits_all=True)
    with EdgeEagle(n_ctx=512) as ee:
        yield llama, ee
    llama.close()


CHAT = [{"role": "user", "content": "Name three colours."}]
CALLS = [
    ("create_completion", dict(prompt="The capital of France is", max_tokens=6, temperature=0)),
    ("create_completion", dict(prompt="The capital of France is", max_tokens=6, temperature=0, logprobs=2)),
    ("create_completion", dict(prompt="Once upon a time", max_tokens=6, seed=3)),  # llama's sampling defaults
    ("create_chat_completion", dict(messages=CHAT, max_tokens=6, temperature=0)),
    ("create_chat_completion", dict(messages=CHAT, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2)),
    ("create_chat_completion", dict(messages=CHAT, max_tokens=6, seed=5)),
]


@pytest.mark.parametrize("method,kwargs", CALLS)
def test_responses_have_llama_cpp_pythons_shape(pair, method, kwargs):
    llama, ee = pair
    theirs, ours = getattr(llama, method)(**kwargs), getattr(ee, method)(**kwargs)
    assert _shape_missing(theirs, ours) == []
    assert ours["edge_eagle"]["tau"] >= 1 and ours["usage"]["completion_tokens"] == 6
    assert ours["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"]  # the same prompt (template)


@pytest.mark.parametrize("method,kwargs", CALLS[:1] + CALLS[3:4])
def test_streams_have_llama_cpp_pythons_chunks(pair, method, kwargs):
    llama, ee = pair
    theirs = list(getattr(llama, method)(**kwargs, stream=True))
    ours = list(getattr(ee, method)(**kwargs, stream=True))
    for i, chunk in enumerate(theirs):  # first, middle and last chunks line up in shape
        j = 0 if i == 0 else (len(ours) - 1 if i == len(theirs) - 1 else min(i, len(ours) - 2))
        assert _shape_missing(chunk, ours[j]) == [], (i, chunk, ours[j])
    text = "".join(c["choices"][0].get("text") or c["choices"][0].get("delta", {}).get("content") or "" for c in ours)
    whole = getattr(ee, method)(**kwargs)["choices"][0]
    assert text == (whole.get("text") or whole.get("message", {}).get("content"))
    assert ours[-1]["choices"][0]["finish_reason"] == "length"


def test_a_seeded_call_gives_the_same_text_whatever_k(pair):
    _, ee = pair
    texts = {ee.create_chat_completion(CHAT, max_tokens=16, seed=9, temperature=0.8)["choices"][0]["message"]["content"]
             for _ in range(2)}
    assert len(texts) == 1


@pytest.mark.parametrize("kwargs,needle", [
    (dict(typical_p=0.5), "typical_p"),
    (dict(grammar=object()), "grammar"),
    (dict(tools=[{"type": "function"}]), "Each tool"),
    (dict(tools=[{"type": "function", "function": {"name": "f"}}]), "no tool support"),  # SmolLM2's template
    (dict(response_format={"type": "xml"}), "response_format"),
    (dict(mirostat_mode=2), "mirostat"),
    (dict(top_logprobs=2), "top_logprobs"),
])
def test_arguments_it_cannot_honour_raise_a_clear_error(pair, kwargs, needle):
    with pytest.raises(EdgeEagleError, match=needle):
        pair[1].create_chat_completion(CHAT, max_tokens=4, **kwargs)
