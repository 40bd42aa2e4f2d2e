"""The background adaptation's process (learn/idle.py starts it): niced, thread-capped, one
learn.run.adapt_store, its report written atomically to --report."""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m edge_eagle.learn.child")
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--store", required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--nice", type=int, default=10)
    ap.add_argument("--steps", type=int, default=900)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--general-prompts", type=int, default=24)
    ap.add_argument("--samples", type=int, default=4)
    args = ap.parse_args(argv)
    if args.nice and hasattr(os, "nice"):
        os.nice(args.nice)
    import torch

    torch.set_num_threads(max(1, args.threads))
    from ..fsutil import atomic_write
    from .adapt import AdaptOptions
    from .run import adapt_store
    from .store import LearnStore

    report = adapt_store(args.target, args.drafter, LearnStore(args.store), AdaptOptions(steps=args.steps,
                                                                                        minutes=args.minutes,
                                                                                        lr=args.lr,
                                                                                        samples=args.samples),
                         general_prompts=args.general_prompts, progress=False, n_threads=args.threads,
                         log=lambda s: print(s, file=sys.stderr))
    atomic_write(args.report, json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
