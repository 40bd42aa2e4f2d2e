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


MAX_DIGITS = 16  # the longest integer the grammar writes, as the port's unbounded integers


def _same_length(a: str, b: str) -> list[str]:
    """GBNF sequences for the decimal numbers from a to b, both of one length (a <= b)."""
    if a == b:
        return [" ".join(f'"{c}"' for c in a)]
    if len(a) == 1:
        return [f"[{a}-{b}]"]
    if a[0] == b[0]:
        return [f'"{a[0]}" {rest}' for rest in _same_length(a[1:], b[1:])]
    n = len(a) - 1
    out: list[str] = []
    lo, hi = int(a[0]), int(b[0])
    if a[1:] != "0" * n:
        out += [f'"{a[0]}" {rest}' for rest in _same_length(a[1:], "9" * n)]
        lo += 1
    tail: list[str] = []
    if b[1:] != "9" * n:
        tail = [f'"{b[0]}" {rest}' for rest in _same_length("0" * n, b[1:])]
        hi -= 1
    if lo <= hi:
        out.append(f"[{lo}-{hi}]" + " [0-9]" * n)
    return out + tail


def _naturals(lo: int, hi: int) -> list[str]:
    """GBNF sequences for the integers lo..hi, 0 <= lo <= hi, without leading zeros."""
    out = []
    for length in range(len(str(lo)), len(str(hi)) + 1):
        first = 0 if length == 1 else 10 ** (length - 1)
        a, b = max(lo, first), min(hi, 10 ** length - 1)
        if a <= b:
            out += _same_length(str(a), str(b))
    return out


def int_range_rule(lo: int | None, hi: int | None) -> str:
    """A GBNF alternative for the integers from lo to hi (None: unbounded, up to MAX_DIGITS digits)."""
    top = 10 ** MAX_DIGITS - 1
    lo = -top if lo is None else max(lo, -top)
    hi = top if hi is None else min(hi, top)
    if lo > hi:
        raise EdgeEagleError(f"The schema's integer range is empty (from {lo} to {hi}); fix minimum or maximum.")
    parts = []
    if lo < 0:
        parts += [f'"-" {p}' for p in _naturals(max(1, -hi), -lo)]
    if hi >= 0:
        parts += _naturals(max(0, lo), hi)
    return " | ".join(f"({p})" for p in parts)


# A character inside a JSON string, as llama.cpp's json-schema-to-grammar writes it: no raw
# control character (U+0000-U+001F) and no DEL, which JSON forbids unescaped. llama-cpp-python's
# port allows them ([^"\\]), so a sampled string could hold a raw newline or tab that strict
# JSON parsers (Python's json, JavaScript's JSON.parse) reject.
JSON_CHAR = r'[^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'


def _converter():
    """llama-cpp-python's SchemaConverter, with integer bounds (minimum, maximum and the
    exclusive ones), which its port of llama.cpp's converter leaves out, and llama.cpp's
    string characters (JSON_CHAR)."""
    import math

    from llama_cpp.llama_grammar import BuiltinRule, SchemaConverter

    class Converter(SchemaConverter):
        def _add_primitive(self, name, rule):
            if name == "char":
                rule = BuiltinRule(JSON_CHAR, [])
            return super()._add_primitive(name, rule)

        def visit(self, schema, name):
            bounds = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
            if isinstance(schema, dict) and schema.get("type") == "integer" and any(b in schema for b in bounds):
                lo = hi = None
                if "minimum" in schema:
                    lo = math.ceil(schema["minimum"])
                if "exclusiveMinimum" in schema:
                    lo = max(lo if lo is not None else -(10 ** MAX_DIGITS), math.floor(schema["exclusiveMinimum"]) + 1)
                if "maximum" in schema:
                    hi = math.floor(schema["maximum"])
                if "exclusiveMaximum" in schema:
                    hi = min(hi if hi is not None else 10 ** MAX_DIGITS, math.ceil(schema["exclusiveMaximum"]) - 1)
                rule_name = name + "-" if name in ("root", "space") else name or "root"
                return self._add_rule(rule_name, f"({int_range_rule(lo, hi)}) space")
            return super().visit(schema, name)

    return Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)


def json_schema_grammar(schema: Mapping[str, Any] | bool) -> str:
    """The GBNF grammar of a JSON schema (llama.cpp's json-schema-to-grammar, as llama-cpp-python
    ports it, plus integer bounds); EdgeEagleError for a schema it cannot convert."""
    try:
        converter = _converter()
        resolved = converter.resolve_refs(json.loads(json.dumps(schema)), "input")
        converter.visit(resolved, "")
        return converter.format_grammar()
    except EdgeEagleError:
        raise
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
