"""Draft-length policies: how many tokens to draft this cycle.

The loop calls every policy the same way, so it needs no per-policy guard:
choose() before a cycle, update() after it, features_needed_soon() to decide whether the
target's features (a few % per token to capture) must be captured now. `Fixed(k)` always
drafts k (k = 0: plain decoding); the adaptive controller (controller.KController) picks k
per cycle from measured costs and acceptance.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class DraftPolicy(Protocol):
    #: rows of context the drafter keeps while the policy decodes plainly (None: keep all)
    idle_window: int | None

    def choose(self) -> int:
        """The draft length of the next cycle (0: decode one token plainly)."""

    def update(self, drafted: int, accepted: int, verify_tokens: int, verify_s: float, draft_s: float) -> None:
        """What the cycle did: drafts made and accepted, the verify batch's size and seconds,
        and the seconds spent drafting."""

    def features_needed_soon(self) -> bool:
        """Whether a draft may come soon enough that the target's features must be captured now."""


class Fixed:
    """Always the same draft length."""

    idle_window = None

    def __init__(self, k: int):
        if k < 0:
            raise ValueError("a draft length is 0 or more")
        self.k = k

    def choose(self) -> int:
        return self.k

    def update(self, drafted: int, accepted: int, verify_tokens: int, verify_s: float, draft_s: float) -> None:
        pass

    def features_needed_soon(self) -> bool:
        return self.k > 0

    def __repr__(self) -> str:
        return f"Fixed({self.k})"
