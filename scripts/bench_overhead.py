#!/usr/bin/env python
"""Host-side overhead of the speculative loop: the share of each draft/verify cycle spent
outside llama.cpp's compute calls (Python, ctypes batch building, copies, argmax, the
EAGLE-3.1 host norms, bookkeeping).

    python scripts/bench_overhead.py [--drafter PATH] [--k 4] [--rounds 5] [--json]

It times every llama_decode / llama_process call (the native compute) and the whole
generation loop (SpecStats.t_total, which excludes the consumer); overhead share =
1 - native / loop. Without --drafter it writes an untrained SmolLM2-sized EAGLE-3.1 drafter
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--drafter", help="eagle3 GGUF (default: an untrained SmolLM2-sized EAGLE-3.1 drafter)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-n", type=int, default=96, help="tokens per generation")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    C.llama_decode = _timed(C.llama_decode)
    C.llama_process = _timed(C.llama_process)
    with tempfile.TemporaryDirectory() as tmp:
        drafter = args.drafter or random_drafter(Path(tmp))
        shares, cycle_ms = [], []
        with EdgeEagle(None, drafter, k=args.k, n_ctx=2048) as ee:
            ee.chat([{"role": "user", "content": "warm up"}], max_tokens=8).result()
            for r in range(args.rounds):
                for prompt in PROMPTS:
                    _native[0] = 0.0
                    gen = ee.chat([{"role": "user", "content": prompt}], max_tokens=args.n)
                    gen.result()
                    native_loop = _native[0] - 0.0
                    s = gen.stats
                    # prefill's decode is outside t_total; remove it from native time
                    loop = s.t_total
                    native_in_loop = native_loop - s.t_prefill
                    shares.append(1.0 - native_in_loop / loop)
                    cycle_ms.append(1000 * loop / max(1, s.verify_steps))
                    print(f"round {r + 1}/{args.rounds}: overhead {shares[-1]:.2%}", file=sys.stderr)
    q = statistics.quantiles(shares, n=4)
    result = {
        "drafter": str(drafter if args.drafter else "untrained SmolLM2-sized EAGLE-3.1"),
        "k": args.k, "runs": len(shares),
        "host_overhead_share": {"median": statistics.median(shares), "p25": q[0], "p75": q[2],
                                "min": min(shares), "max": max(shares)},
        "cycle_ms_median": statistics.median(cycle_ms),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        h = result["host_overhead_share"]
        print(f"host overhead: median {h['median']:.2%} (IQR {h['p25']:.2%}-{h['p75']:.2%}, "
              f"min {h['min']:.2%}, max {h['max']:.2%}) of a {result['cycle_ms_median']:.1f} ms cycle, "
              f"k={args.k}, {len(shares)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
