"""The speculative loop: prefill, then each cycle the policy picks a proposer (plain
decoding, a drafter chain of k, a drafter tree of N nodes, or a prompt-lookup draft), the
target verifies the whole proposal in one batch (a tree through llama.cpp sequence sets),
both KV caches roll back to what was accepted, and the accepted drafts plus the bonus token
are emitted.

Every piece is an interface: a drafter.Drafter (NO_DRAFTER for plain decoding), a
policy.DraftPolicy, verify.verify / verify_tree on a proposal.Proposal, and stats.SpecStats
that counts.
Each yield happens with both caches consistent, so a consumer may stop at any yield (EOS,
stop string, cancel) and leave a usable state behind.
"""

from __future__ import annotations

from time import perf_counter
from typing import Iterator, Sequence

from .drafter import Drafter
from .eagle import TREE_DEPTH
from .policy import CHAIN, LOOKUP, PLAIN, TREE, DraftPolicy, Plan
from .proposal import EMPTY
from .sampling import Sampler
from .stats import SpecStats
from .target import Target
from .verify import verify, verify_tree

DRAFT, TARGET = "draft", "target"


def speculate(target: Target, drafter: Drafter, prompt: Sequence[int], *, max_tokens: int,
              policy: DraftPolicy, sampler: Sampler, stats: SpecStats,
              p_min: float = 0.0, tree_depth: int = TREE_DEPTH) -> Iterator[tuple[list[int], list[str]]]:
    """Yield (new tokens, their origins) per step until max_tokens tokens were produced.

    Prompt cache: the target's KV keeps the longest common prefix with what it held, and only
    the rest is prefilled (at least the last prompt token, for its logits; with a feature
    drafter one more, whose features the drafter's next row needs). The drafter keeps its rows
    for that prefix when they were computed for the same tokens (drafter.keep)."""
    wants_features = drafter.needs_features
    target.set_capture(drafter.target_layers if wants_features else ())
    start = min(target.memory.common_prefix(prompt), len(prompt) - 1)
    if wants_features:
        start = max(0, start - 1)
    if start > 0:
        target.memory.remove_from(start)
        drafter.keep(prompt, start)
    else:
        target.memory.clear()
        drafter.reset()
    choose = None if sampler.params.greedy else sampler.draft  # sampled drafts carry their q
    # greedy chains with the native fast path: draft, verify and ingest in one call per cycle
    fused = drafter.fused_cycle(target) if wants_features and choose is None else None
    planner = getattr(policy, "plan", None)

    t0 = perf_counter()
    res = target.prefill(prompt[start:], start)
    first = sampler.sample(res.logits[-1])
    stats.t_prefill = perf_counter() - t0
    stats.prompt_tokens = len(prompt)
    stats.prompt_cached = start
    t_start = perf_counter()
    if wants_features:
        drafter.ingest(res.features, start, prompt[start:])
    stats.t_draft += perf_counter() - t_start
    stats.t_total = perf_counter() - t_start
    seq, n_past, produced = list(prompt) + [first], len(prompt), 1
    stats.generated = 1
    yield [first], [TARGET]
    capturing = wants_features

    while produced < max_tokens:
        if n_past >= target.n_ctx:  # the window is full: stop cleanly, both caches consistent
            stats.context_full = True
            return
        t_step = perf_counter()
        plan = planner(seq) if planner is not None else Plan.of(policy.choose())
        if plan.kind == TREE and not (getattr(drafter, "supports_trees", False) and target.tree_paths):
            plan = Plan(CHAIN, plan.n)  # a drafter or target without trees drafts the chain instead
        if wants_features:
            # capture features (a few % per token) only when a draft may come soon; after a
            # pause the drafter restarts from the rows captured since
            need = plan.drafts or policy.features_needed_soon()
            if need != capturing:
                target.set_capture(drafter.target_layers if need else ())
                capturing = need
                if need:
                    drafter.reset()
                    if plan.drafts:
                        plan = Plan()  # no context rows yet: this cycle decodes plainly
        room = min(max_tokens - produced - 1, target.n_ctx - n_past - 1)
        cycle = None
        if fused is not None and capturing and plan.kind == CHAIN and plan.n > 0 and room > 0:
            t_call = perf_counter()
            cycle = fused(seq, min(plan.n, room), p_min)
        if cycle is not None:
            n_drafted, accepted, bonus, draft_s, verify_s, _ = cycle
            n_acc, depth, ranks = len(accepted), n_drafted, []
            t_verify = t_call + draft_s
            t_ingest = t_verify + verify_s
            t_end = perf_counter()
        else:
            if room <= 0 or plan.n <= 0:
                proposal = EMPTY
            elif plan.kind == LOOKUP:
                proposal = (plan.proposal or EMPTY).truncated(room)
            elif plan.kind == TREE and room > 1:  # depth within the tokens left, nodes within the window
                proposal = drafter.propose_tree(seq, min(plan.n, target.tree_paths, target.n_ctx - n_past - 1),
                                                depth=min(tree_depth, room))
            else:
                proposal = drafter.propose(seq, min(plan.n, room), p_min, choose).truncated(room)
            t_verify = perf_counter()
            if proposal.is_chain:
                batch = [seq[-1], *proposal.tokens]
                res = target.decode(batch, n_past, "all" if proposal.tokens else "last")
                n_acc, bonus = verify(sampler, res.logits, proposal)
                if n_acc < len(proposal):
                    target.memory.remove_from(n_past + n_acc + 1)
                accepted = list(proposal.tokens[:n_acc])
                rows: list[int] | slice = slice(0, n_acc + 1)
                ranks = []  # a chain's accepted drafts have no siblings to rank
            else:
                res = target.decode_tree(seq[-1], proposal.tokens, proposal.parents, n_past)
                path, bonus, ranks = verify_tree(sampler, res.logits, proposal)
                target.keep_path(path, n_past, seq[-1], proposal.tokens)
                n_acc = len(path)
                accepted = [proposal.tokens[i] for i in path]
                rows = [0, *(i + 1 for i in path)]
            t_ingest = perf_counter()
            if capturing:
                drafter.ingest(res.feature_rows(rows), n_past, [seq[-1], *accepted])
                if not plan.drafts and policy.idle_window:
                    drafter.trim(policy.idle_window)
            t_end = perf_counter()
            n_drafted, depth = len(proposal), max(proposal.depths, default=0)

        stats.t_verify += t_ingest - t_verify
        stats.t_draft += (t_verify - t_step) + (t_end - t_ingest)
        stats.record_step(n_drafted, n_acc, plan.kind if n_drafted else PLAIN, depth, ranks)
        policy.update(n_drafted, n_acc, n_drafted + 1, t_ingest - t_verify, t_verify - t_step)
        new = [*accepted, bonus]
        seq += new
        n_past += n_acc + 1
        produced += len(new)
        stats.generated = produced
        stats.t_total += perf_counter() - t_step  # time inside the loop only, not the consumer's
        yield new, [DRAFT] * n_acc + [TARGET]
