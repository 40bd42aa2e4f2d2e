#!/usr/bin/env python
"""Soak: many generations in one process, the way a desktop app runs the library for hours.

    python scripts/soak.py [-n 500] [--json OUT]          # SmolLM2 + the shipped drafter
    python scripts/soak.py --target T.gguf --drafter D.gguf

A rotating mix: greedy speculative (fixed k and auto), plain, sampled (temperature 0.8),
generations cancelled part way (cancel() and breaking out of the iterator), chats that
fill the context window, and every 50 generations a second engine opened and closed.
Checks, and exits 1 when one fails:
- after warm-up (the first 100 generations or 20%), resident memory grows by less than 5%
  (the allocator settles during the first engine open/close cycles, then stays flat);
- no llama.cpp model or context is left open (edge_eagle.live_handles());
- every greedy speculative output equals plain decoding of the same prompt.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

from edge_eagle import EdgeEagle, live_handles  # noqa: E402
from edge_eagle.fsutil import atomic_write  # noqa: E402

PROMPTS = ["Explain speculative decoding in two sentences.", "Write a haiku about the sea.",
           "List three uses of a paperclip.", "What is the capital of France?", "Tell me a joke about cats.",
           "Describe a sunrise over the mountains.", "How do bicycles stay upright?",
           "Give me a recipe for pancakes."]
KINDS = ["spec", "auto", "plain", "sampled", "cancel", "break", "spec", "context"]


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def soak(target: str | None, drafter: str | None, n: int, max_tokens: int = 48, n_ctx: int = 512,
         progress: bool = True) -> dict:
    handles0 = live_handles()
    reference: dict[str, list[int]] = {}
    counts: dict[str, int] = {}
    mismatches: list[str] = []
    rss: list[int] = []
    finish: dict[str, int] = {}
    warm = min(n - 1, max(100, n // 5))  # two engine open/close cycles and every kind twice, at least
    with EdgeEagle(target, drafter or "default", n_ctx=n_ctx) as ee:
        msgs = lambda p: [{"role": "user", "content": p}]  # noqa: E731
        for i in tqdm(range(n), desc="soak", disable=not progress, file=sys.stderr):
            kind, prompt = KINDS[i % len(KINDS)], PROMPTS[(i // len(KINDS)) % len(PROMPTS)]
            counts[kind] = counts.get(kind, 0) + 1
            if kind in ("spec", "auto", "plain"):
                gen = ee.chat(msgs(prompt), max_tokens=max_tokens, k=3 if kind == "spec" else "auto",
                              speculative=kind != "plain").result()
                if prompt not in reference:
                    reference[prompt] = ee.chat(msgs(prompt), max_tokens=max_tokens, speculative=False).result().tokens
                if gen.tokens != reference[prompt]:
                    mismatches.append(f"#{i} {kind}: {prompt!r}")
            elif kind == "sampled":
                gen = ee.chat(msgs(prompt), max_tokens=max_tokens, temperature=0.8, seed=i, k=3).result()
            elif kind == "cancel":
                gen = ee.chat(msgs(prompt), max_tokens=max_tokens, k=3)
                for j, _ in enumerate(gen):
                    if j == 5:
                        gen.cancel()
            elif kind == "break":
                gen = ee.chat(msgs(prompt), max_tokens=max_tokens, k="auto")
                for j, _ in enumerate(gen):
                    if j == 3:
                        break
                gen.close()
            else:  # a conversation long enough to fill the window
                history = []
                for t in range(40):
                    history += [{"role": "user", "content": f"{prompt} (part {t})"},
                                {"role": "assistant", "content": "Sure. " * 20}]
                history.append({"role": "user", "content": prompt})
                gen = ee.chat(history, max_tokens=n_ctx, k=3).result()
            finish[gen.finish_reason or "none"] = finish.get(gen.finish_reason or "none", 0) + 1
            if i + 1 >= warm:
                rss.append(rss_bytes())
            if i % 50 == 49:  # apps open and close engines: nothing may stay behind
                with EdgeEagle(target, drafter or "default", n_ctx=256) as other:
                    other.generate("Hello", max_tokens=4).result()
    handles1 = live_handles()
    growth = (rss[-1] - rss[0]) / rss[0] if len(rss) > 1 else 0.0
    return {
        "generations": n, "kinds": counts, "finish_reasons": finish,
        "rss_after_warmup_mb": round(rss[0] / 2**20, 1) if rss else None,
        "rss_end_mb": round(rss[-1] / 2**20, 1) if rss else None,
        "rss_peak_after_warmup_mb": round(max(rss) / 2**20, 1) if rss else None,
        "rss_growth": round(growth, 4), "rss_ok": growth < 0.05,
        "rss_series_mb": [round(x / 2**20, 1) for x in rss[:: max(1, len(rss) // 20)]],
        "handles_before": handles0, "handles_after": handles1, "handles_ok": handles0 == handles1,
        "greedy_checked": counts.get("spec", 0) + counts.get("auto", 0) + counts.get("plain", 0),
        "greedy_mismatches": mismatches, "lossless_ok": not mismatches,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=500, help="generations (default 500)")
    ap.add_argument("--target")
    ap.add_argument("--drafter")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--json")
    args = ap.parse_args()
    report = soak(args.target, args.drafter, args.n, args.max_tokens)
    if args.json:
        atomic_write(args.json, json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0 if report["rss_ok"] and report["handles_ok"] and report["lossless_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
