"""The speculative loop: prefill, then each cycle the policy picks a proposer (plain decoding,
a drafter chain of k, a drafter tree of N nodes, or a prompt-lookup draft), one cycle strategy
(cycle.py) drafts, verifies and rolls both KV caches back to what was accepted, and the
accepted drafts plus the bonus token are emitted.

Every piece is an interface: a drafter.Drafter (NO_DRAFTER for plain decoding), a
policy.DraftPolicy, a cycle strategy returning one CycleResult, and stats.SpecStats that counts.
Each yield happens with both caches consistent, so a consumer may stop at any yield (EOS,
stop string, cancel) and leave a usable state behind.
"""

from __future__ import annotations

from time import perf_counter
from typing import Callable, Iterator, Sequence

import numpy as np

from . import cycle as cycles
from .drafter import Drafter
from .policy import CHAIN, TREE, TREE_DEPTH, DraftPolicy, Plan
from .sampling import Sampler
from .stats import SpecStats
from .target import Target
from .threads import ThreadGovernor

DRAFT, TARGET = "draft", "target"


def reuse_prefix(target: Target, drafter: Drafter, prompt: Sequence[int]) -> int:
    """The prompt cache: the target's KV keeps the longest common prefix with what it held, and
    only the rest is prefilled (at least the last prompt token, for its logits; with a feature
    drafter one more, whose features the drafter's next row needs). The drafter keeps its rows
    for that prefix when they were computed for the same tokens (drafter.keep). Returns the
    first position to prefill."""
    start = min(target.memory.common_prefix(prompt), len(prompt) - 1)
    if drafter.needs_features:
        start = max(0, start - 1)
    if start > 0:
        target.memory.remove_from(start)
        drafter.keep(prompt, start)
    else:
        target.memory.clear()
        drafter.reset()
    return start


class FeatureSwitch:
    """Captures the target's features only when a draft may come soon; after a pause the drafter
    restarts from the rows captured since. Each switch makes llama.cpp build the target's graph
    again on the next decode (about 3 ms there on a 2-core EPYC with SmolLM2-135M, while capturing
    itself costs little), so a request starts in the state its first cycles need (soon: the policy
    may draft soon), and the prompt's prefill captures only then."""

    def __init__(self, target: Target, drafter: Drafter, soon: bool = True):
        self.target, self.drafter = target, drafter
        self.wanted = drafter.needs_features
        self.on = self.wanted and soon
        target.set_capture(drafter.target_layers if self.on else ())
        if self.wanted and not self.on:
            drafter.reset()  # no rows for this prompt: a later switch starts the drafter afresh

    def switch(self, plan: Plan) -> Plan:
        """Switch capture on or off, as this cycle's plan needs (the loop asks only when it must
        change: a call costs more than its check); a draft right after switching it on waits a
        cycle (there are no context rows yet), so the plan becomes plain decoding."""
        self.on = not self.on
        self.target.set_capture(self.drafter.target_layers if self.on else ())
        if self.on:
            self.drafter.reset()
            if plan.drafts:
                return Plan()
        return plan


def speculate(target: Target, drafter: Drafter, prompt: Sequence[int], *, max_tokens: int,
              policy: DraftPolicy, sampler: Sampler, stats: SpecStats,
              p_min: float = 0.0, tree_depth: int = TREE_DEPTH,
              governor: ThreadGovernor | None = None,
              on_rows: Callable[[np.ndarray], None] | None = None) -> Iterator[tuple[list[int], list[str]]]:
    """Yield (new tokens, their origins) per step until max_tokens tokens were produced. A
    governor (threads.py) sees each cycle's target time; on_rows(logits) receives, before each
    yield, the target's logits for the tokens it yields (one row each)."""
    start = reuse_prefix(target, drafter, prompt)
    policy.begin()
    capture = FeatureSwitch(target, drafter, policy.features_needed_soon())
    strategy = cycles.choose(target, drafter, sampler, p_min, tree_depth, on_rows)
    trees = drafter.supports_trees and target.tree_paths > 0
    if governor is not None:
        governor.begin()

    t0 = perf_counter()
    res = target.prefill(prompt[start:], start)
    first = sampler.sample(res.logits[-1], len(prompt), prompt, path=())
    if on_rows is not None:
        on_rows(np.array(res.logits[-1:]))
    stats.t_prefill = perf_counter() - t0
    stats.prompt_tokens = len(prompt)
    stats.prompt_cached = start
    t_start = perf_counter()
    if capture.on:
        drafter.ingest(res.require_features(), start, prompt[start:])
    stats.t_draft += perf_counter() - t_start
    stats.t_total = perf_counter() - t_start
    seq, n_past, produced = list(prompt) + [first], len(prompt), 1
    stats.generated = 1
    sampler.commit([first])
    yield [first], [TARGET]

    while produced < max_tokens:
        if n_past >= target.n_ctx:  # the window is full: stop cleanly, both caches consistent
            stats.context_full = True
            return
        t_step = perf_counter()
        plan = policy.plan(seq)
        if plan.kind == TREE and not trees:
            plan = Plan(CHAIN, plan.n)  # a drafter or target without trees drafts the chain instead
        if capture.wanted and (plan.drafts or policy.features_needed_soon()) != capture.on:
            plan = capture.switch(plan)
        room = min(max_tokens - produced - 1, target.n_ctx - n_past - 1)
        r = strategy.run(plan, seq, n_past, room, capture.on, policy.idle_window)
        t_end = perf_counter()
        plan_s = t_end - t_step - r.propose_s - r.verify_s - r.ingest_s  # planning and the loop's own steps
        n_acc = len(r.accepted)
        stats.t_verify += r.verify_s
        stats.t_draft += plan_s + r.propose_s + r.ingest_s
        stats.record_step(r.drafted, n_acc, r.kind, r.depth, r.ranks)
        batch_s = r.verify_s - r.check_s  # the target's batch alone: what c(n) and the governor model
        policy.update(r.drafted, n_acc, r.drafted + 1, batch_s, plan_s + r.propose_s)
        if governor is not None:
            governor.observe(r.drafted + 1, batch_s)
        new = [*r.accepted, r.bonus]
        seq += new
        n_past += n_acc + 1
        produced += len(new)
        stats.generated = produced
        sampler.commit(new)
        stats.t_total += perf_counter() - t_step  # time inside the loop only, not the consumer's
        yield new, [DRAFT] * n_acc + [TARGET]
