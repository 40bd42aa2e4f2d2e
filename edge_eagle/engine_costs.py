"""The engine's batch costs (mixed into api.EdgeEagle): c(n) measured at two contexts or taken
from the calibration cache, re-checked in the background, and measured again when the thread
count, the machine's speed or the controller's trust says they are stale; and flash attention
routed by the prompt's length, with the costs of each setting kept."""

from __future__ import annotations

from typing import Any

from . import calibration, kv
from .costs import CONTEXT_SPAN, FRESH_CONTEXT, MIN_SPAN, BatchCosts, CostModel, context_room, measure_context_costs
from .threads import LoadMeter, decide

#: the most KV state (bytes) a calibration sets aside to measure its slopes from a short context;
#: a larger cache (a big model's long conversation) is measured after it, in one context
ASIDE_MAX_BYTES = 256 << 20


class EngineCosts:
    """Needs target, drafter, attention_switches, threads, governor, controller, costs,
    calibration, _costs_stale, _costs_by_attention, cost_n_max and _acquire() from the engine."""

    target: Any
    drafter: Any
    attention_switches: int
    threads: Any
    governor: Any
    controller: Any
    costs: CostModel | None
    calibration: dict[str, object]
    _costs_stale: bool
    _costs_by_attention: dict[str, tuple[BatchCosts, int]]  # flash attention setting -> (costs, threads)

    def _acquire(self) -> Any:
        raise NotImplementedError

    @property
    def cost_n_max(self) -> int:
        raise NotImplementedError

    def calibrate(self, *, use_cache: bool = True, progress=None, should_stop=None) -> CostModel:
        """Measure the target's batch costs c(n) at the current thread count, or take them from
        the calibration cache (calibration.py); the controller and the governor use them. Runs
        after the cached prompt, which stays. Measured while other programs leave the cores
        idle, they are cached for the next start. Raises nothing when should_stop() ends it
        early: the costs in use stay (a first calibration then runs to the end)."""
        threads = self.target.n_threads
        cache_key = calibration.key(self.target, threads, self.cost_n_max)
        costs = calibration.load(cache_key) if use_cache else None
        if costs is not None and not costs.slope_s and self._room_for_slopes(0):
            costs = None  # one context's seconds (a window that was full then): measured again
        source = "cache"
        if costs is None:
            measured = self._measure_costs(should_stop if self.costs is not None else None, progress)
            if measured is None:
                assert self.costs is not None
                return self.costs
            costs, idle = measured
            source = "measured"
            if idle:
                calibration.store(cache_key, costs)
        self._use_costs(costs, source, threads)
        assert self.costs is not None
        return self.costs

    def _room_for_slopes(self, keep: int) -> bool:
        """Whether the window has room for the calibration's second context after `keep` tokens."""
        return context_room(self.target, self.cost_n_max, max(keep, FRESH_CONTEXT)) >= MIN_SPAN

    def _measure_costs(self, should_stop=None, progress=None) -> tuple[BatchCosts, bool] | None:
        """c(n) measured now after the cached prompt and again a span of context later, and
        whether other programs left the cores idle meanwhile (only then is it worth caching);
        None when should_stop() ended it. When the cached prompt leaves no room for the second
        context (a long conversation), the cells are set aside (up to ASIDE_MAX_BYTES of them)
        and the costs measured from a short context instead, so that they come with their
        slopes; the cells come back after."""
        meter = LoadMeter()
        target = self.target
        keep = len(target.memory.tokens)
        aside = None
        if (keep and not self._room_for_slopes(keep) and self._room_for_slopes(0)
                and kv.seq_state_size(target.ctx) <= ASIDE_MAX_BYTES):
            aside = (kv.seq_state(target.ctx), list(target.memory.tokens))
        try:
            costs = measure_context_costs(target, self.cost_n_max, keep=None if aside else keep or None,
                                          should_stop=should_stop, progress=progress)
        finally:
            if aside is not None:
                target.memory.clear()
                if kv.load_seq_state(target.ctx, aside[0]):
                    target.memory.tokens.extend(aside[1])
        if costs is None:
            return None
        load = meter.sample()
        return costs, load is not None and decide(self.threads.cores, load).reason == "idle"

    def _use_costs(self, costs: BatchCosts, source: str, threads: int) -> None:
        # kept per attention setting: a routed engine (system.FlashAttnDecision.for_prompt) goes back to them
        self._costs_by_attention[self.target.flash_attn.setting] = (costs, threads)
        if self.costs is None:
            self.costs = CostModel.from_measured(costs)
        else:
            self.costs.calibrate(costs)
        if self.governor is not None:
            self.governor.calibrated(costs.verify_s[1], threads)
        self.calibration = {"source": source, "threads": threads, "context": costs.context,
                            "one_token_ms": round(costs.verify_s[1] * 1e3, 3),
                            "one_token_ms_per_1k_context": round(costs.slope_s.get(1, 0.0) * 1e6, 3)}
        self._costs_stale = False

    def recheck_costs(self, should_stop=None) -> bool | None:
        """Measure c(n) again (the background re-check of a cached calibration): True when they
        moved beyond calibration.differs()'s tolerance and were replaced, False when the cache
        holds, None when should_stop() ended it. Takes the engine's lock."""
        with self._acquire():
            if self.costs is None:
                self.calibrate()
                return True
            threads = self.target.n_threads
            measured = self._measure_costs(should_stop)
            if measured is None:
                return None
            fresh, idle = measured
            far = fresh.context + CONTEXT_SPAN  # the slopes, compared where they matter
            if not (calibration.differs(self.costs.seconds_at(fresh.context), fresh.verify_s)
                    or calibration.differs(self.costs.seconds_at(far), CostModel.from_measured(fresh).seconds_at(far))):
                return False
            self._use_costs(fresh, "re-checked", threads)
            if idle:
                calibration.store(calibration.key(self.target, threads, self.cost_n_max), fresh)
            return True

    # --- flash attention, routed by the prompt's length on the CPU --------------------------------

    def route_attention(self, n_prompt: int) -> str:
        """Compute attention as the engine would for a request whose prompt has n_prompt tokens
        (system.FlashAttnDecision.for_prompt); the setting in use. Waits for the request in progress."""
        with self._acquire():
            self._route_attention(n_prompt)
            return self.target.flash_attn.setting

    def _route_attention(self, n_prompt: int) -> None:
        """With flash attention routed (auto on the CPU), switch it for this request's prompt: the
        target's and drafter's contexts are made again (their cached cells moved across) and the
        batch costs of the new setting come into use (EngineCosts.attention_changed)."""
        if not self.target.set_flash_attn(self.target.flash_attn.for_prompt(n_prompt)):
            return
        self.attention_switches += 1
        if self.drafter is not None:
            self.drafter.rebind(self.target)
        self.attention_changed()

    def attention_changed(self) -> None:
        """The target computes attention another way now (a routed flash-attention switch): the
        costs measured for that setting at this thread count if there are any, else measured
        (or taken from the calibration cache) before the next generation that needs them."""
        if self.costs is None:
            return
        kept = self._costs_by_attention.get(self.target.flash_attn.setting)
        if kept is not None and kept[1] == self.target.n_threads:
            self._use_costs(kept[0], "kept", kept[1])
            if self.controller is not None:
                self.controller.recalibrated()
        else:
            self._costs_stale = True

    def prepare_costs(self) -> None:
        """Before a generation that needs them: batch costs measured or cached, and measured
        again when the thread count changed, the single-token step moved (CostModel.shifted) or the
        controller found its cost predictions wrong (KController.suspect)."""
        suspect = self.controller is not None and self.controller.suspect
        if self.costs is None or self._costs_stale or self.costs.shifted or suspect:
            self.calibrate(use_cache=self.costs is None or (self._costs_stale and not suspect))
            if self.controller is not None:
                self.controller.recalibrated()

