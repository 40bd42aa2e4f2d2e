"""The drafter interface the speculative loop depends on, and two simple drafters.

A drafter sees the committed token sequence (and, if it wants them, the target's captured
features) and proposes up to k next tokens. The EAGLE drafter lives in eagle.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

import numpy as np


class Drafter(ABC):
    """Proposes draft tokens; the loop verifies them."""

    #: the loop captures target features and calls ingest() only for drafters that want them
    needs_features: bool = False
    #: the target layers whose inputs this drafter consumes
    target_layers: tuple[int, ...] = ()
    name: str = "drafter"
    #: drafters that can sample their drafts take a `choose` callable in propose() and leave
    #: the proposal distributions q of the last proposal here (None: deterministic drafts)
    samples: bool = False
    last_q: list[np.ndarray] | None = None

    def reset(self) -> None:
        """Forget all state: a new request starts."""

    def ingest(self, features: np.ndarray, pos0: int, tokens: Sequence[int]) -> None:
        """Take the target's features of positions pos0.. and the tokens at those positions
        (exactly what the target decoded and kept). EAGLE pairs the features at P with the
        token at P+1, so the last row waits for the next ingest() or propose()."""

    def trim(self, keep: int) -> None:
        """Keep at most `keep` not-yet-processed rows: the loop calls this while it decodes
        plainly, so an idle drafter costs nothing per token (its next proposal then sees
        only that window of context)."""

    @abstractmethod
    def propose(self, tokens: Sequence[int], k: int, p_min: float = 0.0, choose=None) -> list[int]:
        """Up to k draft tokens that follow `tokens` (the whole committed sequence); a drafter
        with confidences stops early once its top probability falls below p_min. A drafter
        that `samples` picks each draft with choose(logits) -> (token, q) when given one."""

    def close(self) -> None:
        """Release native resources."""


class NgramDrafter(Drafter):
    """Prompt lookup: find the latest earlier occurrence of the last n tokens and copy
    what followed it. Tries n = max_ngram down to min_ngram."""

    name = "prompt-lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, tokens: Sequence[int], k: int, p_min: float = 0.0, choose=None) -> list[int]:
        seq = np.asarray(tokens, dtype=np.int64)
        n_seq = len(seq)
        for n in range(min(self.max_ngram, n_seq - 1), self.min_ngram - 1, -1):
            tail = seq[n_seq - n:]
            windows = np.lib.stride_tricks.sliding_window_view(seq[:n_seq - 1], n)
            hits = np.flatnonzero((windows == tail).all(axis=1))
            if len(hits):
                start = int(hits[-1]) + n
                return [int(t) for t in seq[start:start + k]]
        return []


class OracleDrafter(Drafter):
    """Knows the continuation in advance (for tests): proposes the reference tokens that
    follow the committed sequence, optionally corrupting every `corrupt_every`-th draft."""

    name = "oracle"

    def __init__(self, reference: Sequence[int], corrupt_every: int = 0, vocab_size: int = 2):
        self.reference = list(reference)
        self.corrupt_every = corrupt_every
        self.vocab_size = vocab_size
        self._count = 0

    def reset(self) -> None:
        self._count = 0

    def propose(self, tokens: Sequence[int], k: int, p_min: float = 0.0, choose=None) -> list[int]:
        n = len(tokens)
        if list(tokens) != self.reference[:n]:
            return []
        out = self.reference[n:n + k]
        if self.corrupt_every:
            for i in range(len(out)):
                self._count += 1
                if self._count % self.corrupt_every == 0:
                    out[i] = (out[i] + 1) % self.vocab_size
        return out
