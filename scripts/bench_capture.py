#!/usr/bin/env python
"""What switching the target's feature capture costs, and what a request saves by not switching.

    python scripts/bench_capture.py [--rounds 15] [--prompts 40] [-n 32] [--json OUT]

1. Single-token decodes after a 100-token context (--rounds rounds, interleaved): steady with
   capture off, the first after switching it on, steady with it on, the first after switching it
   off; and, without capture, the first single-token decode after a batch of 4 tokens. Medians.
2. MT-bench first turns (--prompts, every 2nd), each decoded by `auto` twice, interleaved: once
   starting with capture on whatever the policy needs (as before 2026-12-07: on for the
   prefill, off on the first cycle), once starting as the policy needs (the default). The
   controller is held to plain decoding (no lookups, no probes), so both runs make the same
   cycles. Reported: prefill time, the first cycle's decode, the other cycles' median, and the
   loop's time (SpecStats.t_total), medians and paired differences.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

from edge_eagle import cycle as cycles  # noqa: E402
from edge_eagle import speculative  # noqa: E402
from edge_eagle.bench.options import BenchOptions  # noqa: E402
from edge_eagle.bench.prompts import load_prompts  # noqa: E402
from edge_eagle.bench.suite import Bench  # noqa: E402
from edge_eagle.controller import AcceptanceModel  # noqa: E402
from edge_eagle.fsutil import emit_report  # noqa: E402
from edge_eagle.system import cpu_name  # noqa: E402


def switch_costs(ee, rounds: int) -> dict:
    t, layers = ee.target, tuple(ee.drafter.target_layers)
    pad = t.eos if t.eos >= 0 else 0
    t.set_capture(())
    t.memory.clear()
    t.prefill([pad] * 100, 0)
    pos = 100

    def decode(n: int = 1) -> float:
        nonlocal pos
        t0 = time.perf_counter()
        t.decode([pad] * n, pos, "all" if n > 1 else "last")
        pos += n
        return (time.perf_counter() - t0) * 1e3

    out: dict[str, list[float]] = {k: [] for k in ("steady, off", "first after switching on", "steady, on",
                                                   "first after switching off", "first after a batch of 4")}
    for _ in tqdm(range(rounds), desc="switches", file=sys.stderr):
        out["steady, off"].append(sorted([decode(), decode(), decode()])[1])
        t.set_capture(layers)
        out["first after switching on"].append(decode())
        out["steady, on"].append(sorted([decode(), decode(), decode()])[1])
        t.set_capture(())
        out["first after switching off"].append(decode())
        decode(4)
        out["first after a batch of 4"].append(decode())
        if pos > 1500:
            t.memory.remove_from(100)
            pos = 100
    t.memory.clear()
    return {k: round(statistics.median(v), 3) for k, v in out.items()}


def requests(bench: Bench, count: int, n: int) -> dict:
    ee = bench.engines[0]
    ctl = ee.auto_controller()
    ctl.lookup, ctl.acceptance = None, AcceptanceModel(ee.k_max, prior=0.0)  # plain decoding throughout
    ctl.probe_every = ctl.probe_max = 1 << 30
    on_at_start = [False]
    init = speculative.FeatureSwitch.__init__

    def switch(self, target, drafter, soon=True):
        init(self, target, drafter, True if on_at_start[0] else soon)

    times: list[float] = []
    run = cycles.StepCycle.run

    def timed(self, *args):
        r = run(self, *args)
        times.append(r.verify_s)
        return r

    speculative.FeatureSwitch.__init__ = switch  # type: ignore[method-assign]
    cycles.StepCycle.run = timed  # type: ignore[method-assign]
    res: dict[bool, dict[str, list[float]]] = {old: {"prefill": [], "first": [], "others": [], "loop": []}
                                               for old in (True, False)}
    try:
        for i, p in enumerate(tqdm(load_prompts("mtbench", count, 2), desc="requests", file=sys.stderr)):
            ids, _ = bench.prompt_tokens(p)
            for old in ((True, False) if i % 2 else (False, True)):
                on_at_start[0] = old
                times.clear()
                ee.target.memory.clear()  # both prefill the whole prompt
                s = ee.generate(ids, max_tokens=n, k="auto", history=False).result().stats
                d = res[old]
                d["prefill"].append(s.t_prefill * 1e3)
                d["first"].append(times[0] * 1e3)
                d["others"].append(statistics.median(times[1:]) * 1e3)
                d["loop"].append(s.t_total * 1e3)
    finally:
        speculative.FeatureSwitch.__init__ = init  # type: ignore[method-assign]
        cycles.StepCycle.run = run  # type: ignore[method-assign]
    report = {name: {k: round(statistics.median(v), 2) for k, v in res[old].items()}
              for name, old in (("capture on at the start", True), ("as the policy needs", False))}
    report["paired_saving_ms"] = {k: round(statistics.median(a - b for a, b in zip(res[True][k], res[False][k])), 2)
                                  for k in ("prefill", "loop")}
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--json")
    args = ap.parse_args()
    bench = Bench(BenchOptions(prompts="mtbench", ks=[], auto=True, upstream=False,
                               prompt_lookup_k=None, memory=False, max_tokens=args.n, n_ctx=2048))
    try:
        decodes = switch_costs(bench.engines[0], args.rounds)
        per_request = requests(bench, args.prompts, args.n)
    finally:
        bench.close()
    emit_report({"cpu": cpu_name(), "command": "python scripts/bench_capture.py " + " ".join(sys.argv[1:]),
                 "decode_ms": decodes, "requests": per_request}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
