#!/usr/bin/env python
"""Host-side overhead of the speculative loop: the share of each draft/verify cycle spent
outside llama.cpp's compute calls (Python, ctypes batch building, copies, argmax, the
EAGLE-3.1 host norms, bookkeeping).

    python scripts/bench_overhead.py [--target PATH] [--drafter PATH] [--gpu-layers N] [--k 1 3 5] [--rounds 3]
                                     [--fastpath off|on|both] [--tau T] [--json]

It times every llama_decode / llama_process call (the native compute, including those the
native fast path makes, which it times itself), the output getters and KV edits beyond a plain ctypes call
(llama_get_logits*, the captured layer inputs and the drafter's states: they wait for the
backend and reorder outputs; llama_memory_seq_rm/cp walk the KV cells: native work a C++ loop
pays too; reported apart as sync_us), and
the whole generation loop (SpecStats.t_total, which excludes the consumer); overhead = loop -
native, reported in microseconds per cycle and as a share. --fastpath off|on|both runs the
loop without / with the native fast path (edge_eagle/_fastpath.c), interleaved. The --json output has a top-level
`overhead_us_per_cycle` keyed by k (medians). The projection carries the measured overhead
into the cost model for memory-bound hardware at target step times of 2, 8 and 30 ms. Without
--drafter it writes an untrained EAGLE-3.1 drafter sized for the target (the trainer's
initialisation; p_min 0, so every cycle runs the full k-step chain). Prompts run interleaved over
rounds; medians and spread are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llama_cpp import llama_cpp as C  # noqa: E402

from edge_eagle import (
    EdgeEagle,  # noqa: E402
    _fast,  # noqa: E402
)
from edge_eagle import _bindings as B  # noqa: E402
from edge_eagle.defaults import default_target  # noqa: E402

PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain how a hash table works, with an example in Python.",
    "What are the main causes of the French Revolution?",
    "Give me a recipe for pancakes.",
]

_native = [0.0]
_sync = [0.0]
_floor = [0.0]  # seconds of a plain ctypes call (marshalling only), measured at start


def _timed(fn, total: list[float], beyond_ctypes: bool = False):
    """fn, adding its time to total[0]; with beyond_ctypes only the time beyond a plain ctypes
    call (_floor): a getter's native work (synchronise, reorder outputs), not its marshalling."""
    def wrapper(*args):
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            total[0] += max(0.0, time.perf_counter() - t0 - (_floor[0] if beyond_ctypes else 0.0))
    return wrapper


def calibrate_ctypes_call(ctx) -> float:
    """Median seconds of a trivial llama.cpp call through ctypes (llama_n_ctx)."""
    times = []
    for _ in range(2000):
        t0 = time.perf_counter()
        C.llama_n_ctx(ctx)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# native work outside the compute calls: output getters (synchronise, reorder outputs) and KV
# cache edits (llama_memory_seq_rm walks the cells); only their time beyond a plain ctypes call counts
GETTERS = [(C, "llama_get_logits"), (C, "llama_get_logits_ith"), (B, "llama_get_embeddings_layer_inp"),
           (B, "llama_get_embeddings_nextn"), (B, "llama_get_embeddings_nextn_ith"), (C, "llama_memory_seq_rm"),
           (C, "llama_memory_seq_cp"), (C, "llama_memory_clear")]


def random_drafter(out_dir: Path, target_path: str | Path) -> Path:
    """An untrained EAGLE-3.1 drafter sized for the target: the trainer's initialisation, converted."""
    import numpy as np
    from edge_eagle.converters import convert

    from edge_eagle.gguf_file import read_gguf
    from edge_eagle.train import TrainOptions, save_checkpoint
    from edge_eagle.train.trainer import init_model

    target = read_gguf(target_path)
    n = int(target.get("{arch}.block_count"))
    model = init_model(target, (2, n // 2, n - 3), np.arange(8192, dtype=np.int64),
                       TrainOptions(draft_vocab=8192, seed=11))
    save_checkpoint(model, out_dir / "ckpt", target, {})
    return convert(out_dir / "ckpt", target_path, out_dir / "random-eagle31.gguf", outtype="f16",
                   log=lambda m: None).output


def project(tau: float, k: int, d: float, overhead_us: float, step_ms: float) -> float:
    """Speedup over plain decoding on memory-bound hardware (a verify batch costs one step),
    host overhead included: tau tokens per cycle of step + k d step + overhead, against one
    token per step (plain decoding's own host cost is left out: a conservative projection)."""
    step_us = 1000.0 * step_ms
    return tau / ((step_us * (1.0 + k * d) + overhead_us) / step_us)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", help="target GGUF (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--drafter", help="eagle3 GGUF (default: an untrained EAGLE-3.1 drafter sized for the target)")
    ap.add_argument("--gpu-layers", type=int, default=0, help="layers on the GPU, both models (-1: all)")
    ap.add_argument("--k", type=int, nargs="+", default=[1, 3, 5])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=96, help="tokens per generation")
    ap.add_argument("--tau", type=float, default=None,
                    help="acceptance length for the projection (default: 1 + k * 0.8, a good drafter)")
    ap.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: as edge-eagle picks)")
    ap.add_argument("--fastpath", choices=["off", "on", "both"], default="on",
                    help="the native fast path (edge_eagle/_fastpath.c): off, on, or both interleaved")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.fastpath]
    if True in modes and _fast.library_path() is None:
        sys.exit("The native fast path is not built; run `pip install -e .` with a C compiler, or pass --fastpath off.")

    from edge_eagle.system import cpu_name

    C.llama_decode = _timed(C.llama_decode, _native)
    C.llama_process = _timed(C.llama_process, _native)
    for mod, name in GETTERS:
        setattr(mod, name, _timed(getattr(mod, name), _sync, beyond_ctypes=True))
    keys = [(k, fast) for k in args.k for fast in modes]
    runs: dict[tuple[int, bool], dict[str, list[float]]] = {
        key: {"share": [], "us": [], "sync_us": [], "cycle_ms": [], "d": []} for key in keys}
    with tempfile.TemporaryDirectory() as tmp:
        target = args.target or default_target()
        drafter = args.drafter or random_drafter(Path(tmp), target)
        engines = {}
        for fast in modes:  # one engine per mode, both loaded before any timing
            os.environ["EDGE_EAGLE_FASTPATH"] = "1" if fast else "0"
            engines[fast] = EdgeEagle(target, drafter, k=args.k[0], n_ctx=2048, n_threads=args.threads,
                                      n_gpu_layers=args.gpu_layers)
            engines[fast].chat([{"role": "user", "content": "warm up"}], max_tokens=8).result()
        if True in engines and engines[True].drafter.native is None:
            sys.exit("The fast-path engine did not load the native fast path; check `pip install -e .`.")
        _floor[0] = calibrate_ctypes_call(engines[modes[0]].target.ctx)
        lib = _fast.load()
        try:
            for r in range(args.rounds):
                for prompt in PROMPTS:
                    for k, fast in keys[r % len(keys):] + keys[:r % len(keys)]:  # interleaved, rotating
                        _native[0] = _sync[0] = 0.0
                        if lib is not None:
                            lib.api.timing, lib.api.native_s = 1, 0.0
                        gen = engines[fast].chat([{"role": "user", "content": prompt}], max_tokens=args.n, k=k)
                        gen.result()
                        s = gen.stats
                        loop = s.t_total  # the loop only; prefill's decode is outside it
                        in_c = lib.api.native_s if lib is not None else 0.0
                        native_in_loop = _native[0] + in_c + _sync[0] - s.t_prefill
                        steps = max(1, s.verify_steps)
                        run = runs[(k, fast)]
                        run["share"].append(1.0 - native_in_loop / loop)
                        run["us"].append(1e6 * (loop - native_in_loop) / steps)
                        run["sync_us"].append(1e6 * _sync[0] / steps)
                        run["cycle_ms"].append(1000 * loop / steps)
                        run["d"].append(s.draft_cost_per_verify)
                print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                    f"k={k}{'' if len(modes) == 1 else (' fast' if fast else ' py')} {runs[(k, fast)]['us'][-1]:.0f} us"
                    for k, fast in keys), file=sys.stderr)
        finally:
            for ee in engines.values():
                ee.close()
    per_mode = {fast: summarise(runs, args, fast) for fast in modes}
    main_mode = modes[-1]
    result = {"cpu": cpu_name(), "gpu_layers": args.gpu_layers, "target": os.path.basename(target),
              "drafter": str(drafter if args.drafter else "untrained EAGLE-3.1 sized for the target"),
              "runs_per_k": len(runs[keys[0]]["us"]), "fastpath": main_mode,
              "ctypes_call_us": round(1e6 * _floor[0], 3),
              "overhead_us_per_cycle": {k: v["overhead_us_per_cycle"]["median"]
                                        for k, v in per_mode[main_mode].items()},
              "per_k": per_mode[main_mode]}
    if len(modes) > 1:
        result["python_path"] = {"overhead_us_per_cycle": {k: v["overhead_us_per_cycle"]["median"]
                                                           for k, v in per_mode[False].items()},
                                 "per_k": per_mode[False]}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for fast in modes:
            label = "" if len(modes) == 1 else ("native fast path: " if fast else "Python path: ")
            for k, v in per_mode[fast].items():
                o, sh = v["overhead_us_per_cycle"], v["host_overhead_share"]
                proj = ", ".join(f"{ms}: {p['with_overhead']:.2f}x (no overhead {p['without']:.2f}x)"
                                 for ms, p in v["projected_memory_bound_speedup"].items())
                print(f"{label}k={k}: host overhead {o['median']:.0f} us per cycle ({o['min']:.0f}-{o['max']:.0f}), "
                      f"{sh['median']:.2%} of a {v['cycle_ms']['median']:.1f} ms cycle (getters' sync "
                      f"{v['sync_us']['median']:.0f} us, counted native); projected on memory-bound hardware at tau "
                      f"{v['projected_memory_bound_speedup']['2ms']['tau']:.1f} per target step {proj}")
        print(f"({result['cpu']}, gpu layers {args.gpu_layers}, {result['runs_per_k']} runs per k and path, "
              "interleaved)")
    return 0


def summarise(runs, args, fast: bool) -> dict:
    from edge_eagle.stats import spread

    per_k = {}
    for k in args.k:
        run = runs[(k, fast)]
        us = statistics.median(run["us"])
        d = statistics.median(run["d"])
        tau = args.tau if args.tau is not None else 1.0 + 0.8 * k
        per_k[str(k)] = {
            "overhead_us_per_cycle": spread(run["us"], 1), "host_overhead_share": spread(run["share"], 4),
            "sync_us": spread(run["sync_us"], 1), "cycle_ms": spread(run["cycle_ms"], 2), "d": round(d, 3),
            "projected_memory_bound_speedup": {
                f"{ms}ms": {"tau": tau, "with_overhead": round(project(tau, k, d, us, ms), 3),
                            "without": round(project(tau, k, d, 0.0, ms), 3)}
                for ms in (2, 8, 30)}}
    return per_k


if __name__ == "__main__":
    sys.exit(main())
