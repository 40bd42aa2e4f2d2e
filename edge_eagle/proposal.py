"""What a drafter proposes: draft tokens, their tree shape, and (for sampled drafts) the
distributions they were drawn from. One value, so the loop never asks the drafter afterwards.

A chain of k drafts is the tree whose node i has parent i - 1 (node 0's parent is the last
committed token, -1). Trees (several children per node) use the same fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Proposal:
    tokens: tuple[int, ...] = ()
    #: parent node of each draft (-1: the last committed token); a chain is (-1, 0, 1, ...)
    parents: tuple[int, ...] = ()
    #: for drafts sampled from the drafter's distribution: q of each node (None: deterministic)
    q: tuple[np.ndarray, ...] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if len(self.parents) != len(self.tokens):
            raise ValueError("a proposal needs one parent per token")
        if any(not -1 <= p < i for i, p in enumerate(self.parents)):
            raise ValueError("each parent must come before its child (or be -1)")
        if self.q is not None and len(self.q) != len(self.tokens):
            raise ValueError("a sampled proposal needs one q per token")

    @classmethod
    def chain(cls, tokens: Sequence[int], q: Sequence[np.ndarray] | None = None) -> "Proposal":
        tokens = tuple(int(t) for t in tokens)
        return cls(tokens, tuple(range(-1, len(tokens) - 1)), None if q is None else tuple(q))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return self.parents == tuple(range(-1, len(self.tokens) - 1))

    @property
    def depths(self) -> tuple[int, ...]:
        """Depth of each node: 1 for a child of the committed sequence."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return tuple(out)

    def truncated(self, n: int) -> "Proposal":
        """The first n nodes (a prefix of a chain, or of a tree in node order)."""
        if n >= len(self):
            return self
        return Proposal(self.tokens[:n], self.parents[:n], None if self.q is None else self.q[:n])


EMPTY = Proposal()
