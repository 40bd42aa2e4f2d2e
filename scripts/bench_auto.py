#!/usr/bin/env python
"""auto k against plain decoding and fixed k, interleaved on the same prompts.

    python scripts/bench_auto.py [--drafter PATH] [--k 1 2 3 5] [--limit 16] [-n 96] [--rounds 1] [--json OUT]
    python scripts/bench_auto.py --temperature 0.7 --tau-only   # q-sampled drafts vs sample-and-match

Speed: per-prompt tokens/s ratio against plain decoding of the same prompt, run back to
back (plain, auto, k=..., in rotating order; --rounds times, the prompt's ratio the median of
its rounds), reported as median, quartiles and min-max. No request joins the suffix history. With
--tau-only it compares acceptance at temperature > 0 between drafts sampled from the
drafter's distribution (speculative sampling) and greedy drafts accepted only when the
target samples the same token (sample-and-match, what upstream does).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

from edge_eagle import Drafter, EdgeEagle, SpecStats  # noqa: E402
from edge_eagle.fsutil import emit_report  # noqa: E402
from edge_eagle.system import cpu_name  # noqa: E402
from scripts.eval_drafter import mtbench_first_turns  # noqa: E402


class GreedyDrafts(Drafter):
    """The wrapped drafter, always drafting its argmax (it never sees the sampler's choose)."""

    def __init__(self, inner: Drafter):
        self.inner, self.name = inner, inner.name
        self.needs_features, self.target_layers = inner.needs_features, inner.target_layers

    def reset(self) -> None:
        self.inner.reset()

    def ingest(self, features, pos0, tokens) -> None:
        self.inner.ingest(features, pos0, tokens)

    def trim(self, keep: int) -> None:
        self.inner.trim(keep)

    def propose(self, tokens, k, p_min=0.0, choose=None):
        return self.inner.propose(tokens, k, p_min, None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--drafter", default="default")
    ap.add_argument("--target", default=None)
    ap.add_argument("--k", type=int, nargs="*", default=[1, 2, 3, 5], help="fixed draft lengths (none: --k)")
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--tau-only", action="store_true")
    ap.add_argument("--rounds", type=int, default=1,
                    help="runs of each prompt per runner, in rotating order; a prompt's ratio is its median")
    ap.add_argument("--json")
    args = ap.parse_args()
    prompts = [q["prompt"] for q in mtbench_first_turns()[:: max(1, 80 // args.limit)][: args.limit]]
    out: dict = {}
    with EdgeEagle(args.target, args.drafter, n_ctx=2048) as ee:
        msgs = lambda p: [{"role": "user", "content": p}]  # noqa: E731
        if args.tau_only:
            temp = args.temperature or 0.7
            for name, greedy_drafts in (("speculative sampling (q-sampled drafts)", False),
                                        ("sample-and-match (greedy drafts)", True)):
                total = SpecStats()
                drafter = ee.drafter
                if greedy_drafts:
                    ee.drafter = GreedyDrafts(drafter)  # greedy drafts: accepted iff the target samples them
                for i, p in enumerate(tqdm(prompts, desc=name, file=sys.stderr)):
                    total.merge(ee.chat(msgs(p), max_tokens=args.n, temperature=temp, seed=i, k=5).result().stats)
                ee.drafter = drafter
                out[name] = {"tau": round(total.tau, 3), "temperature": temp, "k": 5,
                             "per_position_acceptance": [round(x, 3) for x in total.per_position_acceptance]}
        else:
            modes = [("plain", dict(speculative=False)), ("auto", dict(k="auto"))] + [
                (f"k={k}", dict(k=k)) for k in args.k]
            ratios: dict[str, list[float]] = {m: [] for m, _ in modes[1:]}
            ee.chat(msgs("warm up"), max_tokens=16, k="auto", history=False).result()
            for i, p in enumerate(tqdm(prompts, desc="prompts", file=sys.stderr)):
                per: dict[str, list[float]] = {m: [] for m in ratios}
                for r in range(args.rounds):
                    turn = (i + r) % len(modes)
                    speed = {}
                    for name, kw in modes[turn:] + modes[:turn]:
                        # history=False: no runner drafts from another's answer to the same prompt
                        speed[name] = ee.chat(msgs(p), max_tokens=args.n, history=False,
                                              **kw).result().stats.tokens_per_second
                    for name in per:
                        per[name].append(speed[name] / speed["plain"])
                for name in ratios:
                    ratios[name].append(statistics.median(per[name]))
            out["cpu"] = cpu_name()
            out["command"] = "python scripts/bench_auto.py " + " ".join(sys.argv[1:])
            for name, r in ratios.items():
                q = statistics.quantiles(r, n=4) if len(r) > 1 else [r[0]] * 3
                out[name] = {"speedup_median": round(statistics.median(r), 3), "q1": round(q[0], 3),
                             "q3": round(q[2], 3), "min": round(min(r), 3), "max": round(max(r), 3),
                             "prompts": len(r), "rounds": args.rounds}
    emit_report(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
