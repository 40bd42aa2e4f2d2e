#!/usr/bin/env python
"""auto's per-cycle proposer against plain decoding, interleaved, several rounds.

    python scripts/bench_proposer.py [--prompts repeat] [--rounds 3] [-n 128] [--json OUT]

For each round and prompt: plain decoding, then auto (rotating which goes first), on one
engine whose controller keeps learning across prompts, as a user's would. auto's answers join
the engine's history (suffix drafts), plain's do not, and each round starts with none: no
answer to a prompt is drafted from when the same prompt runs again. Reports the
per-prompt tokens/s ratio auto / plain (median over rounds, then median and spread over
prompts, and per category), the proposers auto used, and tau.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

from edge_eagle import EdgeEagle, SpecStats  # noqa: E402
from edge_eagle.bench.prompts import load_prompts  # noqa: E402
from edge_eagle.fsutil import atomic_write  # noqa: E402
from edge_eagle.stats import spread  # noqa: E402
from edge_eagle.system import cpu_name  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", default="repeat", help="a bench prompt set (repeat, mtbench, humaneval) or .jsonl")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--drafter", default="default")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json")
    args = ap.parse_args()

    prompts = load_prompts(args.prompts, args.limit, args.every)
    ratios: dict[str, list[float]] = {p.id: [] for p in prompts}
    total = SpecStats()
    with EdgeEagle(None, args.drafter, n_ctx=2048, n_threads=args.threads) as ee:
        ids = {p.id: ee.target.tokenize(ee.apply_chat_template([{"role": "user", "content": p.text}]),
                                         add_special=False) for p in prompts}
        ee.auto_controller()  # calibrate before timing
        bar = tqdm(total=args.rounds * len(prompts), desc="rounds", file=sys.stderr)
        for r in range(args.rounds):
            ee.reset_history()  # suffix drafts may draw on earlier prompts' answers, never this prompt's
            for i, p in enumerate(prompts):
                speeds = {}
                for mode in (("plain", "auto") if (r + i) % 2 == 0 else ("auto", "plain")):
                    ee.target.memory.clear()  # no prompt-cache reuse between the two
                    gen = ee.generate(ids[p.id], max_tokens=args.n, speculative=mode == "auto", k="auto",
                                      history=mode == "auto").result()
                    speeds[mode] = gen.stats.tokens_per_second
                    if mode == "auto":
                        total.merge(gen.stats)
                ratios[p.id].append(speeds["auto"] / speeds["plain"])
                bar.update(1)
        bar.close()
    per_prompt = {pid: statistics.median(v) for pid, v in ratios.items()}
    cats: dict[str, list[float]] = {}
    for p in prompts:
        cats.setdefault(p.category, []).append(per_prompt[p.id])
    report = {"cpu": cpu_name(), "prompts": args.prompts, "rounds": args.rounds, "max_tokens": args.n,
              "auto_over_plain": spread(per_prompt.values()),
              "by_category": {c: round(statistics.median(v), 3) for c, v in sorted(cats.items())},
              "per_prompt": {k: round(v, 3) for k, v in per_prompt.items()},
              "tau": round(total.tau, 3), "proposers": total.proposers,
              "per_position_acceptance": [round(x, 3) for x in total.per_position_acceptance]}
    if args.json:
        atomic_write(args.json, json.dumps(report, indent=2) + "\n")
    s = report["auto_over_plain"]
    print(f"CPU {report['cpu']}; {len(prompts)} prompts ({args.prompts}) x {args.rounds} rounds, {args.n} tokens")
    print(f"auto / plain tokens/s, per prompt: median {s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f}); "
          f"by category {report['by_category']}")
    print(f"tau {report['tau']}, proposers {report['proposers']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
