"""Draft policies: what to propose this cycle.

The loop calls every policy the same way (DraftPolicy): begin() when a request starts, plan()
before each cycle with the committed tokens, update() after it with what the cycle did, and
features_needed_soon() to decide whether the target's features must be captured now (feeding
the drafter their rows costs per token, and each switch of the capture makes llama.cpp build
the target's graph again). A Plan is plain decoding, a chain of k drafts from the drafter, a tree of
N nodes, or a ready prompt-lookup draft. `Fixed(k)` always drafts a chain of k, `FixedTree(n)` a
tree of n nodes; controller.KController picks per cycle from measured costs and acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .proposal import Proposal

PLAIN, CHAIN, TREE, LOOKUP = "plain", "chain", "tree", "lookup"
TREE_DEPTH = 6  # default depth limit of a draft tree


_CHAINS: dict = {}  # draft length -> its Plan (Plan.of); 0 -> PLAIN_PLAN


@dataclass(frozen=True)
class Plan:
    """One cycle's proposer: kind (plain, chain, tree or lookup) and size (drafts, or tree
    nodes); a lookup plan carries its ready draft."""

    kind: str = PLAIN
    n: int = 0
    proposal: Proposal | None = None

    @classmethod
    def of(cls, choice: "int | Plan") -> "Plan":
        if isinstance(choice, Plan):
            return choice
        plan = _CHAINS.get(choice)  # plans are immutable: one per draft length serves every cycle
        if plan is None:
            plan = cls(CHAIN, int(choice)) if choice > 0 else cls()
            if len(_CHAINS) < 256:
                _CHAINS[choice] = plan
        return plan

    @property
    def drafts(self) -> bool:
        """Whether this cycle asks the drafter (not plain decoding or a lookup)."""
        return self.kind in (CHAIN, TREE) and self.n > 0


PLAIN_PLAN = Plan.of(0)  # plain decoding's plan: one immutable value for every cycle


class DraftPolicy:
    """The interface the loop drives. A policy implements choose() (a draft length, or a Plan)
    or, when it needs to see the committed tokens, plan()."""

    #: rows of context the drafter keeps while the policy decodes plainly (None: keep all)
    idle_window: int | None = None

    def begin(self) -> None:
        """A request starts: forget what belonged to the last one's token sequence."""

    def choose(self) -> "int | Plan":
        """The draft length of the next cycle (0: decode one token plainly), or a Plan."""
        raise NotImplementedError

    def plan(self, tokens: Sequence[int]) -> Plan:
        """The next cycle's proposer, given the committed tokens (the whole sequence so far)."""
        return Plan.of(self.choose())

    def update(self, drafted: int, accepted: int, verify_tokens: int, verify_s: float, draft_s: float) -> None:
        """What the cycle did: drafts made and accepted, the verify batch's size and seconds,
        and the seconds spent drafting."""

    def features_needed_soon(self) -> bool:
        """Whether a draft may come soon enough that the target's features must be captured now."""
        return True


class Fixed(DraftPolicy):
    """Always the same draft length."""

    idle_window = None

    def __init__(self, k: int):
        if k < 0:
            raise ValueError("a draft length is 0 or more")
        self.k = k

    def choose(self) -> int | Plan:
        return self.k

    def plan(self, tokens: Sequence[int]) -> Plan:
        return Plan.of(self.k)  # without choose(): one call less per cycle

    def features_needed_soon(self) -> bool:
        return self.k > 0

    def __repr__(self) -> str:
        return f"Fixed({self.k})"


class FixedTree(Fixed):
    """Always a draft tree of n nodes (n = 1 is a chain of one)."""

    def __init__(self, n: int):
        if n < 1:
            raise ValueError("a draft tree has 1 node or more")
        super().__init__(n)

    def choose(self) -> Plan:
        return Plan(TREE, self.k)

    def plan(self, tokens: Sequence[int]) -> Plan:
        return self.choose()

    def __repr__(self) -> str:
        return f"FixedTree({self.k})"
