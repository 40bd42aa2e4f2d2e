"""Is greedy speculation exact? Where an output differs from plain decoding, locate the first
differing token and measure the target's top-2 logit gap there against llama.cpp's own
batch-shape noise: a divergence at a near-tie is rounding, one at a clear winner a bug."""

from __future__ import annotations

from typing import Any

import numpy as np

from .prompts import BenchPrompt
from .runners import RunResult
from .suite import Bench


def greedy_equal(r: RunResult, plain: RunResult, n: int) -> bool:
    if r.tokens is not None and plain.tokens is not None:
        return r.tokens[:n] == plain.tokens[:n]
    text, ref = r.text, plain.text
    if len(text) >= len(ref):
        return text.startswith(ref)
    return ref.startswith(text)  # stopped early (end of generation)


#: verify batch sizes the noise is measured at, against one token at a time: a chain of 1, 3 and 8
#: drafts (chunks of 2 or more tokens agree with each other bit for bit on llama.cpp's CPU
#: backend; one-token decodes may round differently, docs/measurements.md)
NOISE_CHUNKS = (2, 4, 9)


def numeric_noise(target, prompt: list[int], continuation: list[int]) -> float:
    """How far llama.cpp's own logits move with the batch shape alone: the largest logit
    difference between decoding `continuation` one token at a time and NOISE_CHUNKS tokens at a
    time after the same prompt (same model, same context; on CPU, kernels and thread splits
    change with the batch and the context length: with flash attention on, one-token and batched
    decodes agree bit for bit only under about 256 tokens of context). A divergence from plain
    decoding where the top-2 gap is within this is rounding, not a fault of the speculative loop."""
    if not continuation:
        return 0.0
    runs = []
    for bs in (1, *NOISE_CHUNKS):
        target.memory.clear()
        target.set_capture(())
        target.prefill(prompt)
        rows = []
        for i in range(0, len(continuation), bs):
            chunk = continuation[i:i + bs]
            rows.append(np.asarray(target.decode(chunk, len(prompt) + i, "all").logits, dtype=np.float64))
        runs.append(np.concatenate(rows))
    target.memory.clear()
    return max(float(np.abs(runs[0] - r).max()) for r in runs[1:])


def top2_gap(target, tokens: list[int]) -> float:
    """The gap between the target's two largest logits for the token after `tokens` (a fresh
    prefill; the cache is left holding `tokens`)."""
    target.memory.clear()
    target.set_capture(())
    logits = np.asarray(target.prefill(tokens).logits[-1], dtype=np.float64)
    top2 = np.sort(logits)[-2:]
    return float(top2[1] - top2[0])


def divergences(bench: Bench, prompts: list[BenchPrompt], prompt_ids: list[list[int]],
                 results: dict[str, list[RunResult]]) -> tuple[float, dict[str, list[dict[str, Any]]]]:
    """For every output that differs from plain decoding: where it first differs, and the gap
    between the target's top two logits there on plain decoding's own prefix. Greedy
    speculation is exact up to floating point: llama.cpp's kernels round differently for
    different batch shapes, which can flip a near-tie; a divergence at a clear winner is a bug."""
    engine = bench.engines[0]
    target = engine.target
    plain = results["plain"]
    out: dict[str, list[dict[str, Any]]] = {}
    # the longest prompt and plain decoding's whole answer to it: the longest context the runs reached
    longest = max(range(len(prompts)), key=lambda i: len(prompt_ids[i]) + len(plain[i].tokens or []))
    engine.route_attention(len(prompt_ids[longest]))  # attention computed as for that prompt's runs
    noise = round(numeric_noise(target, prompt_ids[longest], list(plain[longest].tokens or [])), 4)
    for name, rs in results.items():
        for i, (x, p) in enumerate(zip(rs, plain)):
            if name == "plain" or greedy_equal(x, p, bench.opts.max_tokens):
                continue
            ref = p.tokens or []
            if x.tokens is not None:
                j = next((n for n, (a, b) in enumerate(zip(x.tokens, ref)) if a != b), min(len(x.tokens), len(ref)))
            else:  # text only: the plain token whose text holds the first differing character
                c = next((n for n, (a, b) in enumerate(zip(x.text, p.text)) if a != b), min(len(x.text), len(p.text)))
                j, length = 0, 0
                while j < len(ref):
                    piece = len(target.detokenize([ref[j]]))
                    if length + piece > c:
                        break
                    length += piece
                    j += 1
            # j == len(ref): plain decoding ended its answer there and this runner went on, a
            # divergence at the end-of-generation token's row like any other
            engine.route_attention(len(prompt_ids[i]))
            out.setdefault(name, []).append({"prompt": prompts[i].id, "token": j,
                                             "top2_gap": round(top2_gap(target, prompt_ids[i] + ref[:j]), 4)})
    target.memory.clear()
    return noise, out
