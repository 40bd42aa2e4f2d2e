#!/usr/bin/env python
"""Structured output on the real target: what a JSON schema's grammar costs, and what
speculation gives under it.

    python scripts/bench_structured.py [--limit 12] [-n 96] [--rounds 2] [--temperature T --top-k K]
                                       [--json OUT]

Per prompt (a request for one JSON record), in rotating order within each round, greedy (or
sampled with --temperature, seeded per prompt so every runner draws the same text, or
unseeded with --unseeded):
grammar-constrained plain decoding (the baseline), the same with k=3 chains and with `auto`,
and unconstrained plain decoding (what the grammar costs). Reported: tokens/s of each as a
ratio to the constrained baseline on the same prompt and round (median, min, max), the same for
whole requests (wall time from the call to the last token, which also holds whatever the engine
does before decoding, such as measuring batch costs again), tau of the speculative runners, and
how many constrained speculative texts equal the constrained plain text.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from time import perf_counter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

from edge_eagle import EdgeEagle  # noqa: E402
from edge_eagle.fsutil import emit_report  # noqa: E402
from edge_eagle.grammar import json_schema_grammar  # noqa: E402
from edge_eagle.system import cpu_name  # noqa: E402

SUBJECTS = ["an apple", "Paris", "a bicycle", "the novel Dune", "a golden retriever", "the planet Mars",
            "a cup of coffee", "the Python language", "a violin", "Mount Everest", "a laptop", "the Moon",
            "a red fox", "the Nile river", "a chess set", "a pizza"]
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "category": {"enum": ["food", "place", "object", "animal", "book", "language", "other"]},
    "description": {"type": "string", "maxLength": 160},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4}},
    "required": ["name", "category", "description", "tags"], "additionalProperties": False}
RUNNERS = ("plain", "k3", "auto", "free")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.0, help="sample, seeded per prompt (default greedy)")
    ap.add_argument("--top-k", type=int, default=0, help="with --temperature: keep the k most probable tokens")
    ap.add_argument("--unseeded", action="store_true",
                    help="with --temperature: no seed (rejection sampling; texts then differ run to run)")
    ap.add_argument("--json")
    args = ap.parse_args()
    grammar = json_schema_grammar(SCHEMA)
    prompts = [f"Describe {s} as a JSON record with a name, a category, a description and tags."
               for s in SUBJECTS[: args.limit]]
    opts = {"plain": dict(k=0, grammar=grammar), "k3": dict(k=3, grammar=grammar),
            "auto": dict(k="auto", grammar=grammar), "free": dict(k=0)}
    ratios: dict[str, list[float]] = {r: [] for r in RUNNERS[1:]}
    walls: dict[str, list[float]] = {r: [] for r in RUNNERS[1:]}
    taus: dict[str, list[tuple[int, int]]] = {"k3": [], "auto": []}
    same = {"k3": 0, "auto": 0}
    with EdgeEagle() as ee, tqdm(total=args.rounds * len(prompts), desc="bench_structured", file=sys.stderr) as bar:
        ee.generate("Warm up.", max_tokens=8, k="auto").result()
        for rnd in range(args.rounds):
            for i, prompt in enumerate(prompts):
                text = ee.apply_chat_template([{"role": "user", "content": prompt}])
                shift = (rnd + i) % len(RUNNERS)
                got, wall = {}, {}
                for name in RUNNERS[shift:] + RUNNERS[:shift]:
                    t0 = perf_counter()
                    gen = ee.generate(text, max_tokens=args.n, temperature=args.temperature, top_k=args.top_k,
                                      seed=i if args.temperature > 0 and not args.unseeded else None,
                                      **opts[name]).result()
                    wall[name] = (perf_counter() - t0) / max(1, len(gen.tokens))  # seconds per token
                    got[name] = gen
                base = got["plain"].stats.tokens_per_second
                for name in RUNNERS[1:]:
                    ratios[name].append(got[name].stats.tokens_per_second / base)
                    walls[name].append(wall["plain"] / wall[name])
                for name in taus:
                    taus[name].append((got[name].stats.generated, got[name].stats.verify_steps))
                    if rnd == 0:
                        same[name] += got[name].tokens == got["plain"].tokens
                bar.update(1)

    def spread(xs: list[float]) -> dict:
        return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3)}

    report = {"cpu": cpu_name(), "prompts": len(prompts), "rounds": args.rounds, "max_tokens": args.n,
              "temperature": args.temperature, "top_k": args.top_k,
              "seeded": args.temperature > 0 and not args.unseeded,
              "command": "python scripts/bench_structured.py " + " ".join(sys.argv[1:]),
              "speed_vs_constrained_plain": {name: spread(xs) for name, xs in ratios.items()},
              "request_speed_vs_constrained_plain": {name: spread(xs) for name, xs in walls.items()},
              "tau": {name: round(sum(g for g, _ in v) / max(1, sum(c for _, c in v)), 3) for name, v in taus.items()},
              "text_equals_constrained_plain": {name: f"{v}/{len(prompts)}" for name, v in same.items()}}
    emit_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
