"""Verification: the target's logits for a Proposal -> how many drafts it keeps, and the next token.

Greedy: accept drafts while they equal the target's argmax; the first mismatch (or the row
after the last draft) gives the bonus token.

Sampling (temperature > 0) is speculative sampling: a draft d proposed with probability q(d)
is accepted with probability min(1, p(d)/q(d)); on rejection the token is drawn from the
residual max(p - q, 0), renormalised. The emitted tokens follow the target distribution p
exactly. For a deterministic draft (proposal.q is None) q is a point mass on d, so d is
accepted with probability p(d) and the residual is p without d: the same as drawing the token
from p and keeping d when they are equal, which is how it runs (a draw under a grammar then
masks the vocabulary only when the unconstrained draw is forbidden; sampling.py).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .proposal import Proposal
from .sampling import Sampler


def _history(sampler: Sampler, history: Sequence[int] | None) -> list[int] | None:
    """The last tokens the penalties look at (None when the request has none)."""
    if history is None or not sampler.params.penalized:
        return None
    return list(history[-sampler.params.penalty_last_n:])


def verify(sampler: Sampler, logits: np.ndarray, proposal: Proposal, pos: int | None = None,
           history: Sequence[int] | None = None) -> tuple[int, int]:
    """logits [len(proposal)+1, V] of the verify batch (the last committed token, then each
    draft) -> (drafts accepted, next token). pos: the sequence position of the first draft
    (a seeded request's samples depend on it; sampling.py); history: the committed tokens
    (penalties at row n count them and drafts[:n], so each row is judged as plain decoding
    would judge that position)."""
    if not proposal.is_chain:
        raise ValueError("verify() takes a chain of drafts; tree proposals need tree verification")
    drafts = proposal.tokens
    tail = _history(sampler, history)

    def before(n: int) -> list[int] | None:
        return None if tail is None else tail + list(drafts[:n])

    n_d = len(drafts)
    q = proposal.q
    if sampler.params.greedy or (sampler.seeded and pos is not None) or q is None:
        # the row's own token (greedy: the argmax; seeded: the sample at its position; otherwise
        # a draw, which for a point mass d is accepting d with p(d), else drawing from p without
        # d); a draft must equal it. Row by row: the rows after the first mismatch are never read.
        for n, d in enumerate(drafts):
            token = sampler.sample(logits[n], None if pos is None else pos + n, before(n), drafts[:n])
            if token != d:
                return n, token
        return n_d, sampler.sample(logits[n_d], None if pos is None else pos + n_d, before(n_d), drafts)
    for i, d in enumerate(drafts):
        p = sampler.probs(logits[i], before(i), drafts[:i])  # p(d) is 0 where the grammar forbids d
        if sampler.rng.random() * float(q[i][d]) < p[d]:  # accept with min(1, p(d) / q(d))
            continue
        residual = np.maximum(p - q[i], 0.0)
        total = residual.sum()
        if total <= 0.0:  # p == q: a rejection cannot happen; guard against rounding
            return i, int(d)
        return i, int(sampler.rng.choice(len(residual), p=residual / total))
    return n_d, sampler.sample(logits[n_d], history=before(n_d), path=drafts)


def verify_tree(sampler: Sampler, logits: np.ndarray, proposal: Proposal, pos: int | None = None,
                history: Sequence[int] | None = None) -> tuple[list[int], int, list[int]]:
    """logits [len(proposal)+1, V] of a tree verify batch (row 0 the last committed token,
    row i+1 node i) -> (accepted nodes from the root down, next token, each accepted node's
    rank among its siblings).

    Greedy: follow the child that equals the target's argmax; seeded (pos given): the child that
    equals the seeded sample at its position. Otherwise sampling: the child that equals a draw
    from p. That is recursive rejection over the siblings (a child x accepted with probability
    p(x) under the current residual, which on rejection loses x and is renormalised; when every
    child is rejected, a draw from what is left) in one draw: each child is taken with
    probability p(child), and otherwise the token follows p without the children. Tree drafts are
    deterministic (point masses), so each step draws exactly from p, whichever children were
    proposed: lossless. (Sampler.sample masks a grammar's vocabulary only when it must.)"""
    children: list[list[int]] = [[] for _ in range(len(proposal) + 1)]
    for i, parent in enumerate(proposal.parents):
        children[parent + 1].append(i)
    tokens = proposal.tokens
    path: list[int] = []
    ranks: list[int] = []
    row = 0
    tail = _history(sampler, history)
    while True:
        kids = children[row]
        drafted = [tokens[i] for i in path]  # the path so far, for penalties and a grammar
        before = None if tail is None else tail + drafted
        # greedy: the argmax; seeded: the sample at this depth's position; otherwise a draw from p
        # (recursive rejection's law: each child with p(child))
        best = sampler.sample(logits[row], None if pos is None else pos + len(path), before, drafted)
        hit = next((r for r, i in enumerate(kids) if tokens[i] == best), None)
        if hit is None:
            return path, best, ranks
        node = kids[hit]
        path.append(node)
        ranks.append(hit)
        row = node + 1
