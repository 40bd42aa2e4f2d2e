#!/usr/bin/env python
"""The suffix index's own costs, and what an oracle would gain from its drafts.

    python scripts/bench_suffix.py [--prompts repeat] [--limit 12] [-n 128] [--index-tokens 100000] [--json OUT]

1. Index: prompts of the shipped sets and MT-bench, tokenized by the target, indexed as
   requests until the history holds --index-tokens tokens; reported: indexing tokens/s, lookups/s
   (a tree of up to 12 nodes, 4 paths, after each appended token, as `auto` asks), index keys and
   entries, and bytes (tracemalloc's count of what the index allocated).
2. Oracle: for each prompt of --prompts, plain greedy decoding's answer; then, position by
   position, the suffix lookup `auto` would see (this prompt, earlier prompts' answers in the
   history) and how much of its tree the answer follows. An oracle that knows that takes the
   lookup, cut to the accepted path, whenever (accepted + 1) / c(accepted + 1) beats a plain
   step, with this CPU's measured c(n). Reported: its tokens per single-step cost, median over
   prompts: the most any proposer choice could gain from these drafts here.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

from edge_eagle import EdgeEagle  # noqa: E402
from edge_eagle.bench.prompts import load_prompts  # noqa: E402
from edge_eagle.fsutil import emit_report  # noqa: E402
from edge_eagle.stats import spread  # noqa: E402
from edge_eagle.suffix import SuffixIndex  # noqa: E402
from edge_eagle.system import cpu_name  # noqa: E402


def index_costs(ee: EdgeEagle, total: int) -> dict:
    texts = []
    for name in ("mtbench", "repeat", "humaneval"):
        for p in load_prompts(name):
            texts.append(ee.target.tokenize(p.text, add_special=False))
    stream, i = [], 0
    while sum(len(t) for t in stream) < total:  # the texts again and again, as a user's stream repeats itself
        stream.append(texts[i % len(texts)])
        i += 1
    tracemalloc.start()
    ix = SuffixIndex(max_tokens=total)
    t0 = time.perf_counter()
    for t in stream:
        ix.finish(t)
    index_s = time.perf_counter() - t0
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    probe = [t for text in texts[3:40:3] for t in text]  # a request quoting earlier ones: ~2,000 lookups
    gc.collect()
    t0 = time.perf_counter()
    n = 0
    for end in range(40, len(probe)):
        ix.lookup(probe[:end], 8, 12, 4)
        n += 1
    lookup_s = time.perf_counter() - t0
    st = ix.stats()
    return {"history_tokens": st["history_tokens"], "indexing_tokens_per_s": round(st["history_tokens"] / index_s),
            "lookups_per_s": round(n / lookup_s), "keys": st["keys"], "entries": st["entries"],
            "bytes": held, "bytes_per_token": round(held / st["history_tokens"], 1)}


def oracle(ee: EdgeEagle, prompts, n: int, c: dict[int, float]) -> list[float]:
    ix = SuffixIndex()
    ratios = []
    for p in tqdm(prompts, desc="oracle", file=sys.stderr):
        ids = ee.target.tokenize(ee.apply_chat_template([{"role": "user", "content": p.text}]), add_special=False)
        out = ee.generate(ids, max_tokens=n, speculative=False, history=False).result().tokens
        tokens, cost, t = 0, 0.0, 0
        while t < len(out):
            # committed: ids + out[:t]; the drafts guess out[t:], and the cycle adds a bonus token
            d = ix.lookup(ids + out[:t], 8, 12, 4)
            acc = min(_accepted(d.proposal, out[t:]), len(out) - t - 1) if len(d.proposal) else 0
            if acc and (acc + 1) / c.get(acc + 1, acc + 1) > 1.0:
                tokens, cost, t = tokens + acc + 1, cost + c.get(acc + 1, acc + 1), t + acc + 1
            else:
                tokens, cost, t = tokens + 1, cost + 1.0, t + 1
        ix.finish(ids + out)
        ratios.append(tokens / cost if cost else 1.0)
    return ratios


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
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--index-tokens", type=int, default=100_000)
    ap.add_argument("--json")
    args = ap.parse_args()
    with EdgeEagle(None, None, n_ctx=4096) as ee:
        index = index_costs(ee, args.index_tokens)
        costs = ee.calibrate(use_cache=True)
        c = {m: costs.c(m) for m in range(1, 18)}
        ratios = oracle(ee, load_prompts(args.prompts, args.limit), args.n, c)
    report = {"cpu": cpu_name(), "command": "python scripts/bench_suffix.py " + " ".join(sys.argv[1:]),
              "index": index, "c": {m: round(v, 3) for m, v in c.items()},
              "oracle": {"prompts": args.prompts, "count": len(ratios), **spread(ratios)}}
    emit_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
