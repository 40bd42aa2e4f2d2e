"""One speculative cycle: draft (the plan's proposer), verify in one target batch, roll both
KV caches back to what was accepted, and hand the drafter the accepted rows' features.

Two strategies with one result type, chosen once per generation (choose()):
- StepCycle: the drafter, the target and verify.py called step by step; runs every plan;
- NativeCycle: greedy chains in one native call (the drafter's native_cycle()); every other
  plan (plain, trees, lookups, sampling) goes to its StepCycle.
Both leave the same tokens, counts and state behind (tests/test_fastpath.py).
"""

from __future__ import annotations

import functools
from time import perf_counter
from typing import Callable, NamedTuple, Sequence

import numpy as np

from .drafter import Drafter
from .policy import LOOKUP, PLAIN, TREE, Plan
from .proposal import EMPTY, Proposal
from .sampling import Sampler
from .target import Target
from .verify import verify, verify_tree


class CycleResult(NamedTuple):
    """What one cycle did. drafted: draft tokens verified (tree nodes for a tree); depth: the
    deepest draft position; ranks: each accepted tree node's rank among its siblings.

    A named tuple: the native cycle builds one without running Python code (new_result), which
    matters right after llama.cpp's kernels have evicted the host's caches."""

    kind: str
    drafted: int
    accepted: list[int]
    bonus: int
    depth: int
    ranks: list[int]
    propose_s: float  # drafting, up to the verify batch
    verify_s: float  # the target's verify batch and verification
    ingest_s: float  # handing the accepted rows to the drafter
    #: the part of verify_s spent choosing tokens from the batch's logits (sampling, a grammar's
    #: mask, penalties): per token read, which plain decoding pays alike, so the batch costs and
    #: the thread governor leave it out
    check_s: float = 0.0


#: new_result((kind, drafted, accepted, bonus, depth, ranks, propose_s, verify_s, ingest_s, check_s))
new_result = functools.partial(tuple.__new__, CycleResult)


class StepCycle:
    """A cycle as separate steps: the proposal, Target.decode / decode_tree, verify / verify_tree,
    the KV cut, Drafter.ingest."""

    def __init__(self, target: Target, drafter: Drafter, sampler: Sampler, p_min: float, tree_depth: int,
                 on_rows: Callable[[np.ndarray], None] | None = None):
        self.target, self.drafter, self.sampler = target, drafter, sampler
        self.p_min, self.tree_depth = p_min, tree_depth
        # on_rows(logits [emitted, V]): the target's logits for each token the cycle emits (logprobs)
        self.on_rows = on_rows
        # sampled drafts carry their q; greedy ones are the drafter's argmax
        self.choose = None if sampler.params.plain_greedy else sampler.draft

    def propose(self, plan: Plan, seq: Sequence[int], n_past: int, room: int) -> Proposal:
        target, drafter = self.target, self.drafter
        if room <= 0 or plan.n <= 0:
            return EMPTY
        if plan.kind == LOOKUP:
            return self.within_grammar((plan.proposal or EMPTY).truncated(room))
        if plan.kind == TREE and room > 1:  # depth within the tokens left, nodes within the window
            return drafter.propose_tree(seq, min(plan.n, target.tree_paths, target.n_ctx - n_past - 1),
                                        depth=min(self.tree_depth, room))
        choose = self.sampler.drafter_at(len(seq)) if self.sampler.seeded else self.choose
        return self.within_grammar(drafter.propose(seq, min(plan.n, room), self.p_min, choose).truncated(room))

    def within_grammar(self, proposal: Proposal) -> Proposal:
        """A deterministic chain (greedy or seeded) cut before its first draft the grammar forbids:
        verification would reject that draft and every one after it, and the row it would have
        been verified on is then the bonus row, so the cut changes nothing but the batch size.
        (A sampled draft's rejection draws from the residual, so sampled chains stay whole.)"""
        grammar = self.sampler.grammar
        if grammar is None or not proposal.is_chain or not (self.sampler.params.greedy or self.sampler.seeded):
            return proposal
        drafts = proposal.tokens
        for n, d in enumerate(drafts):
            if not grammar.allows(d, drafts[:n]):
                return proposal.truncated(n)
        return proposal

    def run(self, plan: Plan, seq: Sequence[int], n_past: int, room: int, capturing: bool,
            trim_to: int | None) -> CycleResult:
        """The cycle after the committed tokens `seq` (n_past of them before the last); room:
        the most drafts that fit; capturing: the target captures features for the drafter;
        trim_to: keep this many rows of drafter context on a cycle that does not draft."""
        t0 = perf_counter()
        proposal = self.propose(plan, seq, n_past, room)
        t_verify = perf_counter()
        target, last = self.target, seq[-1]
        if proposal.is_chain:
            res = target.decode([last, *proposal.tokens], n_past, "all" if proposal.tokens else "last")
            t_check = perf_counter()
            n_acc, bonus = verify(self.sampler, res.logits, proposal, n_past + 1, seq)
            check_s = perf_counter() - t_check
            if n_acc < len(proposal):
                target.memory.remove_from(n_past + n_acc + 1)
            accepted = list(proposal.tokens[:n_acc])
            rows: list[int] | slice = slice(0, n_acc + 1)
            ranks: list[int] = []  # a chain's accepted drafts have no siblings to rank
        else:
            res = target.decode_tree(last, proposal.tokens, proposal.parents, n_past)
            t_check = perf_counter()
            path, bonus, ranks = verify_tree(self.sampler, res.logits, proposal, n_past + 1, seq)
            check_s = perf_counter() - t_check
            target.keep_path(path, n_past, last, proposal.tokens)
            accepted = [proposal.tokens[i] for i in path]
            rows = [0, *(i + 1 for i in path)]
        t_ingest = perf_counter()
        if self.on_rows is not None:
            self.on_rows(np.array(res.logits[rows]))
        if capturing:
            self.drafter.ingest(res.feature_rows(rows), n_past, [last, *accepted])
            if not plan.drafts and trim_to:
                self.drafter.trim(trim_to)
        kind = plan.kind if len(proposal) else PLAIN
        return CycleResult(kind, len(proposal), accepted, bonus, max(proposal.depths, default=0), ranks,
                           t_verify - t0, t_ingest - t_verify, perf_counter() - t_ingest, check_s)


class NativeCycle:
    """The native strategy: greedy chain cycles in one native call, every other plan (and a chain
    the native cycle cannot run now) through `steps`. A drafter with a native cycle returns a
    subclass from Drafter.native_cycle() that implements run() (eagle/native.py's FusedCycle);
    its fast branch is one Python frame, since each call after llama.cpp's kernels have evicted
    the host's caches costs several microseconds."""

    def __init__(self, steps: StepCycle):
        self.steps, self.p_min = steps, steps.p_min

    def run(self, plan: Plan, seq: Sequence[int], n_past: int, room: int, capturing: bool,
            trim_to: int | None) -> CycleResult:
        raise NotImplementedError


def choose(target: Target, drafter: Drafter, sampler: Sampler, p_min: float, tree_depth: int,
           on_rows: Callable[[np.ndarray], None] | None = None) -> StepCycle | NativeCycle:
    """The cycle strategy for one generation: native greedy chains where the drafter has them
    (not when on_rows wants the target's logits, which the native cycle does not expose, nor with a
    logit_bias or penalties, which it does not apply)."""
    steps = StepCycle(target, drafter, sampler, p_min, tree_depth, on_rows)
    if drafter.needs_features and sampler.params.plain_greedy and on_rows is None:
        native = drafter.native_cycle(target, steps)
        if native is not None:
            return native
    return steps
