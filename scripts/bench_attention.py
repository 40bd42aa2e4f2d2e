#!/usr/bin/env python
"""llama.cpp's flash attention on against off: plain decoding and `auto`, interleaved on the same prompts.

    python scripts/bench_attention.py [--prompts agent] [--limit 8] [--every 1] [-n 128] [--n-ctx 2048]
                                       [--rounds 1] [--json OUT]
    python scripts/bench_attention.py --switches 40 [--n-ctx 2048] [--json OUT]

Two engines, the same target and drafter, one with flash attention on and one off. For each
prompt (chat-formatted and cut to the window as `edge-eagle bench` does), plain decoding and
`auto` run on both, in rotating order, --rounds times (a prompt's ratio is the median of its
rounds). Reported: speed ratios as median, quartiles and min-max over prompts, and how many
greedy answers are the same text. No request joins the suffix history.

--switches N: instead, what one switch of the routed setting (auto on the CPU) costs: an engine
with the default target and drafter switches between on and off N times
(EdgeEagle.route_attention: both contexts made again, their cached cells moved across); the
milliseconds per switch. Then the first token of a chat turn that crosses the threshold, against
an engine fixed on.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

from edge_eagle.bench.options import BenchOptions  # noqa: E402
from edge_eagle.bench.prompts import load_prompts  # noqa: E402
from edge_eagle.bench.runners import EngineRunner  # noqa: E402
from edge_eagle.bench.suite import Bench  # noqa: E402
from edge_eagle.bench.summary import spread  # noqa: E402
from edge_eagle.fsutil import emit_report  # noqa: E402
from edge_eagle.system import cpu_name  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", default="agent")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json")
    ap.add_argument("--switches", type=int, default=0)
    args = ap.parse_args()
    if args.switches:
        return switch_cost(args)
    prompts = load_prompts(args.prompts, args.limit, args.every)
    benches = {}
    try:
        for fa in ("on", "off"):
            benches[fa] = Bench(BenchOptions(prompts=args.prompts, max_tokens=args.n, n_ctx=args.n_ctx, ks=[],
                                             upstream=False, prompt_lookup_k=None, memory=False, flash_attn=fa))
        runners = [(fa, kind, EngineRunner(b.engines[0], k, history=False))
                   for fa, b in benches.items() for kind, k in (("plain", None), ("auto", "auto"))]
        warm_tokens, _ = benches["on"].prompt_tokens(prompts[0])
        for _, _, r in runners:  # load, calibrate and warm each engine before anything is timed
            r.run(warm_tokens, "", 16)
        speed: dict[tuple[str, str], list[float]] = {(fa, kind): [] for fa, kind, _ in runners}
        same = {"plain off = plain on": 0, "auto on = plain on": 0, "auto off = plain off": 0}
        lengths = []
        for i, p in enumerate(tqdm(prompts, desc="prompts", file=sys.stderr)):
            tokens, text = benches["on"].prompt_tokens(p)
            lengths.append(len(tokens))
            per: dict[tuple[str, str], list[float]] = {key: [] for key in speed}
            texts: dict[tuple[str, str], str] = {}
            for r in range(args.rounds):
                turn = (i + r) % len(runners)
                for fa, kind, runner in runners[turn:] + runners[:turn]:
                    res = runner.run(tokens, text, args.n)
                    per[(fa, kind)].append(res.tokens_per_second)
                    texts[(fa, kind)] = res.text
            for key in speed:
                speed[key].append(statistics.median(per[key]))
            same["plain off = plain on"] += texts[("off", "plain")] == texts[("on", "plain")]
            same["auto on = plain on"] += texts[("on", "auto")] == texts[("on", "plain")]
            same["auto off = plain off"] += texts[("off", "auto")] == texts[("off", "plain")]
    finally:
        for b in benches.values():
            b.close()

    def ratio(a: tuple[str, str], b: tuple[str, str]) -> dict[str, float | None]:
        return spread([x / y for x, y in zip(speed[a], speed[b])])

    out = {"cpu": cpu_name(), "command": "python scripts/bench_attention.py " + " ".join(sys.argv[1:]),
           "prompts": len(prompts), "prompt_tokens_median": statistics.median(lengths),
           "prompt_tokens_max": max(lengths), "rounds": args.rounds, "max_tokens": args.n,
           "plain: off / on": ratio(("off", "plain"), ("on", "plain")),
           "auto: off / on": ratio(("off", "auto"), ("on", "auto")),
           "auto / plain, on": ratio(("on", "auto"), ("on", "plain")),
           "auto / plain, off": ratio(("off", "auto"), ("off", "plain")),
           "auto off / plain on": ratio(("off", "auto"), ("on", "plain")),
           "same greedy text": same}
    emit_report(out, args.json)
    return 0


def switch_cost(args: argparse.Namespace) -> int:
    import time

    from edge_eagle import EdgeEagle
    from edge_eagle.system import FLASH_ATTN_OFF_FROM

    with EdgeEagle(n_ctx=args.n_ctx) as engine:
        if not engine.target.flash_attn.routed:
            raise SystemExit("flash attention is not routed here (attention runs on a GPU); nothing to measure.")
        times = []
        for i in tqdm(range(args.switches), desc="switches", file=sys.stderr):
            t0 = time.perf_counter()
            engine.route_attention(0 if i % 2 else FLASH_ATTN_OFF_FROM)
            times.append((time.perf_counter() - t0) * 1e3)
        assert engine.attention_switches == args.switches
    # a chat whose prompt passes FLASH_ATTN_OFF_FROM: its turn's first token, after the turn before
    # it was cached, on a routed engine (the switch moves the cached cells into the new contexts)
    # against one fixed on (no switch); both read only the new part
    words = [f"word{i}" for i in range(1000)]
    ttft: dict[str, list[float]] = {"auto": [], "on": []}
    with EdgeEagle(n_ctx=args.n_ctx) as routed, EdgeEagle(n_ctx=args.n_ctx, flash_attn="on") as fixed:
        text = routed.target.tokenize(" ".join(words))
        first, grown = text[:300], text[:FLASH_ATTN_OFF_FROM + 100]
        assert len(first) < FLASH_ATTN_OFF_FROM <= len(grown) and grown[:len(first)] == first
        for i in tqdm(range(5), desc="chat turns", file=sys.stderr):
            for name, eng in ((("auto", routed), ("on", fixed)) if i % 2 else (("on", fixed), ("auto", routed))):
                eng.route_attention(0)
                eng.generate(first, max_tokens=1).result()  # the turn before: cached
                t0 = time.perf_counter()
                eng.generate(grown, max_tokens=1).result()
                ttft[name].append((time.perf_counter() - t0) * 1e3)
    out = {"cpu": cpu_name(), "command": "python scripts/bench_attention.py " + " ".join(sys.argv[1:]),
           "n_ctx": args.n_ctx, "switches": args.switches, "ms_per_switch": spread(times),
           "crossing turn": {"cached tokens": len(first), "prompt tokens": len(grown),
                             "first token ms, auto (switch, cells moved)": spread(ttft["auto"]),
                             "first token ms, on (no switch)": spread(ttft["on"])}}
    emit_report(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
