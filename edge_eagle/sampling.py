"""Turning logits into tokens: the target distribution after temperature, top-k and top-p,
and how the target and a drafter pick from it. Verifying drafts is verify.py."""

from __future__ import annotations

from dataclasses import dataclass

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
        z = logits.astype(np.float64)
        with np.errstate(over="ignore"):  # the max first: a tiny temperature gives -inf, never inf - inf
            z = (z - z.max()) / p.temperature
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
