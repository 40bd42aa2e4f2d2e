"""The drafter's pending rows, and which of its rows its KV cache holds.

Pairing (NOTES §1): at position P the decoder consumes (token[P+1], g[P]). The target's
features for P arrive when the target decodes P, but token P+1 is known only a cycle later,
so rows wait here until propose() supplies it; only rows the target accepted ever arrive.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..kv import common_prefix


class PendingRows:
    """Target feature rows not yet run through the drafter (their features in buf[:rows], the
    tokens that follow each in `tokens`, the first at position pos0), and the rows the drafter's
    KV holds: true rows 0..kv_rows-1, computed from kv_tokens[:kv_rows + 1], or nothing
    reusable (kv_rows -1)."""

    def __init__(self, width: int):
        self.buf = np.empty((64, width), np.float32)  # grown as needed, reused
        self.clear()
        self.kv_rows = 0
        self.kv_tokens: list[int] = []

    def clear(self) -> None:
        """Drop the pending rows (not the KV bookkeeping)."""
        self.tokens: list[int] = []
        self.pos0 = 0
        self.rows = 0
        self.stale = False  # rows were dropped: the KV no longer continues into the pending rows

    def reset(self) -> None:
        self.clear()
        self.kv_rows = 0
        self.kv_tokens = []

    @property
    def end(self) -> int:
        """The position after the last pending row."""
        return self.pos0 + self.rows

    def keep(self, tokens: Sequence[int], n_rows: int) -> bool:
        """Whether the KV's first n_rows rows were computed for these tokens; if so only they stay
        counted (the caller cuts the cache back to n_rows), else the caller resets."""
        if not (0 < n_rows <= self.kv_rows and common_prefix(self.kv_tokens, tokens) > n_rows):
            return False
        self.clear()
        self.kv_rows = n_rows
        del self.kv_tokens[n_rows + 1:]
        return True

    def trim(self, keep: int) -> None:
        """Keep at most `keep` (at least 1) pending rows, the newest."""
        drop = self.rows - max(1, keep)
        if drop <= 0:
            return
        self.buf[: self.rows - drop] = self.buf[drop:self.rows].copy()
        self.tokens = self.tokens[drop:]
        self.pos0 += drop
        self.rows -= drop
        self.stale = True

    def ingest(self, features: np.ndarray, pos0: int, tokens: Sequence[int]) -> None:
        """The target's features of positions pos0.. and the tokens at those positions."""
        if len(features) == 0:
            return
        if self.rows and pos0 != self.end:
            raise RuntimeError(f"drafter rows must be contiguous: expected pos {self.end}, got {pos0}")
        if not self.rows:
            self.pos0 = pos0
        # the token at pos0 completes the previous pending row, if one waits for it
        self.tokens.extend(int(t) for t in (tokens if self.rows else tokens[1:]))
        end = self.rows + len(features)
        self.room(end)
        self.buf[self.rows:end] = features
        self.rows = end

    def room(self, rows: int) -> None:
        """Grow the buffer to hold at least `rows` rows, keeping the pending ones."""
        if rows > len(self.buf):
            grown = np.empty((max(rows, 2 * len(self.buf)), self.buf.shape[1]), np.float32)
            grown[: self.rows] = self.buf[: self.rows]
            self.buf = grown

    def claim(self, tokens: Sequence[int]) -> tuple[list[int], int, bool]:
        """Take the pending rows, now that their tokens are all known (`tokens` is the committed
        sequence, the last of it the token after the last row): (their tokens but the last row's,
        which is tokens[-1]; their first position; whether the drafter's KV must be cleared
        rather than cut back to that position)."""
        if not self.rows:
            raise RuntimeError("propose() needs ingested target features first")
        n_past = len(tokens) - 1
        if self.pos0 + self.rows != n_past:  # (not self.end: one call less on the hot path)
            raise RuntimeError(f"drafter holds rows up to {self.end}, sequence is at {n_past}")
        pending, pos0, clear = self.tokens, self.pos0, self.stale
        if clear:  # llama.cpp accepts any start position on an empty KV, not a gap
            self.stale = False
            self.kv_rows = -1  # rows no longer start at position 0: nothing to reuse
        elif self.kv_rows != pos0:
            self.kv_rows = -1
        if self.kv_rows >= 0:  # the KV now holds rows 0..n_past-1, computed from tokens[:n_past + 1]
            self.kv_tokens += tokens[len(self.kv_tokens):n_past + 1]
            self.kv_rows = n_past
        self.tokens, self.rows = [], 0
        return pending, pos0, clear
