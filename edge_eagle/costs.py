"""The cost model, in one place: what a speculative cycle costs and what it is predicted to gain.

Units are one single-token target decode. c(n) is the target's cost of a batch of n tokens
relative to one token, d the drafter's cost per drafted token. A cycle drafting k tokens costs
c(k+1) + k d and yields E(k) tokens (the accepted drafts and the bonus), so

    speedup(k) = E(k) / (c(k+1) + k d)

Measured here: c(n) from timed target decodes (measure_context_costs); d from drafting time
per drafted token. A batch costs more after a longer context (its attention reads every cached
token): the calibration measures each batch size at two contexts, and c(n) is taken at the
cycle's context (seconds grow about linearly with it; on a 2-core EPYC with SmolLM2-135M a
batch of 4 tokens costs 2.5 single steps after 8 tokens, 3.0 after 2,048). On memory-bound
hardware (consumer GPUs, Apple Silicon) a batch of up to MEMORY_BOUND_MAX_N tokens costs
about one: c(n) = 1 there (and n / MEMORY_BOUND_MAX_N beyond). A tree of N nodes costs
c(N+1) plus one drafter batch per depth level. Plain numbers in, numbers out; the k
controller (controller.py) and `edge-eagle bench` both use these.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Callable, Mapping

MEMORY_BOUND_MAX_N = 8  # the projection: a batch of up to 8 tokens costs one step (the knee)
DEFAULT_D = 0.2  # drafter step cost assumed before any is measured
CONTEXT_SPAN = 1024  # the calibration's second context: this many tokens after the first
MIN_SPAN = 128  # a window with less room than this after the first context measures one context only
FRESH_CONTEXT = 8  # tokens of padding the costs are measured after when no prompt is cached


def context_room(target: Any, n_max: int, keep: int) -> int:
    """Tokens of the window left for the calibration's second context after `keep` tokens."""
    return target.n_ctx - n_max - 1 - keep


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


@dataclass(frozen=True)
class BatchCosts:
    """A calibration: seconds of one target decode of n tokens after `context` cached tokens, and
    the seconds each further context token adds to it (slope_s; empty: measured at one context)."""

    verify_s: dict[int, float]
    context: int = 0
    slope_s: dict[int, float] = field(default_factory=dict)


def seconds_at(verify_s: Mapping[int, float], slope_s: Mapping[int, float], ref: int, context: int) -> dict[int, float]:
    """Seconds per batch size after `context` tokens, from seconds measured after `ref` tokens and
    the per-token slopes (a size without a slope takes the largest smaller measured size's, in
    proportion to n). Never below a tenth of the reference: a slope is not trusted that far."""
    if not slope_s or context == ref:
        return dict(verify_s)
    out, known = {}, 0
    for n in sorted(verify_s):
        if n in slope_s:
            known = n
        slope = slope_s[n] if n in slope_s else (slope_s[known] * n / known if known else 0.0)
        out[n] = max(0.1 * verify_s[n], verify_s[n] + slope * (context - ref))
    return out


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
    c(n) is then re-measured (api.EdgeEagle does, between generations).

    Context: verify_s holds seconds after `ref_context` tokens; `context` is the context of the
    cycle being planned (the controller sets it), and c(n), d and the observations are taken
    there through the calibrated slopes (slope_s): an observation is moved back to the reference
    context before it joins its window, so a growing context is not mistaken for a shift."""

    alpha: float = 0.1  # the drafter step's EMA weight
    verify_s: dict[int, float] = field(default_factory=dict)
    draft_step_s: float | None = None
    window: int = 5
    shift: float = 1.35  # a single-token step this factor away from the calibration is a shift
    calibrated_one: float | None = None  # the calibration's single-token seconds
    ref_context: int = 0  # the context verify_s holds for
    slope_s: dict[int, float] = field(default_factory=dict)  # seconds per context token, per batch size
    context: int = 0  # tokens before the next batch (KController.plan sets it each cycle)
    _seen: dict[int, deque] = field(default_factory=dict)
    _at: tuple[int, dict[int, float], dict[int, float]] | None = None  # (context, its verify_s, seconds there)
    _table: list[float] | None = None  # relative_costs of _at's seconds (c_table)

    def __post_init__(self) -> None:
        if self.calibrated_one is None:
            self.calibrated_one = self.verify_s.get(1)

    @classmethod
    def from_measured(cls, costs: BatchCosts) -> "CostModel":
        return cls(verify_s=dict(costs.verify_s), ref_context=costs.context, slope_s=dict(costs.slope_s),
                   context=costs.context)

    def calibrate(self, costs: BatchCosts) -> None:
        """Replace the batch costs with a fresh measurement (the windows restart from it)."""
        self.verify_s, self.ref_context, self.slope_s = dict(costs.verify_s), costs.context, dict(costs.slope_s)
        self._seen.clear()
        self._at = None
        self.calibrated_one = self.verify_s.get(1)

    def seconds_at(self, context: int) -> dict[int, float]:
        """Seconds per batch size after `context` tokens."""
        return seconds_at(self.verify_s, self.slope_s, self.ref_context, context)

    def _here(self) -> dict[int, float]:
        """seconds_at(self.context), kept while neither the context nor the seconds change (a new
        verify_s dict, as tests assign, counts as a change too)."""
        at = self._at
        if at is None or at[0] != self.context or at[1] is not self.verify_s:
            at = self._at = (self.context, self.verify_s, self.seconds_at(self.context))
            self._table = None
        return at[2]

    def step_s(self) -> float | None:
        """Seconds of one single-token step at the current context (None before a calibration)."""
        return self._here().get(1)

    def observe_verify(self, n: int, seconds: float) -> None:
        ref = self.verify_s.get(n)
        if self.slope_s and self.context != self.ref_context:  # back to the reference context
            here = self._here().get(n)
            if here and ref:
                seconds *= ref / here
        seen = self._seen.get(n)
        if seen is None:
            seen = self._seen[n] = deque(maxlen=2 * self.window - 1 if n == 1 else self.window)
            if ref is not None:
                seen.append(ref)  # the calibration counts as one observation
        seen.append(seconds)
        median = statistics.median(seen)
        if median != ref:
            self.verify_s[n] = median
            self._at = None  # the seconds at the context moved

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

    def _relative(self, n_max: int) -> list[float]:
        """relative_costs at the current context, up to n_max at least; kept while the seconds
        there do not change (the controller asks on most cycles)."""
        here = self._here()
        table = self._table
        if table is None or len(table) <= n_max:
            table = self._table = relative_costs(here, max(n_max, 16))
        return table

    def c(self, n: int) -> float:
        """c(n) at the current context."""
        return self._relative(n)[n]

    def c_table(self, n_max: int) -> list[float]:
        """[c(0), c(1), ..., c(n_max)] at the current context (c(0) is unused)."""
        return self._relative(n_max)[: n_max + 1]

    def d(self) -> float:
        one = self.step_s()
        if not one or self.draft_step_s is None:
            return DEFAULT_D
        return self.draft_step_s / one

    def cost(self, k: int) -> float:
        return cycle_cost(self.c(k + 1), k, self.d())


def _pad(target: Any) -> int:
    """The token the cost measurements decode (the content does not change the cost)."""
    return target.eos if target.eos >= 0 else 0


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
    pad = _pad(target)
    fresh = keep is None
    if keep is None:
        target.memory.clear()
        target.decode([pad] * FRESH_CONTEXT, 0, "last")  # some context
        keep = FRESH_CONTEXT
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


def measure_context_costs(target: Any, n_max: int, reps: int = 3, *, keep: int | None = None,
                          span: int = CONTEXT_SPAN, should_stop: Callable[[], bool] | None = None,
                          progress: Callable[[int, int], None] | None = None) -> BatchCosts | None:
    """measure_batch_costs() after `keep` cached tokens (None: a cleared cache and 8 tokens of
    context), then again `span` tokens later (filled with padding and removed again), for each
    size's seconds per context token. With less room than MIN_SPAN in the window: one context,
    no slopes. None when should_stop() ended it; the first `keep` cached tokens stay."""
    target.set_capture(())
    fresh = keep is None
    if keep is None:
        target.memory.clear()
        target.decode([_pad(target)] * FRESH_CONTEXT, 0, "last")
        keep = FRESH_CONTEXT
    room = min(span, context_room(target, n_max, keep))
    phases = 2 if room >= MIN_SPAN else 1
    total = phases * reps * n_max

    def report(offset: int) -> Callable[[int, int], None] | None:
        return None if progress is None else (lambda done, _: progress(offset + done, total))

    try:
        near = measure_batch_costs(target, n_max, reps, keep=keep, should_stop=should_stop, progress=report(0))
        if near is None or phases == 1:
            return None if near is None else BatchCosts(near, keep)
        target.prefill([_pad(target)] * room, keep)
        far = measure_batch_costs(target, n_max, reps, keep=keep + room, should_stop=should_stop,
                                  progress=report(reps * n_max))
        if far is None:
            return None
        return BatchCosts(near, keep, {n: max(0.0, (far[n] - near[n]) / room) for n in near})
    finally:
        if fresh:
            target.memory.clear()
        else:
            target.memory.remove_from(keep)
