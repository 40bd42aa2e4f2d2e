"""Structured output: a llama.cpp grammar (GBNF) that constrains the target's choice at every
position, through llama.cpp's own grammar sampler.

A Grammar holds the grammar's state after the committed tokens, and for speculation the states
along drafted paths: allowed(path) is the set of tokens the grammar allows after the committed
tokens plus `path` (drafts not yet verified). Verification constrains each row by the state of
its own path, so the target's choice at a row is exactly what constrained plain decoding would
choose there; a draft the grammar does not allow is never accepted (its constrained probability
is 0), so drafts that leave the grammar are rejected, never emitted. commit() moves the state
on by the tokens a cycle emitted and forgets the drafted paths.

JSON schemas become grammars with llama-cpp-python's port of llama.cpp's
json-schema-to-grammar (json_schema_grammar()); `response_format` {"type": "json_object"}
is llama-cpp-python's JSON grammar for any object."""

from __future__ import annotations

import ctypes
import json
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from .errors import EdgeEagleError

if TYPE_CHECKING:
    from .target import Target

_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])  # llama_token_data


def json_schema_grammar(schema: Mapping[str, Any] | bool) -> str:
    """The GBNF grammar of a JSON schema (llama.cpp's json-schema-to-grammar, as llama-cpp-python
    ports it); EdgeEagleError for a schema it cannot convert."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception as exc:  # the converter raises ValueError, KeyError, ... on schemas it lacks
        raise EdgeEagleError(f"The JSON schema cannot be turned into a grammar ({exc}); simplify the schema.") from None


def json_object_grammar() -> str:
    """Any JSON object (response_format {"type": "json_object"})."""
    return json_schema_grammar({"type": "object"})


class Grammar:
    """A GBNF grammar's state over one generation on `target` (module doc). Not thread-safe;
    close() frees llama.cpp's samplers."""

    def __init__(self, target: "Target", gbnf: str, root: str = "root"):
        from llama_cpp import llama_cpp as C

        self._C = C
        self.text = gbnf
        base = C.llama_sampler_init_grammar(target.vocab, gbnf.encode("utf-8"), root.encode("utf-8"))
        if not base:
            raise EdgeEagleError("The grammar does not parse (llama.cpp's GBNF); check its rules and its root rule.")
        self._states: dict[tuple[int, ...], Any] = {(): base}
        self._masks: dict[tuple[int, ...], np.ndarray] = {}
        self._is_eog = target.is_eog
        n = target.n_vocab
        self._cells = np.zeros(n, dtype=_TOKEN_DATA)
        self._ids = np.arange(n, dtype=np.int32)
        self._array = C.llama_token_data_array(
            data=self._cells.ctypes.data_as(ctypes.POINTER(C.llama_token_data)), size=n, selected=-1, sorted=False)
        self._one = np.zeros(1, dtype=_TOKEN_DATA)
        self._one_array = C.llama_token_data_array(
            data=self._one.ctypes.data_as(ctypes.POINTER(C.llama_token_data)), size=1, selected=-1, sorted=False)
        self.committed = 0  # tokens committed so far

    def _state(self, path: tuple[int, ...]) -> Any:
        state = self._states.get(path)
        if state is None:
            parent = self._state(path[:-1])
            if not self.allows(path[-1], path[:-1]):
                raise EdgeEagleError(f"Token {path[-1]} is not allowed by the grammar here.")
            state = self._C.llama_sampler_clone(parent)
            self._C.llama_sampler_accept(state, path[-1])
            self._states[path] = state
        return state

    def allows(self, token: int, path: Sequence[int] = ()) -> bool:
        """Whether the grammar allows `token` after the committed tokens and `path`: one token
        through the grammar, far cheaper than allowed() over the whole vocabulary."""
        key = tuple(path)
        mask = self._masks.get(key)
        if mask is not None:
            return bool(mask[token])
        state = self._state(key)  # first: building it checks the path with the same cell
        one = self._one
        one["id"] = token
        one["logit"] = 0.0
        self._one_array.size = 1
        self._one_array.selected = -1
        self._C.llama_sampler_apply(state, ctypes.byref(self._one_array))
        return bool(self._one_array.size == 1 and np.isfinite(one["logit"][0]))

    def allowed(self, path: Sequence[int] = ()) -> np.ndarray:
        """bool [n_vocab]: the tokens the grammar allows after the committed tokens and `path`."""
        key = tuple(path)
        mask = self._masks.get(key)
        if mask is None:
            state = self._state(key)
            cells = self._cells
            cells["id"] = self._ids
            cells["logit"] = 0.0
            self._array.size = len(cells)
            self._array.selected = -1
            self._array.sorted = False
            self._C.llama_sampler_apply(state, ctypes.byref(self._array))
            mask = np.zeros(len(cells), dtype=bool)
            live = cells[: self._array.size]
            mask[live["id"][np.isfinite(live["logit"])]] = True
            if not mask.any():
                raise EdgeEagleError("The grammar allows no token here; check that it can always end.")
            self._masks[key] = mask
        return mask

    def constrain(self, logits: np.ndarray, path: Sequence[int] = ()) -> np.ndarray:
        """A copy of `logits` with -inf where the grammar forbids the token."""
        out = np.array(logits, dtype=np.float32)
        out[~self.allowed(path)] = -np.inf
        return out

    def commit(self, tokens: Sequence[int]) -> None:
        """The tokens a cycle emitted: the grammar's state moves past them (an end-of-generation
        token, which ends the output, moves nothing) and the drafted paths are forgotten."""
        keep = tuple(t for t in tokens if not self._is_eog(t))
        new = self._state(keep)
        for state in self._states.values():
            if state is not new:
                self._C.llama_sampler_free(state)
        self._states = {(): new}
        self._masks = {(): self._masks[keep]} if keep in self._masks else {}
        self.committed += len(tokens)

    def close(self) -> None:
        for state in self._states.values():
            self._C.llama_sampler_free(state)
        self._states = {}
        self._masks = {}

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
