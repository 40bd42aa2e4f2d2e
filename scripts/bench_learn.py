#!/usr/bin/env python
"""What adapting the drafter to a user's requests gains: a stream of requests from one domain
kept with --learn, one `learn adapt`, then acceptance on unseen prompts of the domain.

    python scripts/bench_learn.py [--domain humaneval|gsm8k] [--stream 60] [--unseen 24] [-n 128]
                                  [--steps 120] [--minutes 30] [--batch-rows 256] [--k 5] [--tree 7]
                                  [--mtbench 20] [--json OUT]

1. Stream: the domain's first --stream prompts (chat-formatted), answered greedily with `auto`
   by the default target and shipped drafter with learn=True, into a fresh store (a temporary
   $EDGE_EAGLE_LEARN_DIR; nothing touches the user's own).
2. Adapt: learn.run.adapt_store, as `edge-eagle learn adapt` runs it (held-out newest fifth,
   general set of 16 MT-bench answers, 32 more replayed in training), bounded by --steps and
   --minutes; reported: simulated tau before and after, the curve of held-out and general tau
   against answer tokens trained on, wall and CPU seconds (CPU-seconds per 1,000 learned
   tokens: the adaptation's process CPU time per 1,000 answer tokens of the user's requests).
3. Measure: the domain's last --unseen prompts (never in the stream) and the last --mtbench
   MT-bench first turns (the general set and the replayed questions are the first 48), decoded
   greedily with a fixed chain of --k drafts and with a tree of --tree nodes, by the drafter
   before and after adaptation, interleaved prompt by prompt: tau, and greedy output against
   plain decoding.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

from edge_eagle import EdgeEagle, defaults  # noqa: E402
from edge_eagle.bench.prompts import load_prompts  # noqa: E402
from edge_eagle.fsutil import emit_report  # noqa: E402
from edge_eagle.learn import LearnStore, store_dir  # noqa: E402
from edge_eagle.learn.adapt import AdaptOptions  # noqa: E402
from edge_eagle.learn.run import adapt_store  # noqa: E402
from edge_eagle.system import cpu_name  # noqa: E402


def chat_ids(ee: EdgeEagle, text: str) -> list[int]:
    return ee.target.tokenize(ee.apply_chat_template([{"role": "user", "content": text}]), add_special=False)


def measure(drafters: dict[str, Path | None], prompts: list[str], n: int, k: int, tree: int, desc: str) -> dict:
    """tau per drafter (chain of k, tree of `tree`), greedy, interleaved per prompt; equality with plain."""
    engines = {name: EdgeEagle(None, path or "none", n_ctx=2048) for name, path in drafters.items()}
    plain = EdgeEagle(None, "none", n_ctx=2048)
    taus: dict[str, list[float]] = {f"{name} {mode}": [] for name in drafters for mode in ("chain", "tree")}
    equal = dict.fromkeys(taus, 0)
    try:
        for text in tqdm(prompts, desc=desc, file=sys.stderr):
            ids = chat_ids(plain, text)
            ref = plain.generate(ids, max_tokens=n, speculative=False, history=False).result().tokens
            for name, ee in engines.items():
                for mode, kw in (("chain", {"k": k}), ("tree", {"tree": tree})):
                    g = ee.generate(ids, max_tokens=n, history=False, **kw).result()
                    taus[f"{name} {mode}"].append(g.stats.tau)
                    equal[f"{name} {mode}"] += g.tokens == ref
    finally:
        for ee in [*engines.values(), plain]:
            ee.close()
    return {key: {"tau": round(statistics.mean(v), 4), "equal_plain": f"{equal[key]}/{len(prompts)}"}
            for key, v in taus.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--domain", default="humaneval", choices=["humaneval", "gsm8k"])
    ap.add_argument("--stream", type=int, default=60)
    ap.add_argument("--unseen", type=int, default=24)
    ap.add_argument("-n", type=int, default=128, help="answer tokens per streamed request")
    ap.add_argument("--eval-n", type=int, default=96, help="tokens per measured prompt")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--batch-rows", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--tree", type=int, default=7)
    ap.add_argument("--mtbench", type=int, default=20)
    ap.add_argument("--general-prompts", type=int, default=16)
    ap.add_argument("--replay-prompts", type=int, default=32)
    ap.add_argument("--json")
    args = ap.parse_args()

    prompts = [p.text for p in load_prompts(args.domain)]
    if args.stream + args.unseen > len(prompts):
        raise SystemExit(f"{args.domain} has {len(prompts)} prompts; ask for fewer --stream and --unseen.")
    stream, unseen = prompts[:args.stream], prompts[-args.unseen:]
    base = defaults.default_drafter()
    target = defaults.default_target()
    assert base is not None, "the shipped drafter is missing"
    work = Path(tempfile.mkdtemp(prefix="bench-learn-"))
    os.environ["EDGE_EAGLE_LEARN_DIR"] = str(work / "learn")

    t0 = time.perf_counter()
    with EdgeEagle(learn=True, n_ctx=2048) as ee:
        for text in tqdm(stream, desc="stream", file=sys.stderr):
            ee.generate(chat_ids(ee, text), max_tokens=args.n, history=False).result()
    stream_s = time.perf_counter() - t0
    store = LearnStore(store_dir(target, base))

    cpu0, t0 = time.process_time(), time.perf_counter()
    report = adapt_store(target, base, store, AdaptOptions(steps=args.steps, minutes=args.minutes, lr=args.lr,
                                                           batch_rows=args.batch_rows),
                         general_prompts=args.general_prompts, replay_prompts=args.replay_prompts,
                         out=work / "adapted.gguf",
                         log=lambda s: print(s, file=sys.stderr))
    adapt_cpu, adapt_wall = time.process_time() - cpu0, time.perf_counter() - t0
    adapted = Path(report["written"]) if report["written"] else None
    drafters: dict[str, Path | None] = {"before": base}
    if adapted is not None:
        drafters["after"] = adapted
    domain = measure(drafters, unseen, args.eval_n, args.k, args.tree, "unseen")
    mtbench = [p.text for p in load_prompts("mtbench")][-args.mtbench:] if args.mtbench else []
    general = measure(drafters, mtbench, args.eval_n, args.k, args.tree, "mtbench") if mtbench else {}
    out = {"cpu": cpu_name(), "command": "python scripts/bench_learn.py " + " ".join(sys.argv[1:]),
           "domain": args.domain, "stream_requests": len(stream), "stream_s": round(stream_s, 1),
           "adapt": report, "adapt_wall_s": round(adapt_wall, 1), "adapt_cpu_s": round(adapt_cpu, 1),
           "cpu_s_per_1k_learned_tokens": round(adapt_cpu / max(1, report["train_tokens"]) * 1000, 2),
           "unseen": domain, "mtbench": general}
    emit_report(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
