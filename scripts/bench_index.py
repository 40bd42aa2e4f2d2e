#!/usr/bin/env python
"""`auto` as shipped against a variant in the live loop: by default, the C suffix index against
the Python one (what the index costs per cycle).

    python scripts/bench_index.py [--versus python-index|per-depth-copies] [--prompts mtbench] [--limit 20]
                                  [--every 1] [-n 96] [--rounds 3] [--history] [--json OUT]

Two engines on the default target and drafter, `auto` as shipped (the C index,
NativeSuffixIndex) and a variant, and plain decoding on the first, run back to back per prompt
in rotating order (--rounds times; a prompt's ratio is the median of its rounds). Variants:
python-index, the Python index (SuffixIndex); per-depth-copies, the controller's model of
matches of 32 tokens or more kept per depth, as before 2026-12-07 (POOLED_MATCH). Without
--history no request joins the history (as in scripts/bench_auto.py), so each engine's index
holds the current request only; with it, each engine's last round of a prompt joins its history
(earlier rounds see the earlier prompts' answers only, never the same prompt's). Each controller
learns from its own cycles. Reported per
runner: the ratio to plain decoding's tokens/s (median, quartiles and geometric mean over
prompts), lookup cycles, tau, and the host's time per cycle outside the target's batches
((SpecStats.t_total - t_verify) / cycles, median over runs), with `auto`'s plan() and update()
timed apart (their total over all runs / cycles): in the live loop these run right after
llama.cpp's kernels, with the host's caches cold.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

from edge_eagle import EdgeEagle  # noqa: E402
from edge_eagle.bench.options import BenchOptions  # noqa: E402
from edge_eagle.bench.prompts import load_prompts  # noqa: E402
from edge_eagle.bench.suite import Bench  # noqa: E402
from edge_eagle.controller import AcceptanceModel  # noqa: E402
from edge_eagle.errors import EdgeEagleError  # noqa: E402
from edge_eagle.fsutil import emit_report  # noqa: E402
from edge_eagle.suffix import NativeSuffixIndex, SuffixIndex, native_available  # noqa: E402
from edge_eagle.system import cpu_name  # noqa: E402


def timed(fn: Callable[..., Any], clock: list[float]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            clock[0] += time.perf_counter() - t0
    return run


def per_depth(lookup_model: Callable[..., AcceptanceModel]) -> Callable[..., AcceptanceModel]:
    """The controller's lookup models, each kept per depth (none pooled)."""
    def model(n: int, history: bool = False, split: bool = False) -> AcceptanceModel:
        found = lookup_model(n, history, split)
        found.pooled = False
        return found
    return model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", default="mtbench")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--versus", choices=["python-index", "per-depth-copies"], default="python-index")
    ap.add_argument("--history", action="store_true", help="each engine keeps the earlier prompts' answers")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not native_available():
        raise EdgeEagleError("The native suffix index is not built (or EDGE_EAGLE_NATIVE_SUFFIX=0): "
                             "run `pip install -e .` with a C compiler, then run this again.")
    bench = Bench(BenchOptions(prompts=args.prompts, max_tokens=args.n, n_ctx=args.n_ctx, ks=[], upstream=False,
                               prompt_lookup_k=None, memory=False))
    engines = {"shipped": bench.engines[0], args.versus: EdgeEagle(n_ctx=args.n_ctx)}
    if args.versus == "python-index":
        engines[args.versus].suffix = SuffixIndex()
    assert isinstance(engines["shipped"].suffix, NativeSuffixIndex)
    clocks = {who: [0.0] for who in engines}
    for who, ee in engines.items():
        ctl = ee.auto_controller()
        if who == "per-depth-copies":
            ctl._lookup_model = per_depth(ctl._lookup_model)  # type: ignore[method-assign]
        ctl.plan = timed(ctl.plan, clocks[who])  # type: ignore[method-assign]
        ctl.update = timed(ctl.update, clocks[who])  # type: ignore[method-assign]
    runners = ["plain", *engines]
    ratios: dict[str, list[float]] = {who: [] for who in engines}
    host: dict[str, list[float]] = {who: [] for who in runners}
    lookups = {who: 0 for who in engines}
    cycles = {who: 0 for who in engines}
    taus: dict[str, list[float]] = {who: [] for who in engines}
    prompts = load_prompts(args.prompts, args.limit, args.every)
    try:
        for i, p in enumerate(tqdm(prompts, desc="prompts", file=sys.stderr)):
            ids, _ = bench.prompt_tokens(p)
            for ee in engines.values():
                ee.route_attention(len(ids))
            per: dict[str, list[float]] = {who: [] for who in engines}
            for r in range(args.rounds):
                shift = (i + r) % len(runners)
                speed = {}
                for who in runners[shift:] + runners[:shift]:
                    ee = engines["shipped" if who == "plain" else who]
                    keep = args.history and who != "plain" and r == args.rounds - 1
                    s = ee.generate(ids, max_tokens=args.n, speculative=who != "plain", k="auto",
                                    history=keep).result().stats
                    speed[who] = s.tokens_per_second
                    host[who].append((s.t_total - s.t_verify) / max(1, s.verify_steps) * 1e6)
                    if who != "plain":
                        lookups[who] += s.proposers.get("lookup", 0)
                        cycles[who] += s.verify_steps
                        taus[who].append(s.tau)
                for who in engines:
                    per[who].append(speed[who] / speed["plain"])
            for who in engines:
                ratios[who].append(statistics.median(per[who]))
    finally:
        engines[args.versus].close()
        bench.close()
    report: dict[str, Any] = {"cpu": cpu_name(), "command": "python scripts/bench_index.py " + " ".join(sys.argv[1:]),
                              "versus": args.versus, "history": args.history,
                              "prompts": args.prompts, "count": len(prompts), "rounds": args.rounds,
                              "plain": {"host_us_per_cycle": round(statistics.median(host["plain"]), 1)}}
    for who in engines:
        v = ratios[who]
        q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0], v[0], v[0]]
        report[who] = {"speedup_median": round(statistics.median(v), 3), "q1": round(q[0], 3), "q3": round(q[2], 3),
                       "geometric_mean": round(statistics.geometric_mean(v), 3), "lookup_cycles": lookups[who],
                       "cycles": cycles[who], "tau": round(statistics.mean(taus[who]), 3),
                       "host_us_per_cycle": round(statistics.median(host[who]), 1),
                       "plan_update_us_per_cycle": round(clocks[who][0] / max(1, cycles[who]) * 1e6, 1)}
    emit_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
