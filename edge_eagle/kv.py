"""KV bookkeeping: one llama.cpp context's memory, and which tokens sequence 0 holds.

Knowing sequence 0's tokens lets a new request reuse the longest common prefix with the last
one (the prompt cache); every operation that changes the cache keeps that list true.
"""

from __future__ import annotations

from typing import Any, Sequence

from llama_cpp import llama_cpp as C


class Memory:
    """The KV memory of one context (sequence 0 unless told otherwise). `tokens` are the tokens
    whose KV sequence 0 holds at positions 0.. (kept up to date by Target.decode), so a new
    request can reuse the longest common prefix."""

    def __init__(self, ctx: Any):
        self._mem = C.llama_get_memory(ctx)
        self.tokens: list[int] = []

    @property
    def handle(self) -> Any:
        """llama.cpp's llama_memory_t, for native code that edits the cache itself (it then tells
        this object what it did, through extend_at or remove_from)."""
        return self._mem

    def remove_from(self, pos: int, seq: int = 0) -> None:
        C.llama_memory_seq_rm(self._mem, seq, pos, -1)
        if seq == 0:
            del self.tokens[pos:]

    def remove_seq(self, seq: int) -> None:
        C.llama_memory_seq_rm(self._mem, seq, -1, -1)
        if seq == 0:
            self.tokens.clear()

    def clear(self) -> None:
        C.llama_memory_clear(self._mem, True)
        self.tokens.clear()

    def extend_at(self, pos: int, tokens: Sequence[int]) -> None:
        """Sequence 0 now also holds `tokens` at positions pos..: they join `tokens` when they
        continue it; otherwise what it holds is no longer known token by token."""
        if len(self.tokens) == pos:
            self.tokens.extend(tokens)
        else:
            self.tokens.clear()

    def copy_seq(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Add sequence dst to the cells of src at positions [p0, p1) (-1: open end); in a
        unified KV cache the cells are shared, nothing is copied."""
        C.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def common_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of `tokens` sequence 0 already holds."""
        return common_prefix(self.tokens, tokens)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
