#!/usr/bin/env python
"""What adapting the drafter to a user's requests gains: a stream of requests from one domain
kept with --learn, one `learn adapt`, then acceptance on unseen prompts of the domain.

    python scripts/bench_learn.py [--domain humaneval|gsm8k] [--stream 60] [--unseen 24] [-n 128]
                                  [--steps 900] [--minutes 30] [--batch-rows 256] [--k 5] [--tree 7]
                                  [--mtbench 24] [--vocab-swap N] [--stream-cache DIR]
                                  [--no-measure] [--json OUT]

1. Stream: the domain's first --stream prompts (chat-formatted), answered greedily with `auto`
   by the default target and shipped drafter with learn=True, into a fresh store (a temporary
   $EDGE_EAGLE_LEARN_DIR; nothing touches the user's own).
2. Adapt: learn.run.adapt_store, as `edge-eagle learn adapt` runs it (held-out newest fifth,
   general set of 24 MT-bench answers, 32 more replayed in training), bounded by --steps and
   --minutes; reported: simulated tau before and after, the curve of held-out and general tau
   against answer tokens trained on, wall and CPU seconds (CPU-seconds per 1,000 learned
   tokens: the adaptation's process CPU time per 1,000 answer tokens of the user's requests).
3. Measure: the domain's last --unseen prompts (never in the stream) and the last --mtbench
   MT-bench first turns taken from its categories in turn (the general set and the replayed
   questions are the first 56 in that order: 7 of each category), decoded
   greedily with a fixed chain of --k drafts and with a tree of --tree nodes, by the drafter
   before and after adaptation, interleaved prompt by prompt: tau, and greedy output against
   plain decoding. The adaptation's history also scores these prompts (simulated decoding tau,
   never used for choosing): the curve of tau on unseen prompts against learned tokens.
   --no-measure leaves this step out: the curve's simulated tau on the unseen prompts (which
   follows the measured chain's within about 0.01 at the chosen step) is then the result, for
   comparing adaptation settings on one stream. --stream-cache DIR keeps the stream's store
   (its requests, the general set and the sampled answers, no adapted versions) in DIR and
   starts from it when DIR holds one, so such runs share the same stream.
4. Latency (--latency N): time to first token of N requests (the unseen prompts in turn, 16
   tokens, a --gap of idle seconds before each) through a library engine with learn=True whose
   background adaptation (learn/idle.py, the child serve --learn runs) trains on the store
   throughout, against the same engine with the adaptation held stopped (IdleAdapter.hold),
   interleaved request by request in a shuffled order; before the child starts and after it
   ends, N/2 requests each with no child at all (learning off).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

from edge_eagle import EdgeEagle, defaults  # noqa: E402
from edge_eagle.bench.prompts import by_category_in_turn, load_prompts  # noqa: E402
from edge_eagle.fsutil import emit_report  # noqa: E402
from edge_eagle.learn import LearnStore, store_dir  # noqa: E402
from edge_eagle.learn.adapt import AdaptOptions  # noqa: E402
from edge_eagle.learn.run import adapt_store  # noqa: E402
from edge_eagle.system import cpu_name  # noqa: E402


def chat_ids(ee: EdgeEagle, text: str) -> list[int]:
    return ee.target.tokenize(ee.apply_chat_template([{"role": "user", "content": text}]), add_special=False)


def plain_answers(prompts: list[str], n: int) -> dict[str, tuple[list[int], list[int]]]:
    """Each prompt's chat-formatted ids and the target's greedy answer (plain decoding)."""
    with EdgeEagle(None, "none", n_ctx=2048) as plain:
        out = {}
        for text in tqdm(prompts, desc="plain answers", file=sys.stderr):
            ids = chat_ids(plain, text)
            out[text] = (ids, plain.generate(ids, max_tokens=n, speculative=False, history=False).result().tokens)
        return out


def measure(drafters: dict[str, Path | None], prompts: list[str], n: int, k: int, tree: int, desc: str) -> dict:
    """tau per drafter (chain of k, tree of `tree`), greedy, interleaved per prompt; equality with plain.
    tau is tokens per verification cycle over all the prompts' tokens (as decoding reports it),
    and tau_mean its mean over prompts."""
    refs = plain_answers(prompts, n)
    engines = {name: EdgeEagle(None, path or "none", n_ctx=2048) for name, path in drafters.items()}
    taus: dict[str, list[float]] = {f"{name} {mode}": [] for name in drafters for mode in ("chain", "tree")}
    cycles = {key: [0, 0] for key in taus}  # accepted drafts, verification cycles
    equal = dict.fromkeys(taus, 0)
    try:
        for text in tqdm(prompts, desc=desc, file=sys.stderr):
            ids, ref = refs[text]
            for name, ee in engines.items():
                for mode, kw in (("chain", {"k": k}), ("tree", {"tree": tree})):
                    g = ee.generate(ids, max_tokens=n, history=False, **kw).result()
                    key = f"{name} {mode}"
                    taus[key].append(g.stats.tau)
                    cycles[key][0] += g.stats.accepted
                    cycles[key][1] += g.stats.to_dict()["verify_steps"]
                    equal[key] += g.tokens == ref
    finally:
        for ee in engines.values():
            ee.close()
    return {key: {"tau": round(1 + cycles[key][0] / max(1, cycles[key][1]), 4),
                  "tau_mean": round(statistics.mean(v), 4), "equal_plain": f"{equal[key]}/{len(prompts)}"}
            for key, v in taus.items()}


def latency(prompts: list[str], n: int, gap: float, seed: int = 0) -> dict:
    """Time to first token with the background adaptation training, held, and absent (see above)."""
    import random

    rng = random.Random(seed)
    times: dict[str, list[float]] = {"off": [], "held": [], "training": []}
    ee = EdgeEagle(learn=True, learn_idle=1.0, learn_min_new=10**9, n_ctx=2048)
    adapter = ee.adapter
    assert adapter is not None, "no background adaptation here (it needs SIGSTOP and the shipped drafter)"
    adapter.steps, adapter.minutes = 10**6, 600.0  # it trains throughout
    turn = iter(range(10**9))

    def ask(kind: str) -> None:
        text = prompts[next(turn) % len(prompts)]
        t0 = time.perf_counter()
        gen = ee.generate(chat_ids(ee, text), max_tokens=16, history=False)
        next(iter(gen))
        times[kind].append(time.perf_counter() - t0)
        gen.result()

    bar = tqdm(total=3 * n, desc="latency", file=sys.stderr)
    try:
        for _ in range(n // 2):  # learning off: no child yet
            time.sleep(gap)
            ask("off")
            bar.update()
        adapter.min_new = 0
        deadline = time.monotonic() + 120
        while adapter.state != "training":
            if time.monotonic() > deadline:
                raise SystemExit("the background adaptation did not start within 2 minutes; see adapt.log in the store")
            time.sleep(0.1)
        order = ["held", "training"] * n
        for i in range(0, len(order), 2):
            order[i:i + 2] = rng.sample(order[i:i + 2], 2)
        trained = 0
        for kind in order:
            adapter.hold(kind == "held")
            time.sleep(gap)
            if kind == "training":
                trained += adapter.state == "training"  # the child ran up to this request
            else:
                adapter.hold(False)  # the request itself stops the child before it can resume
            ask(kind)
            bar.update()
        adapter.close()  # learning off again: no child
        for _ in range(n - n // 2):
            time.sleep(gap)
            ask("off")
            bar.update()
    finally:
        bar.close()
        ee.close()

    def pct(v: list[float], q: float) -> float:
        v = sorted(v)
        return v[min(len(v) - 1, int(q * len(v)))]

    out: dict = {"requests_each": n, "gap_s": gap, "training_when_asked": f"{trained}/{n}"}
    for kind, v in times.items():
        out[kind] = {"p50_ms": round(1e3 * statistics.median(v), 1), "p99_ms": round(1e3 * pct(v, 0.99), 1),
                     "n": len(v)}
    for q in ("p50_ms", "p99_ms"):
        out[f"training_over_held_{q[:3]}"] = round(out["training"][q] / out["held"][q], 3)
        out[f"training_over_off_{q[:3]}"] = round(out["training"][q] / out["off"][q], 3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--domain", default="humaneval", choices=["humaneval", "gsm8k"])
    ap.add_argument("--stream", type=int, default=60)
    ap.add_argument("--unseen", type=int, default=24)
    ap.add_argument("-n", type=int, default=128, help="answer tokens per streamed request")
    ap.add_argument("--eval-n", type=int, default=96, help="tokens per measured prompt")
    ap.add_argument("--steps", type=int, default=900)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--batch-rows", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--lr-final", type=float, default=AdaptOptions.lr_final,
                    help="the learning rate at the last step as a share of --lr (cosine; 1: constant)")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--tree", type=int, default=7)
    ap.add_argument("--mtbench", type=int, default=24)
    ap.add_argument("--general-prompts", type=int, default=24)
    ap.add_argument("--replay-prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=4, help="answers sampled per training prompt (learn adapt's)")
    ap.add_argument("--latency", type=int, default=0, help="time to first token of this many requests per "
                    "condition with the background adaptation training, held, and off (0: not measured)")
    ap.add_argument("--gap", type=float, default=3.0, help="idle seconds before each --latency request")
    ap.add_argument("--vocab-swap", type=int, default=0, help="draft-vocabulary entries that may follow the stream")
    ap.add_argument("--stream-cache", type=Path, help="keep the stream's store here, and start from it when it exists")
    ap.add_argument("--no-measure", action="store_true", help="simulated tau only: skip the measured decoding")
    ap.add_argument("--json")
    args = ap.parse_args()

    prompts = [p.text for p in load_prompts(args.domain)]
    if args.stream + args.unseen > len(prompts):
        raise SystemExit(f"{args.domain} has {len(prompts)} prompts; ask for fewer --stream and --unseen.")
    if args.general_prompts + args.replay_prompts + args.mtbench > 80:
        raise SystemExit("MT-bench has 80 questions; ask for fewer --general-prompts, --replay-prompts and --mtbench.")
    stream, unseen = prompts[:args.stream], prompts[-args.unseen:]
    base = defaults.default_drafter()
    target = defaults.default_target()
    assert base is not None, "the shipped drafter is missing"
    work = Path(tempfile.mkdtemp(prefix="bench-learn-"))
    os.environ["EDGE_EAGLE_LEARN_DIR"] = str(work / "learn")

    t0 = time.perf_counter()
    folder = store_dir(target, base)
    cached = args.stream_cache / folder.name if args.stream_cache else None
    if cached is not None and cached.is_dir():
        shutil.copytree(cached, folder)
    else:
        with EdgeEagle(learn=True, learn_idle=0, n_ctx=2048) as ee:  # this script runs the adaptation itself
            for text in tqdm(stream, desc="stream", file=sys.stderr):
                ee.generate(chat_ids(ee, text), max_tokens=args.n, history=False).result()
    stream_s = time.perf_counter() - t0
    store = LearnStore(folder)
    watch = list(plain_answers(unseen, args.eval_n).values())  # the curve: tau on unseen prompts while learning

    cpu0, t0 = time.process_time(), time.perf_counter()
    opts = AdaptOptions(steps=args.steps, minutes=args.minutes, lr=args.lr, lr_final=args.lr_final,
                        batch_rows=args.batch_rows, samples=args.samples, vocab_swap=args.vocab_swap)
    report = adapt_store(target, base, store, opts,
                         general_prompts=args.general_prompts, replay_prompts=args.replay_prompts,
                         out=work / "adapted.gguf", watch=watch,
                         log=lambda s: print(s, file=sys.stderr))
    adapt_cpu, adapt_wall = time.process_time() - cpu0, time.perf_counter() - t0
    if cached is not None and not cached.is_dir():
        shutil.copytree(folder, cached, ignore=shutil.ignore_patterns("versions", "current.json", "*.npz"))
    adapted = Path(report["written"]) if report["written"] else None
    drafters: dict[str, Path | None] = {"before": base}
    if adapted is not None:
        drafters["after"] = adapted
    domain = {} if args.no_measure else measure(drafters, unseen, args.eval_n, args.k, args.tree, "unseen")
    mtbench = [p.text for p in by_category_in_turn(load_prompts("mtbench"))][-args.mtbench:] \
        if args.mtbench and not args.no_measure else []
    general = measure(drafters, mtbench, args.eval_n, args.k, args.tree, "mtbench") if mtbench else {}
    out = {"cpu": cpu_name(), "command": "python scripts/bench_learn.py " + " ".join(sys.argv[1:]),
           "domain": args.domain, "stream_requests": len(stream), "stream_s": round(stream_s, 1),
           "adapt": report, "adapt_wall_s": round(adapt_wall, 1), "adapt_cpu_s": round(adapt_cpu, 1),
           "cpu_s_per_1k_learned_tokens": round(adapt_cpu / max(1, report["train_tokens"]) * 1000, 2),
           "curve": [{"tokens_seen": h["tokens_seen"], "heldout_tau": h["tau"], "unseen_tau": h["watch"]}
                     for h in report["history"]],
           "unseen": domain, "mtbench": general}
    if args.latency:
        out["latency"] = latency(unseen, args.latency, args.gap)
    emit_report(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
