#!/usr/bin/env python
"""Tokens/s with and without llama.cpp's CPU weight repacking (extra buffer types), the
measurement behind edge-eagle's `repack=auto` decision (edge_eagle/system.py).

    python scripts/bench_repack.py [MODEL.gguf ...] [--rounds 5] [--prompt-tokens 128] [--decode 32] [--json OUT]

Without models it uses the default target (SmolLM2-135M-Instruct Q4_1) and a Q4_0 copy of
it requantized once into ~/.cache/edge-eagle/quant (llama.cpp's own quantizer). Each round
loads every model twice, repack on and off, in rotating order, then, after one warm-up prefill, times a prefill of
--prompt-tokens tokens and --decode single-token decodes. Reported per model: the median
on/off ratio of prefill and decode tokens/s over rounds, with min-max, and the buffer types
llama.cpp used. Where the CPU has AMX, "on" would crash; that mode is skipped there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

from edge_eagle import system  # noqa: E402
from edge_eagle.defaults import default_target  # noqa: E402
from edge_eagle.fsutil import atomic_path, atomic_write  # noqa: E402
from edge_eagle.stats import spread  # noqa: E402
from edge_eagle.target import Target  # noqa: E402

QUANT_DIR = Path(os.environ.get("EDGE_EAGLE_CACHE", Path.home() / ".cache" / "edge-eagle")) / "quant"


def requantized(src: Path, ftype_name: str) -> Path:
    from edge_eagle._llama import requantize

    out = QUANT_DIR / f"{src.stem.lower()}.{ftype_name.lower()}.gguf"
    if not out.exists():
        QUANT_DIR.mkdir(parents=True, exist_ok=True)
        with atomic_path(out) as tmp:
            requantize(src, tmp, ftype_name)
    return out


def one_run(path: Path, mode: str, prompt_tokens: int, n_decode: int) -> dict:
    t = Target(path, n_ctx=prompt_tokens + n_decode + 8, n_batch=max(prompt_tokens, 32), repack=mode)
    try:
        toks = (t.tokenize("The quick brown fox jumps over the lazy dog. " * 64))[:prompt_tokens]
        t.prefill(toks)  # warm-up: page in the weights, start the thread pool
        t.memory.clear()
        t0 = time.perf_counter()
        res = t.prefill(toks)
        t1 = time.perf_counter()
        tok = int(res.logits[-1].argmax())
        for i in range(n_decode):
            tok = int(t.decode([tok], len(toks) + i).logits[-1].argmax())
        t2 = time.perf_counter()
        return {"prefill_tps": len(toks) / (t1 - t0), "decode_tps": n_decode / (t2 - t1), "buffers": t.buffers,
                "use_extra_bufts": t.repack.use_extra_bufts}
    finally:
        t.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--json", type=Path, help="write the report here as JSON")
    args = ap.parse_args()
    models = args.models or [Path(default_target()), requantized(Path(default_target()), "Q4_0")]
    amx = system.AMX_BUFT in system.cpu_extra_buffer_types()
    modes = ["off"] if amx else ["on", "off"]
    runs: dict[str, dict[str, list[dict]]] = {m.name: {mode: [] for mode in modes} for m in models}
    bar = tqdm(total=args.rounds * len(models) * len(modes), desc="repack on/off", unit="load")
    for r in range(args.rounds):
        for i, model in enumerate(models):
            order = modes if (r + i) % 2 == 0 else modes[::-1]
            for mode in order:
                runs[model.name][mode].append(one_run(model, mode, args.prompt_tokens, args.decode))
                bar.update()
    bar.close()
    report = {"cpu": system.cpu_name(), "cores": os.cpu_count(), "extra_buffer_types": system.cpu_extra_buffer_types(),
              "rounds": args.rounds, "prompt_tokens": args.prompt_tokens, "decode_tokens": args.decode, "models": {}}
    for name, by_mode in runs.items():
        entry: dict = {m: {"buffers": rs[0]["buffers"],
                           "prefill_tps_median": statistics.median(x["prefill_tps"] for x in rs),
                           "decode_tps_median": statistics.median(x["decode_tps"] for x in rs)}
                       for m, rs in by_mode.items()}
        if not amx:
            for what in ("prefill_tps", "decode_tps"):
                ratios = [on[what] / off[what] for on, off in zip(by_mode["on"], by_mode["off"])]
                entry[f"{what}_on_over_off"] = spread(ratios, None)
        report["models"][name] = entry
    print(f"CPU: {report['cpu']} ({report['cores']} cores); extra buffer types: "
          f"{', '.join(report['extra_buffer_types']) or 'none'}")
    for name, e in report["models"].items():
        bufs = ", ".join(f"{k} {v:.0f} MiB" for k, v in e[modes[0]]["buffers"].items())
        line = f"{name}: [{modes[0]}] {bufs}"
        if not amx:
            p, d = e["prefill_tps_on_over_off"], e["decode_tps_on_over_off"]
            line += (f"; repack on/off: prefill {p['median']:.2f}x ({p['min']:.2f}-{p['max']:.2f}), "
                     f"decode {d['median']:.2f}x ({d['min']:.2f}-{d['max']:.2f})")
        print(line)
    if args.json:
        atomic_write(args.json, json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
