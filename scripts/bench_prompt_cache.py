#!/usr/bin/env python
"""Multi-turn time to first token with and without prompt-cache reuse (edge_eagle/speculative.py).

    python scripts/bench_prompt_cache.py [--turns 5] [--rounds 3] [--max-tokens 96] [--drafter default] [--json OUT]

A chat of --turns user messages on the default target: each turn sends the whole conversation
so far to EdgeEagle.chat(). "reuse" keeps the KV between turns (the library's behaviour);
"fresh" empties both caches before each turn (what every turn paid before). The two run
interleaved per round on the same messages. Reports per turn the median time to the first
token (prefill) in each mode, its ratio fresh/reuse with min-max, and the prompt tokens cached.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edge_eagle import EdgeEagle  # noqa: E402
from edge_eagle.fsutil import emit_report  # noqa: E402
from edge_eagle.stats import spread  # noqa: E402
from edge_eagle.system import cpu_name  # noqa: E402

QUESTIONS = ["Name three colours.", "Which of them is warmest, and why?", "Write a haiku about it.",
             "Now explain the haiku line by line.", "Summarise our conversation in two sentences.",
             "Give it a title.", "Translate the title to French."]


def conversation(ee: EdgeEagle, turns: int, max_tokens: int, fresh: bool) -> list[tuple[float, int, int]]:
    msgs: list[dict[str, str]] = []
    out = []
    for q in QUESTIONS[:turns]:
        msgs.append({"role": "user", "content": q})
        if fresh:
            ee.target.memory.clear()
            if ee.drafter is not None:
                ee.drafter.reset()
        gen = ee.chat(msgs, max_tokens=max_tokens)
        t0 = time.perf_counter()
        next(iter(gen))
        ttft = time.perf_counter() - t0
        gen.result()
        out.append((ttft, gen.stats.prompt_tokens, gen.stats.prompt_cached))
        msgs.append({"role": "assistant", "content": gen.text})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--drafter", default="default")
    ap.add_argument("--json")
    args = ap.parse_args()
    runs: dict[str, list] = {"reuse": [], "fresh": []}
    with EdgeEagle(drafter=args.drafter, k="auto", n_ctx=4096) as ee:
        for r in range(args.rounds):
            for mode in (("reuse", "fresh") if r % 2 == 0 else ("fresh", "reuse")):
                runs[mode].append(conversation(ee, args.turns, args.max_tokens, mode == "fresh"))
    turns = []
    for i in range(args.turns):
        reuse = [run[i][0] for run in runs["reuse"]]
        fresh = [run[i][0] for run in runs["fresh"]]
        ratios = [f / u for f, u in zip(fresh, reuse)]
        turns.append({"turn": i + 1, "prompt_tokens": runs["reuse"][0][i][1], "cached": runs["reuse"][0][i][2],
                      "ttft_ms_reuse": round(1000 * statistics.median(reuse), 1),
                      "ttft_ms_fresh": round(1000 * statistics.median(fresh), 1),
                      "fresh_over_reuse": spread(ratios, 2)})
    report = {"cpu": cpu_name(), "rounds": args.rounds, "drafter": args.drafter, "turns": turns}
    emit_report(report, args.json, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
