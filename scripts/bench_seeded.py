#!/usr/bin/env python
"""Seeded sampling against rejection sampling: acceptance and speed at a temperature, and
whether a seed fixes the text whatever speculation runs, on the real target.

    python scripts/bench_seeded.py [--limit 16] [-n 96] [--k 3] [--temperature 0.7] [--json OUT]

Per MT-bench first turn, back to back in alternating order: k drafts per cycle with a seed
(Gumbel-max samples at fixed noise per position; a draft is accepted iff it equals the
target's sample, the drafter drawing with the same noise) and without one (drafts sampled from
the drafter's q, accepted by rejection sampling). Reported: accepted drafts per drafted token,
tau (tokens per cycle), tokens/s ratio seeded / unseeded (median and range). Then, for each
prompt, the seeded text with k = 0 (plain decoding), k, `auto` and a tree of 7: how many equal
the plain text (differences at near-ties of llama.cpp's batch-shape noise are allowed by the
project's lossless rule; they are counted, not hidden).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

from edge_eagle import EdgeEagle  # noqa: E402
from edge_eagle.fsutil import emit_report  # noqa: E402
from edge_eagle.system import cpu_name  # noqa: E402
from scripts.eval_drafter import mtbench_first_turns  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--json")
    args = ap.parse_args()
    prompts = [p["prompt"] for p in mtbench_first_turns()][:: max(1, 80 // args.limit)][: args.limit]
    rows: dict[str, list] = {"seeded": [], "unseeded": []}
    same = {"k": 0, "auto": 0, "tree": 0}
    with EdgeEagle() as ee, tqdm(total=len(prompts), desc="bench_seeded", file=sys.stderr) as bar:
        for i, prompt in enumerate(prompts):
            text = ee.apply_chat_template([{"role": "user", "content": prompt}])
            runs = [("seeded", 1000 + i), ("unseeded", None)]
            for name, seed in (runs if i % 2 == 0 else runs[::-1]):
                gen = ee.generate(text, max_tokens=args.n, temperature=args.temperature, seed=seed, k=args.k).result()
                s = gen.stats
                rows[name].append({"drafted": s.drafted, "accepted": s.accepted, "cycles": s.verify_steps,
                                   "generated": s.generated, "tok_s": s.tokens_per_second})
            common = dict(max_tokens=args.n, temperature=args.temperature, seed=2000 + i)
            plain = ee.generate(text, k=0, **common).result().tokens
            same["k"] += ee.generate(text, k=args.k, **common).result().tokens == plain
            same["auto"] += ee.generate(text, k="auto", **common).result().tokens == plain
            same["tree"] += ee.generate(text, tree=7, **common).result().tokens == plain
            bar.update(1)

    def summary(name: str) -> dict:
        r = rows[name]
        drafted, accepted = sum(x["drafted"] for x in r), sum(x["accepted"] for x in r)
        cycles, generated = sum(x["cycles"] for x in r), sum(x["generated"] for x in r)
        return {"acceptance": round(accepted / max(1, drafted), 4), "tau": round(generated / max(1, cycles), 3),
                "drafted": drafted, "accepted": accepted}

    ratios = [a["tok_s"] / b["tok_s"] for a, b in zip(rows["seeded"], rows["unseeded"]) if b["tok_s"]]
    report = {"cpu": cpu_name(), "prompts": len(prompts), "max_tokens": args.n, "k": args.k,
              "temperature": args.temperature, "command": "python scripts/bench_seeded.py " + " ".join(sys.argv[1:]),
              "seeded": summary("seeded"), "unseeded": summary("unseeded"),
              "speed_seeded_vs_unseeded": {"median": round(statistics.median(ratios), 3),
                                           "min": round(min(ratios), 3), "max": round(max(ratios), 3)},
              "seeded_text_equals_plain": {k: f"{v}/{len(prompts)}" for k, v in same.items()}}
    emit_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
