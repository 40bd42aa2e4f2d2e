#!/usr/bin/env python
"""The suffix index's own costs, what an oracle would gain from its drafts, and what `auto` gains.

    python scripts/bench_suffix.py [--prompts repeat] [--limit 12] [--every 1] [-n 128]
                                    [--index-tokens 100000] [--n-ctx 4096] [--json OUT]

1. Index, for each implementation (the Python SuffixIndex and, where it is built, the native one):
   prompts of the shipped sets and MT-bench, tokenized by the target, indexed as requests until
   the history holds --index-tokens tokens; reported: indexing tokens/s, lookups/s (a tree of up
   to 12 nodes, 4 paths, after each appended token, as `auto` asks), index keys and entries, and
   bytes (Python: tracemalloc's count of what the index allocated; native: what its C code
   allocated, from its stats()). --index-only stops there.
2. Oracle: for each prompt of --prompts (chat-formatted as `edge-eagle bench` does: second turns
   after the target's own first answer, recorded sessions as given), plain greedy decoding's
   answer; then, position by position, the suffix lookup `auto` would see (this prompt, earlier
   prompts' answers in the history) and how much of its tree the answer follows. An oracle that
   knows that takes the lookup, cut to the accepted path, whenever (accepted + 1) /
   c(accepted + 1) beats a plain step, with this CPU's measured c(n). Reported: its tokens per
   single-step cost per prompt: the most any proposer choice could gain from these drafts here.
3. Policy replay: the same answers after their first token (which the prompt's prefill gives, as
   in the live loop), decoded by `auto`'s controller choosing between plain steps
   and these lookups (no drafter), each cycle charged c(m + 1) for m drafted nodes at its
   context: what the choice gains without knowing the outcome, beside the oracle (also as a
   geometric mean, and the controller's own time per cycle with warm caches); and the same
   with a controller that believes the first context's c(n) everywhere (replay_flat_costs).
   Greedy verification commits the same answer whichever the choice, so the replay needs no
   decoding. Costs (c(n) and its growth with the context) are measured afresh.
4. A projection for memory-bound hardware (a GPU's shape; not measured here): the oracle and
   the replay again with c(n) = 1 up to 8 tokens and n / 8 beyond (costs.memory_bound_cost),
   at every context.
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

from edge_eagle import EdgeEagle  # noqa: E402
from edge_eagle.api import LOOKUP_NODES, LOOKUP_PATHS  # noqa: E402
from edge_eagle.bench.divergence import top2_gap  # noqa: E402
from edge_eagle.bench.options import BenchOptions  # noqa: E402
from edge_eagle.bench.prompts import load_prompts  # noqa: E402
from edge_eagle.bench.suite import Bench  # noqa: E402
from edge_eagle.controller import AcceptanceModel, KController  # noqa: E402
from edge_eagle.costs import MEMORY_BOUND_MAX_N, CostModel, memory_bound_cost  # noqa: E402
from edge_eagle.drafter import NO_DRAFTER  # noqa: E402
from edge_eagle.fsutil import emit_report  # noqa: E402
from edge_eagle.policy import LOOKUP, DraftPolicy, Plan  # noqa: E402
from edge_eagle.sampling import Sampler, SamplingParams  # noqa: E402
from edge_eagle.speculative import speculate  # noqa: E402
from edge_eagle.stats import SpecStats, spread  # noqa: E402
from edge_eagle.suffix import NativeSuffixIndex, SuffixIndex, native_available, new_index  # noqa: E402
from edge_eagle.system import cpu_name  # noqa: E402


def index_costs(ee: EdgeEagle, total: int, make: Callable[..., SuffixIndex] = SuffixIndex) -> dict:
    texts = []
    for name in ("mtbench", "repeat", "humaneval"):
        for p in load_prompts(name):
            texts.append(ee.target.tokenize(p.text, add_special=False))
    stream, i = [], 0
    while sum(len(t) for t in stream) < total:  # the texts again and again, as a user's stream repeats itself
        stream.append(texts[i % len(texts)])
        i += 1
    tracemalloc.start()
    ix = make(max_tokens=total)
    t0 = time.perf_counter()
    for t in stream:
        ix.finish(t)
    index_s = time.perf_counter() - t0
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    if isinstance(ix, NativeSuffixIndex):  # tracemalloc sees Python's allocations only
        held = ix.stats()["approx_bytes"]
    probe = [t for text in texts[3:40:3] for t in text]  # a request quoting earlier ones: ~2,000 lookups
    gc.collect()
    t0 = time.perf_counter()
    n = 0
    for end in range(40, len(probe)):
        ix.lookup(probe[:end], 8, LOOKUP_NODES, LOOKUP_PATHS)
        n += 1
    lookup_s = time.perf_counter() - t0
    st = ix.stats()
    return {"history_tokens": st["history_tokens"], "indexing_tokens_per_s": round(st["history_tokens"] / index_s),
            "lookups_per_s": round(n / lookup_s), "keys": st["keys"], "entries": st["entries"],
            "bytes": held, "bytes_per_token": round(held / st["history_tokens"], 1)}


def answers(bench: Bench, prompts, n: int) -> list[tuple[list[int], list[int]]]:
    """(prompt tokens, plain greedy answer) per prompt."""
    ee = bench.engines[0]
    out = []
    for p in tqdm(prompts, desc="answers", file=sys.stderr):
        ids, _ = bench.prompt_tokens(p)
        out.append((ids, ee.generate(ids, max_tokens=n, speculative=False, history=False).result().tokens))
    return out


def at_context(costs: CostModel) -> Callable[[int, int], float]:
    """c(n) after a context of `context` tokens: c(n, context)."""
    truth = copy.deepcopy(costs)

    def c(n: int, context: int) -> float:
        truth.context = context
        return truth.c(n)
    return c


def oracle(pairs, costs: CostModel) -> list[float]:
    ix = new_index()
    at = at_context(costs)
    ratios = []
    for ids, out in pairs:
        tokens, cost, t = 0, 0.0, 0
        while t < len(out):
            # committed: ids + out[:t]; the drafts guess out[t:], and the cycle adds a bonus token
            d = ix.lookup(ids + out[:t], 8, LOOKUP_NODES, LOOKUP_PATHS)
            acc = min(_accepted(d.proposal, out[t:]), len(out) - t - 1) if len(d.proposal) else 0
            step = at(acc + 1, len(ids) + t) if acc else 1.0
            if acc and (acc + 1) / step > 1.0:
                tokens, cost, t = tokens + acc + 1, cost + step, t + acc + 1
            else:
                tokens, cost, t = tokens + 1, cost + 1.0, t + 1
        ix.finish(ids + out)
        ratios.append(tokens / cost if cost else 1.0)
    return ratios


def memory_bound(costs: CostModel) -> CostModel:
    """This CPU's single step, with c(n) of memory-bound hardware (costs.memory_bound_cost) at
    every context: the costs of a projection."""
    one = costs.verify_s[1]
    return CostModel(verify_s={n: one * memory_bound_cost(n) for n in range(1, 2 * LOOKUP_NODES + 2)})


def replay(pairs, costs: CostModel, flat: bool = False,
           clock: list[float] | None = None) -> tuple[list[float], int, int]:
    """`auto`'s choice between plain steps and suffix lookups on the recorded answers: (tokens per
    single-step cost per prompt, lookup cycles, cycles). Each cycle is charged c(n) at its
    context; flat: the controller believes the costs of the calibration's first context
    everywhere (no slopes), as it did before costs followed the context. clock: [seconds] the
    controller's plan() and update() took in all (here, with warm caches: a live loop pays
    more, right after llama.cpp's kernels)."""
    ix = new_index()
    model = CostModel(verify_s=dict(costs.verify_s)) if flat else copy.deepcopy(costs)
    ctl = KController(k_max=8, costs=model, lookup=ix, lookup_max=8,
                      lookup_nodes=LOOKUP_NODES, lookup_paths=LOOKUP_PATHS,
                      acceptance=AcceptanceModel(8, prior=0.0), probe_every=1 << 30, probe_max=1 << 30)
    truth = copy.deepcopy(costs)
    ratios, lookups, cycles = [], 0, 0
    for ids, out in pairs:
        ctl.begin()
        # the first token comes from the prompt's prefill, as in the live loop: the first cycle
        # plans after it (where the answer starts for the controller's match-length cap)
        tokens, cost, t = 0, 0.0, min(1, len(out))
        while t < len(out):
            committed = ids + out[:t]
            t0 = time.perf_counter()
            plan = ctl.plan(committed)
            spent = time.perf_counter() - t0
            cycles += 1
            m = len(plan.proposal) if plan.kind == LOOKUP else 0
            acc = min(_accepted(plan.proposal, out[t:]), len(out) - t - 1) if m else 0
            truth.context = len(ids) + t
            step = truth.c(m + 1)
            seconds = step * (truth.step_s() or 0.0)
            tokens, cost, t = tokens + acc + 1, cost + step, t + acc + 1
            lookups += bool(m)
            t0 = time.perf_counter()
            ctl.update(m, acc, m + 1, seconds, 0.0)
            spent += time.perf_counter() - t0
            if clock is not None:
                clock[0] += spent
        ix.finish(ids + out)
        ratios.append(tokens / cost if cost else 1.0)
    return ratios, lookups, cycles


class SuffixEveryCycle(DraftPolicy):
    """The suffix lookup's whole tree on every cycle that finds one."""

    idle_window = None

    def __init__(self, index: SuffixIndex):
        self.index = index

    def plan(self, tokens):
        d = self.index.lookup(tokens, 8, LOOKUP_NODES, LOOKUP_PATHS)
        return Plan(LOOKUP, len(d.proposal), d.proposal) if len(d.proposal) else Plan()

    def features_needed_soon(self) -> bool:
        return False


def equality(ee: EdgeEagle, pairs) -> dict:
    """Suffix drafts on every cycle against plain decoding's answers: equal texts, and where a
    text differs, the first differing token and the top-2 logit gap there."""
    ix, equal, differ = new_index(), 0, []
    for i, (ids, out) in enumerate(tqdm(pairs, desc="equality", file=sys.stderr)):
        got: list[int] = []
        for new, _ in speculate(ee.target, NO_DRAFTER, ids, max_tokens=len(out), policy=SuffixEveryCycle(ix),
                                sampler=Sampler(SamplingParams()), stats=SpecStats()):
            got += new
        ix.finish(keep=False)
        ix.finish(ids + out)  # the history holds plain decoding's answers, as for the oracle
        j = next((n for n, (a, b) in enumerate(zip(got, out)) if a != b), None)
        if j is None:
            equal += 1
            continue
        differ.append({"prompt": i, "token": j, "top2_gap": round(top2_gap(ee.target, ids + out[:j]), 4)})
    ee.target.memory.clear()
    return {"equal": equal, "prompts": len(pairs), "differ": differ}


def _accepted(proposal, future: list[int]) -> int:
    """How far the tree's best path follows `future` (greedy verification of the tree)."""
    node, depth = -1, 0
    while depth < len(future):
        kids = [i for i, par in enumerate(proposal.parents) if par == node]
        nxt = next((i for i in kids if proposal.tokens[i] == future[depth]), None)
        if nxt is None:
            break
        node, depth = nxt, depth + 1
    return depth


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", default="repeat")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--index-tokens", type=int, default=100_000)
    ap.add_argument("--n-ctx", type=int, default=4096, help="context window (prompts are cut to fit, as bench does)")
    ap.add_argument("--index-only", action="store_true", help="measure the index's costs only")
    ap.add_argument("--json")
    args = ap.parse_args()
    bench = Bench(BenchOptions(prompts=args.prompts, drafters=[], ks=[], auto=False, upstream=False,
                               prompt_lookup_k=None, memory=False, max_tokens=args.n, n_ctx=args.n_ctx))
    try:
        ee = bench.engines[0]
        index = {"python": index_costs(ee, args.index_tokens)}
        if native_available():
            index["native"] = index_costs(ee, args.index_tokens, NativeSuffixIndex)
        if args.index_only:
            emit_report({"cpu": cpu_name(), "command": "python scripts/bench_suffix.py " + " ".join(sys.argv[1:]),
                         "index": index}, args.json)
            return 0
        pairs = answers(bench, load_prompts(args.prompts, args.limit, args.every), args.n)
        # the costs of the attention setting the answers ran with (routed by prompt length)
        ee.route_attention(sorted(len(ids) for ids, _ in pairs)[len(pairs) // 2])
        costs = ee.calibrate(use_cache=False)
        same = equality(ee, pairs)
        flash_attn = ee.target.flash_attn.flag
    finally:
        bench.close()
    best = oracle(pairs, costs)
    clock = [0.0]
    chosen, lookups, cycles = replay(pairs, costs, clock=clock)
    flat, flat_lookups, _ = replay(pairs, costs, flat=True)
    # the same drafts where a batch of up to MEMORY_BOUND_MAX_N tokens costs one step (a GPU's
    # shape, projected: no GPU measured it here)
    bound = memory_bound(costs)
    bound_best = oracle(pairs, bound)
    bound_chosen, bound_lookups, bound_cycles = replay(pairs, bound)
    report = {"cpu": cpu_name(), "command": "python scripts/bench_suffix.py " + " ".join(sys.argv[1:]),
              "index": index, "c": {m: round(costs.c(m), 3) for m in range(1, 18)},
              "prompts": args.prompts, "count": len(pairs), "oracle": spread(best),
              "flash_attn": flash_attn,
              "slope_ms_per_1k_context": {m: round(costs.slope_s[m] * 1e6, 3) for m in sorted(costs.slope_s)},
              "prompt_tokens": spread([len(ids) for ids, _ in pairs]),
              "replay": {**spread(chosen), "lookup_cycles": lookups, "cycles": cycles,
                         "geometric_mean": round(statistics.geometric_mean(chosen), 4),
                         "plan_us_per_cycle": round(clock[0] / max(1, cycles) * 1e6, 1)},
              "replay_flat_costs": {**spread(flat), "lookup_cycles": flat_lookups},
              "memory_bound_projection": {
                  "c": f"1 up to {MEMORY_BOUND_MAX_N} tokens, n / {MEMORY_BOUND_MAX_N} beyond",
                  "oracle": {**spread(bound_best), "geometric_mean": round(statistics.geometric_mean(bound_best), 4)},
                  "replay": {**spread(bound_chosen), "lookup_cycles": bound_lookups, "cycles": bound_cycles,
                             "geometric_mean": round(statistics.geometric_mean(bound_chosen), 4)}},
              "suffix_drafts_equal_plain": same}
    emit_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
