"""Drafters for tests only."""

from __future__ import annotations

from typing import Sequence

from edge_eagle.drafter import Drafter
from edge_eagle.proposal import EMPTY, Proposal


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

    def propose(self, tokens: Sequence[int], k: int, p_min: float = 0.0, choose=None) -> Proposal:
        n = len(tokens)
        if list(tokens) != self.reference[:n]:
            return EMPTY
        out = self.reference[n:n + k]
        if self.corrupt_every:
            for i in range(len(out)):
                self._count += 1
                if self._count % self.corrupt_every == 0:
                    out[i] = (out[i] + 1) % self.vocab_size
        return Proposal.chain(out)
