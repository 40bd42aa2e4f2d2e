"""Acceptance and timing statistics: the one counting type that the loop, the API, `bench`,
the TUI, the server and the scripts all read. SpecStats holds counters; derived figures are
properties, and to_dict() is the one serialisation that every report starts from (the CLI's
--json, the server's `edge_eagle` and `timings` objects, the TUI panel; Prometheus counts the
same counters).

- tau (mean acceptance length) = 1 + accepted / verify_steps (the bonus token counts)
- per-position acceptance rate i = (#steps whose draft i was accepted) / (#steps that drafted i)
- draft acceptance rate = accepted / drafted
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from operator import add
from typing import Any, Iterable

_ONES = (1,) * 64
K_HISTORY_KEEP = 1024  # k_history keeps at least the last this many steps, at most twice as many


@dataclass
class SpecStats:
    verify_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_at: list[int] = field(default_factory=list)  # per draft position
    accepted_at: list[int] = field(default_factory=list)
    #: draft length of each recent step (the last 1,024 to 2,048 steps; k_sum and draft_steps count all)
    k_history: list[int] = field(default_factory=list)
    k_sum: int = 0  # draft lengths, summed over every step
    draft_steps: int = 0  # verify steps that checked at least one draft
    generated: int = 0  # tokens emitted
    prompt_tokens: int = 0
    prompt_cached: int = 0  # prompt tokens whose KV was reused from the previous request (not prefilled)
    t_prefill: float = 0.0
    t_verify: float = 0.0  # target decodes after prefill
    t_draft: float = 0.0  # drafter work (ingest, encode, chain)
    t_total: float = 0.0  # generation wall time after prefill
    context_full: bool = False  # the generation stopped because the context window filled
    proposers: dict[str, int] = field(default_factory=dict)  # verify steps per proposer (plain, chain, tree, lookup)
    tree_nodes: int = 0  # nodes verified by tree steps
    tree_depths: int = 0  # the trees' depths, summed (drafter batches per tree cycle, on average)
    #: per accepted depth, how often the accepted node was its parent's 1st, 2nd, ... candidate
    accepted_rank_at: list[list[int]] = field(default_factory=list)

    def record_step(self, n_drafted: int, n_accepted: int, kind: str | None = None, depth: int | None = None,
                    ranks: list[int] | None = None) -> None:
        """One verify step: tokens drafted (chain drafts or tree nodes) and accepted. For a
        tree, `depth` is its depth, and positions count depths: position i was drafted when
        the tree reached depth i + 1. ranks: the accepted nodes' ranks among their siblings."""
        self.verify_steps += 1
        self.drafted += n_drafted
        self.accepted += n_accepted
        history = self.k_history
        history.append(n_drafted)
        if len(history) > 2 * K_HISTORY_KEEP:  # trimmed in blocks: amortised O(1) a step
            del history[: len(history) - K_HISTORY_KEEP]
        self.k_sum += n_drafted
        kind = kind or ("chain" if n_drafted else "plain")
        self.proposers[kind] = self.proposers.get(kind, 0) + 1
        if not n_drafted:
            return
        self.draft_steps += 1
        reach = n_drafted if depth is None else depth
        if kind == "tree":
            self.tree_nodes += n_drafted
            self.tree_depths += reach
        drafted_at, accepted_at = self.drafted_at, self.accepted_at
        if len(drafted_at) < reach:
            drafted_at.extend([0] * (reach - len(drafted_at)))
            accepted_at.extend([0] * (reach - len(accepted_at)))
        # the per-position counts in C loops (map over slices), not bytecode: this runs every cycle
        ones = _ONES if reach <= len(_ONES) else (1,) * reach
        drafted_at[:reach] = map(add, drafted_at[:reach], ones)
        n_acc = n_accepted if n_accepted < reach else reach
        if n_acc > 0:
            accepted_at[:n_acc] = map(add, accepted_at[:n_acc], ones)
        if not ranks:
            return
        for d, r in enumerate(ranks):
            while len(self.accepted_rank_at) <= d:
                self.accepted_rank_at.append([])
            row = self.accepted_rank_at[d]
            row.extend([0] * (r + 1 - len(row)))
            row[r] += 1

    @property
    def tree_nodes_mean(self) -> float:
        """Mean nodes per tree verify step (0 without trees)."""
        n = self.proposers.get("tree", 0)
        return self.tree_nodes / n if n else 0.0

    @property
    def tree_depth_mean(self) -> float:
        """Mean depth of the verified trees (0 without trees)."""
        n = self.proposers.get("tree", 0)
        return self.tree_depths / n if n else 0.0

    @property
    def accepted_depth_mean(self) -> float:
        """Mean drafts accepted per drafting step (the accepted path's depth for trees)."""
        n = self.verify_steps - self.proposers.get("plain", 0)
        return self.accepted / n if n else 0.0

    @property
    def tau(self) -> float:
        return 1.0 + self.accepted / self.verify_steps if self.verify_steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    @property
    def draft_s_per_token(self) -> float:
        """Drafter work (encode, chain steps, ingest) per drafted token, in seconds."""
        return self.t_draft / self.drafted if self.drafted else 0.0

    @property
    def draft_cost_per_verify(self) -> float:
        """draft_s_per_token relative to the mean verify step of the same run."""
        return self.draft_s_per_token / (self.t_verify / self.verify_steps) if self.t_verify else 0.0

    @property
    def k_mean(self) -> float:
        return self.k_sum / self.verify_steps if self.verify_steps else 0.0

    @property
    def k_last(self) -> int:
        return self.k_history[-1] if self.k_history else 0

    @property
    def t_overhead(self) -> float:
        return max(0.0, self.t_total - self.t_verify - self.t_draft)

    @property
    def tokens_per_second(self) -> float:
        return self.generated / self.t_total if self.t_total > 0 else 0.0

    def merge(self, other: "SpecStats") -> None:
        """Add another request's figures into these running totals."""
        self.verify_steps += other.verify_steps
        self.drafted += other.drafted
        self.accepted += other.accepted
        for i in range(len(other.drafted_at)):
            if i >= len(self.drafted_at):
                self.drafted_at.append(0)
                self.accepted_at.append(0)
            self.drafted_at[i] += other.drafted_at[i]
            self.accepted_at[i] += other.accepted_at[i]
        self.k_history.extend(other.k_history)
        if len(self.k_history) > 2 * K_HISTORY_KEEP:
            del self.k_history[: len(self.k_history) - K_HISTORY_KEEP]
        self.k_sum += other.k_sum
        self.draft_steps += other.draft_steps
        for kind, n in other.proposers.items():
            self.proposers[kind] = self.proposers.get(kind, 0) + n
        self.tree_nodes += other.tree_nodes
        self.tree_depths += other.tree_depths
        for d, row in enumerate(other.accepted_rank_at):
            while len(self.accepted_rank_at) <= d:
                self.accepted_rank_at.append([])
            mine = self.accepted_rank_at[d]
            mine.extend([0] * (len(row) - len(mine)))
            for r, n in enumerate(row):
                mine[r] += n
        self.generated += other.generated
        self.prompt_tokens += other.prompt_tokens
        self.prompt_cached += other.prompt_cached
        for name in ("t_prefill", "t_verify", "t_draft", "t_total"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @classmethod
    def total(cls, parts: Iterable["SpecStats"]) -> "SpecStats":
        """The sum of several requests' figures."""
        out = cls()
        for part in parts:
            out.merge(part)
        return out

    def snapshot(self) -> "SpecStats":
        """An independent copy (for a message to another thread)."""
        return copy.deepcopy(self)

    def to_dict(self) -> dict[str, Any]:
        total = self.t_total or 1.0
        return {
            "tau": round(self.tau, 4),
            "verify_steps": self.verify_steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "per_position_acceptance": [round(x, 4) for x in self.per_position_acceptance],
            "k_mean": round(self.k_mean, 3),
            "draft_steps": self.draft_steps,
            "k_last": self.k_last,
            "proposers": dict(self.proposers),
            "tree_nodes_mean": round(self.tree_nodes_mean, 3),
            "tree_depth_mean": round(self.tree_depth_mean, 3),
            "accepted_depth_mean": round(self.accepted_depth_mean, 3),
            "accepted_rank_at": [list(r) for r in self.accepted_rank_at],
            "generated_tokens": self.generated,
            "prompt_tokens": self.prompt_tokens,
            "prompt_cached_tokens": self.prompt_cached,
            "prompt_prefilled_tokens": self.prompt_tokens - self.prompt_cached,
            "tokens_per_second": round(self.tokens_per_second, 3),
            "time_s": {
                "prefill": round(self.t_prefill, 5),
                "verify": round(self.t_verify, 5),
                "draft": round(self.t_draft, 5),
                "overhead": round(self.t_overhead, 5),
                "total": round(self.t_total, 5),
            },
            # to the microsecond, as llama-server's timings report them (time_s is coarser)
            "time_ms": {
                "prefill": round(1000 * self.t_prefill, 3),
                "verify": round(1000 * self.t_verify, 3),
                "draft": round(1000 * self.t_draft, 3),
                "overhead": round(1000 * self.t_overhead, 3),
                "total": round(1000 * self.t_total, 3),
            },
            "time_share": {
                "verify": round(self.t_verify / total, 4),
                "draft": round(self.t_draft / total, 4),
                "overhead": round(self.t_overhead / total, 4),
            },
        }


def spread(values: Iterable[float], digits: int | None = 3) -> dict[str, float]:
    """Median, min and max of measured values (ratios measured interleaved), rounded to
    `digits` (None: as they are)."""
    import statistics

    vals = list(values)
    out = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    return out if digits is None else {k: round(v, digits) for k, v in out.items()}
