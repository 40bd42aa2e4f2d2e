"""The speculative loop: prefill, then draft k tokens, verify all k+1 in one target batch,
accept, roll both KV caches back, emit the accepted drafts and the bonus token.

Drafter-agnostic: anything implementing drafter.Drafter plugs in, or None for plain
decoding. Each yield happens with both caches consistent, so a consumer may stop at any
yield (EOS, stop string, cancel) and leave a usable state behind.
"""

from __future__ import annotations

from time import perf_counter
from typing import Iterator, Sequence

from .controller import KController
from .drafter import Drafter
from .sampling import Sampler
from .stats import SpecStats
from .target import Target

DRAFT, TARGET = "draft", "target"


def speculate(target: Target, drafter: Drafter | None, prompt: Sequence[int], *, max_tokens: int,
              k: int | KController, sampler: Sampler, stats: SpecStats,
              p_min: float = 0.0) -> Iterator[tuple[list[int], list[str]]]:
    """Yield (new tokens, their origins) per step until max_tokens tokens were produced.
    k is a fixed draft length or a KController that picks one per cycle."""
    controller = k if isinstance(k, KController) else None
    wants_features = drafter is not None and drafter.needs_features
    target.memory.clear()
    target.set_capture(drafter.target_layers if wants_features else ())
    if drafter is not None:
        drafter.reset()

    t0 = perf_counter()
    res = target.prefill(prompt)
    first = sampler.sample(res.logits[-1])
    stats.t_prefill = perf_counter() - t0
    stats.prompt_tokens = len(prompt)
    t_start = perf_counter()
    if wants_features:
        drafter.ingest(res.features, 0, prompt)  # type: ignore[union-attr]
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
        want = controller.choose() if controller is not None else k
        if controller is not None and wants_features:
            # auto decoding plainly: capture features (a few % per token) only when a draft may
            # come within the drafter's idle window; the drafter restarts from there
            need = want > 0 or controller.drafting_soon(controller.idle_window)
            if need != capturing:
                target.set_capture(drafter.target_layers if need else ())  # type: ignore[union-attr]
                capturing = need
                if need:
                    drafter.reset()  # type: ignore[union-attr]
                    want = 0  # no context rows yet: this cycle decodes plainly
        room = min(want, max_tokens - produced - 1, target.n_ctx - n_past - 1)  # type: ignore[type-var]
        drafts: list[int] = []
        if drafter is not None and room > 0:
            choose = sampler.draft if drafter.samples and not sampler.params.greedy else None
            drafts = drafter.propose(seq, room, p_min, choose)[:room]
        t_verify = perf_counter()
        batch = [seq[-1]] + drafts
        res = target.decode(batch, n_past, "all" if drafts else "last")
        q = drafter.last_q if drafts and drafter is not None and drafter.samples else None
        n_acc, bonus = sampler.verify(res.logits, drafts, q)
        if n_acc < len(drafts):
            target.memory.remove_from(n_past + n_acc + 1)
        t_ingest = perf_counter()
        if capturing:  # implies wants_features
            drafter.ingest(res.features[: n_acc + 1], n_past, batch[: n_acc + 1])  # type: ignore[union-attr]
            if controller is not None and want == 0:
                drafter.trim(controller.idle_window)  # type: ignore[union-attr]
        t_end = perf_counter()

        stats.t_verify += t_ingest - t_verify
        stats.t_draft += (t_verify - t_step) + (t_end - t_ingest)
        stats.record_step(len(drafts), n_acc)
        if controller is not None:
            controller.update(len(drafts), n_acc, len(batch), t_ingest - t_verify, t_verify - t_step)
        new = drafts[:n_acc] + [bonus]
        seq += new
        n_past += n_acc + 1
        produced += len(new)
        stats.generated = produced
        stats.t_total += perf_counter() - t_step  # time inside the loop only, not the consumer's
        yield new, [DRAFT] * n_acc + [TARGET]
