"""Turning target logits into tokens, and verifying drafts against them.

Greedy: accept drafts while they equal the target's argmax; the first mismatch (or the
row after the last draft) gives the bonus token.

Sampling (temperature > 0) is speculative sampling: a draft d proposed with probability
q(d) is accepted with probability min(1, p(d)/q(d)); on rejection the token is drawn from
the residual max(p - q, 0), renormalised. The emitted tokens follow the target distribution
p exactly. Drafters that sample their drafts from q (the EAGLE drafter) pass q along;
for a deterministic draft q is a point mass on d, so d is accepted with probability p(d)
and the residual is p without d.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def probs(self, logits: np.ndarray) -> np.ndarray:
        """The target distribution after temperature, top-k and top-p, as float64."""
        p = self.params
        z = logits.astype(np.float64) / p.temperature
        if 0 < p.top_k < z.shape[-1]:
            kth = np.partition(z, -p.top_k)[-p.top_k]
            z = np.where(z >= kth, z, -np.inf)
        z -= z.max()
        probs = np.exp(z)
        probs /= probs.sum()
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cum = np.cumsum(probs[order])
            keep = order[: int(np.searchsorted(cum, p.top_p) + 1)]
            mask = np.zeros_like(probs)
            mask[keep] = probs[keep]
            probs = mask / mask.sum()
        return probs

    def sample(self, logits: np.ndarray) -> int:
        if self.params.greedy:
            return int(np.argmax(logits))
        probs = self.probs(logits)
        return int(self.rng.choice(len(probs), p=probs))

    def draft(self, logits: np.ndarray) -> tuple[int, np.ndarray | None]:
        """How a drafter picks a draft from its logits: greedy (no q), or sampled from q."""
        if self.params.greedy:
            return int(np.argmax(logits)), None
        q = self.probs(logits)
        return int(self.rng.choice(len(q), p=q)), q

    def verify(self, logits: np.ndarray, drafts: Sequence[int],
               draft_probs: Sequence[np.ndarray] | None = None) -> tuple[int, int]:
        """logits [len(drafts)+1, V] of the verify batch -> (drafts accepted, next token).
        draft_probs: the q each draft was sampled from (None: deterministic drafts)."""
        if self.params.greedy:
            best = np.argmax(logits[: len(drafts) + 1], axis=1)
            n = 0
            while n < len(drafts) and best[n] == drafts[n]:
                n += 1
            return n, int(best[n])
        for i, d in enumerate(drafts):
            p = self.probs(logits[i])
            q_d = 1.0 if draft_probs is None else float(draft_probs[i][d])
            if self.rng.random() * q_d < p[d]:  # accept with min(1, p(d) / q(d))
                continue
            if draft_probs is None:
                residual = p.copy()
                residual[d] = 0.0
            else:
                residual = np.maximum(p - draft_probs[i], 0.0)
            total = residual.sum()
            if total <= 0.0:  # p == q: a rejection cannot happen; guard against rounding
                return i, int(d)
            return i, int(self.rng.choice(len(residual), p=residual / total))
        return len(drafts), self.sample(logits[len(drafts)])
