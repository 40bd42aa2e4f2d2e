"""Turning target logits into tokens, and verifying drafts against them.

Greedy: accept drafts while they equal the target's argmax; the first mismatch (or the
row after the last draft) gives the bonus token.

Sampling (temperature > 0): the drafts are the drafter's greedy picks, so the proposal q
is a point mass on each draft d. Speculative sampling then accepts d with probability
min(1, p(d)/q(d)) = p(d) and, on rejection, samples the residual max(p - q, 0), which is p
with d removed, renormalised. The emitted tokens follow the target distribution exactly.
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

    def verify(self, logits: np.ndarray, drafts: Sequence[int]) -> tuple[int, int]:
        """logits [len(drafts)+1, V] of the verify batch -> (drafts accepted, next token)."""
        if self.params.greedy:
            best = np.argmax(logits[: len(drafts) + 1], axis=1)
            n = 0
            while n < len(drafts) and best[n] == drafts[n]:
                n += 1
            return n, int(best[n])
        for i, d in enumerate(drafts):
            probs = self.probs(logits[i])
            if self.rng.random() < probs[d]:
                continue
            probs[d] = 0.0
            total = probs.sum()
            if total <= 0.0:  # p was a point mass on d: cannot happen after the check above
                return i, int(d)
            return i, int(self.rng.choice(len(probs), p=probs / total))
        return len(drafts), self.sample(logits[len(drafts)])
