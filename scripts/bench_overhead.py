#!/usr/bin/env python
"""Host-side overhead of the speculative loop: the share of each draft/verify cycle spent
outside llama.cpp's compute calls (Python, ctypes batch building, copies, argmax, the
EAGLE-3.1 host norms, bookkeeping).

    python scripts/bench_overhead.py [--drafter PATH] [--k 1 3 5] [--rounds 3] [--tau T] [--json]

It times every llama_decode / llama_process call (the native compute) and the whole
generation loop (SpecStats.t_total, which excludes the consumer); overhead = loop - native,
reported in microseconds per cycle and as a share. The --json output has a top-level
`overhead_us_per_cycle` keyed by k (medians). The projection carries the measured overhead
into the cost model for memory-bound hardware at target step times of 2, 8 and 30 ms. Without --drafter it writes an untrained SmolLM2-sized EAGLE-3.1 drafter
(the trainer's initialisation; p_min 0, so every cycle runs the full k-step chain). Prompts run
interleaved over rounds; medians and spread are reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llama_cpp import llama_cpp as C  # noqa: E402

from edge_eagle import EdgeEagle  # noqa: E402
from edge_eagle.defaults import default_target  # noqa: E402

PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain how a hash table works, with an example in Python.",
    "What are the main causes of the French Revolution?",
    "Give me a recipe for pancakes.",
]

_native = [0.0]


def _timed(fn):
    def wrapper(*args):
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            _native[0] += time.perf_counter() - t0
    return wrapper


def random_drafter(out_dir: Path) -> Path:
    """An untrained SmolLM2-sized EAGLE-3.1 drafter: the trainer's initialisation, converted."""
    import numpy as np

    from edge_eagle.converters import convert
    from edge_eagle.gguf_file import read_gguf
    from edge_eagle.train import TrainOptions, save_checkpoint
    from edge_eagle.train.pipeline import init_model

    target = read_gguf(default_target())
    n = int(target.get("{arch}.block_count"))
    model = init_model(target, (2, n // 2, n - 3), np.arange(8192, dtype=np.int64),
                       TrainOptions(draft_vocab=8192, seed=11))
    save_checkpoint(model, out_dir / "ckpt", target, {})
    return convert(out_dir / "ckpt", default_target(), out_dir / "random-eagle31.gguf", outtype="f16",
                   log=lambda m: None).output


def project(tau: float, k: int, d: float, overhead_us: float, step_ms: float) -> float:
    """Speedup over plain decoding on memory-bound hardware (a verify batch costs one step),
    host overhead included: tau tokens per cycle of step + k d step + overhead, against one
    token per step (plain decoding's own host cost is left out: a conservative projection)."""
    step_us = 1000.0 * step_ms
    return tau / ((step_us * (1.0 + k * d) + overhead_us) / step_us)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--drafter", help="eagle3 GGUF (default: an untrained SmolLM2-sized EAGLE-3.1 drafter)")
    ap.add_argument("--k", type=int, nargs="+", default=[1, 3, 5])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=96, help="tokens per generation")
    ap.add_argument("--tau", type=float, default=None,
                    help="acceptance length for the projection (default: 1 + k * 0.8, a good drafter)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from edge_eagle.stats import spread
    from edge_eagle.system import cpu_name

    C.llama_decode = _timed(C.llama_decode)
    C.llama_process = _timed(C.llama_process)
    runs: dict[int, dict[str, list[float]]] = {k: {"share": [], "us": [], "cycle_ms": [], "d": []} for k in args.k}
    with tempfile.TemporaryDirectory() as tmp:
        drafter = args.drafter or random_drafter(Path(tmp))
        with EdgeEagle(None, drafter, k=args.k[0], n_ctx=2048) as ee:
            ee.chat([{"role": "user", "content": "warm up"}], max_tokens=8).result()
            for r in range(args.rounds):
                for prompt in PROMPTS:
                    for k in args.k[r % len(args.k):] + args.k[:r % len(args.k)]:  # interleaved, rotating
                        _native[0] = 0.0
                        gen = ee.chat([{"role": "user", "content": prompt}], max_tokens=args.n, k=k)
                        gen.result()
                        s = gen.stats
                        loop = s.t_total  # the loop only; prefill's decode is outside it
                        native_in_loop = _native[0] - s.t_prefill
                        steps = max(1, s.verify_steps)
                        runs[k]["share"].append(1.0 - native_in_loop / loop)
                        runs[k]["us"].append(1e6 * (loop - native_in_loop) / steps)
                        runs[k]["cycle_ms"].append(1000 * loop / steps)
                        runs[k]["d"].append(s.draft_cost_per_verify)
                print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                    f"k={k} {runs[k]['us'][-1]:.0f} us" for k in args.k), file=sys.stderr)
    per_k = {}
    for k in args.k:
        us = statistics.median(runs[k]["us"])
        d = statistics.median(runs[k]["d"])
        tau = args.tau if args.tau is not None else 1.0 + 0.8 * k
        per_k[str(k)] = {
            "overhead_us_per_cycle": spread(runs[k]["us"], 1), "host_overhead_share": spread(runs[k]["share"], 4),
            "cycle_ms": spread(runs[k]["cycle_ms"], 2), "d": round(d, 3),
            "projected_memory_bound_speedup": {f"{ms}ms": {"tau": tau, "with_overhead": round(project(tau, k, d, us, ms), 3),
                                                           "without": round(project(tau, k, d, 0.0, ms), 3)}
                                               for ms in (2, 8, 30)}}
    result = {"cpu": cpu_name(), "drafter": str(drafter if args.drafter else "untrained SmolLM2-sized EAGLE-3.1"),
              "runs_per_k": len(runs[args.k[0]]["us"]),
              "overhead_us_per_cycle": {k: v["overhead_us_per_cycle"]["median"] for k, v in per_k.items()},
              "per_k": per_k}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for k, v in per_k.items():
            o, sh = v["overhead_us_per_cycle"], v["host_overhead_share"]
            proj = ", ".join(f"{ms}: {p['with_overhead']:.2f}x (no overhead {p['without']:.2f}x)"
                             for ms, p in v["projected_memory_bound_speedup"].items())
            print(f"k={k}: host overhead {o['median']:.0f} us per cycle ({o['min']:.0f}-{o['max']:.0f}), "
                  f"{sh['median']:.2%} of a {v['cycle_ms']['median']:.1f} ms cycle; projected on memory-bound "
                  f"hardware at tau {v['projected_memory_bound_speedup']['2ms']['tau']:.1f} per target step {proj}")
        print(f"({result['cpu']}, {result['runs_per_k']} runs per k, interleaved)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
