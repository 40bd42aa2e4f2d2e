"""The cost model, in one place: what a speculative cycle costs and what it is predicted to gain.

Units are one single-token target decode. c(n) is the target's cost of a batch of n tokens
relative to one token, d the drafter's cost per drafted token. A cycle drafting k tokens costs
c(k+1) + k d and yields E(k) tokens (the accepted drafts and the bonus), so

    speedup(k) = E(k) / (c(k+1) + k d)

Measured here: c(n) from timed target decodes (measure_batch_costs); d from drafting time per
drafted token. On memory-bound hardware (consumer GPUs, Apple Silicon) a batch of up to
MEMORY_BOUND_MAX_N tokens costs about one: c(n) = 1 there (and n / MEMORY_BOUND_MAX_N
beyond). A tree of N nodes costs c(N+1) plus one drafter batch per depth level. Plain numbers in, numbers out; the
k controller (controller.py) and `edge-eagle bench` both use these.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Callable, Mapping

MEMORY_BOUND_MAX_N = 8  # the projection: a batch of up to 8 tokens costs one step (the knee)
DEFAULT_D = 0.2  # drafter step cost assumed before any is measured


def relative_cost(verify_s: Mapping[int, float], n: int) -> float:
    """c(n) from seconds per batch size: measured sizes as they are, others extrapolated
    linearly from the largest smaller measured size; never below a smaller batch's cost,
    so timing noise cannot make a longer draft look free. Without a 1-token time: n
    (the pessimistic, compute-bound assumption)."""
    return relative_costs(verify_s, n)[n]


def relative_costs(verify_s: Mapping[int, float], n_max: int) -> list[float]:
    """[relative_cost(0), ..., relative_cost(n_max)] in one pass."""
    one = verify_s.get(1)
    if not one:
        return [float(n) for n in range(n_max + 1)]
    out, best, known = [1.0, 1.0], 1.0, 1
    for m in range(2, n_max + 1):
        if m in verify_s:
            best, known = max(best, verify_s[m] / one), m
        else:
            best = max(best, verify_s[known] / one * m / known)
        out.append(best)
    return out[: n_max + 1]


def memory_bound_cost(n: int) -> float:
    """c(n) on memory-bound hardware: one step up to MEMORY_BOUND_MAX_N tokens (the knee), then
    growing in proportion (a batch of 2 x MEMORY_BOUND_MAX_N costs two steps): a pessimistic
    line past the knee, where a GPU has not been measured yet."""
    return max(1.0, n / MEMORY_BOUND_MAX_N)


def tree_cycle_cost(c_n1: float, depth_levels: float, d: float) -> float:
    """A tree cycle of N nodes: c(N+1) for the verify batch plus one drafter batch per depth
    level (a batch of a few rows costs about one row where batches are cheap)."""
    return c_n1 + depth_levels * d


def cycle_cost(c_k1: float, k: int, d: float) -> float:
    """C(k) = c(k+1) + k d."""
    return c_k1 + k * d


def predicted_speedup(expected_tokens: float, k: int, c_k1: float, d: float) -> float:
    """E(k) / (c(k+1) + k d); k = 0 is plain decoding (1.0)."""
    return expected_tokens / cycle_cost(c_k1, k, d) if k else 1.0


@dataclass
class CostModel:
    """Seconds per target decode of n tokens and per drafter step.

    Robust to a noisy desktop: each estimate is the median of the last few observations
    (`window`; 9 for single-token steps, which are many), so one cycle stalled by another
    program does not move it, while a real change wins within a few cycles. The calibration
    (measured batch costs) seeds the windows. `shifted` says when the single-token step has moved
    away from the calibrated one (another program came or went, the thread count changed):
    c(n) is then re-measured (api.EdgeEagle does, between generations)."""

    alpha: float = 0.1  # the drafter step's EMA weight
    verify_s: dict[int, float] = field(default_factory=dict)
    draft_step_s: float | None = None
    window: int = 5
    shift: float = 1.35  # a single-token step this factor away from the calibration is a shift
    calibrated_one: float | None = None  # the calibration's single-token seconds
    _seen: dict[int, deque] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.calibrated_one is None:
            self.calibrated_one = self.verify_s.get(1)

    def calibrate(self, verify_s: Mapping[int, float]) -> None:
        """Replace the batch costs with a fresh measurement (the windows restart from it)."""
        self.verify_s = dict(verify_s)
        self._seen.clear()
        self.calibrated_one = self.verify_s.get(1)

    def observe_verify(self, n: int, seconds: float) -> None:
        seen = self._seen.get(n)
        if seen is None:
            seen = self._seen[n] = deque(maxlen=2 * self.window - 1 if n == 1 else self.window)
            if n in self.verify_s:
                seen.append(self.verify_s[n])  # the calibration counts as one observation
        seen.append(seconds)
        self.verify_s[n] = statistics.median(seen)

    def observe_draft(self, steps: int, seconds: float) -> None:
        if steps <= 0:
            return
        per = seconds / steps
        old = self.draft_step_s
        self.draft_step_s = per if old is None else old + self.alpha * (per - old)

    @property
    def shifted(self) -> bool:
        """The single-token step moved beyond `shift` of its calibrated time (a full window seen)."""
        seen, base = self._seen.get(1), self.calibrated_one
        if not seen or base is None or len(seen) < (seen.maxlen or 0):
            return False
        ratio = self.verify_s[1] / base
        return ratio > self.shift or ratio < 1 / self.shift

    def c(self, n: int) -> float:
        return relative_cost(self.verify_s, n)

    def c_table(self, n_max: int) -> list[float]:
        """[c(0), c(1), ..., c(n_max)] (c(0) is unused)."""
        return relative_costs(self.verify_s, n_max)

    def d(self) -> float:
        one = self.verify_s.get(1)
        if not one or self.draft_step_s is None:
            return DEFAULT_D
        return self.draft_step_s / one

    def cost(self, k: int) -> float:
        return cycle_cost(self.c(k + 1), k, self.d())


def measure_batch_costs(target: Any, n_max: int, reps: int = 3, *, keep: int | None = None,
                        should_stop: Callable[[], bool] | None = None,
                        progress: Callable[[int, int], None] | None = None) -> dict[int, float] | None:
    """Median seconds of one target decode of n tokens, n = 1..n_max.

    Sizes are interleaved within each round, so a burst of other work lands on all of them
    rather than on one, and the median over `reps` rounds drops it. keep: the target's first
    `keep` cached tokens stay (the batches run after them and are removed again: the prompt
    cache survives); None clears the cache and measures after an 8-token context.
    should_stop: asked between decodes; when it says so, the measurement is abandoned (None).
    progress(done, total) after each decode."""
    target.set_capture(())
    pad = target.eos if target.eos >= 0 else 0
    fresh = keep is None
    if keep is None:
        target.memory.clear()
        target.decode([pad] * 8, 0, "last")  # some context
        keep = 8
    keep = min(keep, target.n_ctx - n_max - 1)
    if keep < 0:
        return None
    target.memory.remove_from(keep)
    target.decode([pad] * n_max, keep, "all")  # warm-up: first calls allocate
    target.memory.remove_from(keep)
    times: dict[int, list[float]] = {n: [] for n in range(1, n_max + 1)}
    total, done = reps * n_max, 0
    try:
        for _ in range(reps):
            for n in range(1, n_max + 1):
                if should_stop is not None and should_stop():
                    return None
                t0 = perf_counter()
                target.decode([pad] * n, keep, "all")
                times[n].append(perf_counter() - t0)
                target.memory.remove_from(keep)
                done += 1
                if progress is not None:
                    progress(done, total)
    finally:
        if fresh:
            target.memory.clear()
        else:
            target.memory.remove_from(keep)
    return {n: statistics.median(t) for n, t in times.items()}
