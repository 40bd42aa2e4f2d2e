#!/usr/bin/env python
"""Evaluation feature sets for drafters, and a cheap acceptance score on them (no llama.cpp run).

    python scripts/eval_sets.py build [--dir DIR] [--sets mtbench sharegpt-unseen humaneval code-raw]
    python scripts/eval_sets.py score CHECKPOINT [CHECKPOINT ...] [--dir DIR] [--json]
    edge-eagle train ... --eval-features DIR/mtbench DIR/sharegpt-unseen ...

`build` regenerates the target's greedy answers (96 tokens, as scripts/eval_drafter.py) to
prompts no drafter trains on, through the runtime's capture path, into one feature folder per set
(default ~/.cache/edge-eagle/eval/):
  mtbench          every 2nd MT-bench first turn (40: all 8 categories), the eval_drafter slice;
  sharegpt-unseen  40 ShareGPT first turns from conversation 12,000 on (past every training slice);
  humaneval        every 8th HumanEval problem asked as chat (21);
  code-raw         every 8th HumanEval prompt from the 4th, as raw text to continue (20).
`score` gives each checkpoint's simulated greedy acceptance on each set: tau at k = the
checkpoint's TTT depth and the per-position acceptance. On MT-bench it tracks llama.cpp's
measured tau (shipped v2 drafter: simulated 1.39, measured 1.32 at k = 5; the measured run
seeds chains only after rejections, the simulation at every position).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SETS = ("mtbench", "sharegpt-unseen", "humaneval", "code-raw")
MAX_NEW = 96


def default_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edge-eagle" / "eval"


def conversations(name: str) -> list[list[dict]]:
    from edge_eagle.bench.prompts import humaneval, humaneval_problems, mtbench
    from edge_eagle.train.data import iter_sharegpt, training_examples

    if name == "mtbench":
        return [[{"role": "user", "content": q.text}] for q in mtbench()[::2]]
    if name == "humaneval":
        return [[{"role": "user", "content": q.text}] for q in humaneval()[::8]]
    if name == "code-raw":
        return [[{"role": "text", "content": r["prompt"]}] for r in humaneval_problems()[4::8]]
    if name == "sharegpt-unseen":
        out = []
        for i, conv in enumerate(iter_sharegpt()):
            if i >= 12_000 and conv and conv[0]["role"] == "user":
                first = next(training_examples([conv], "first"))
                out.append(first[:-1] if first[-1]["role"] == "assistant" else first)
                if len(out) == 40:
                    break
        return out
    raise SystemExit(f"Unknown set '{name}'; choose from {', '.join(SETS)}.")


def build(args: argparse.Namespace) -> int:
    from edge_eagle import gguf_keys as K
    from edge_eagle.defaults import default_target
    from edge_eagle.gguf_file import read_gguf
    from edge_eagle.target import Target
    from edge_eagle.train.extract import extract

    target_path = args.target or default_target()
    n = int(read_gguf(target_path).require(K.BLOCK_COUNT))
    layers = tuple(args.layers) if args.layers else (2, n // 2, n - 3)
    target = Target(target_path, n_ctx=384 + MAX_NEW + 8, n_seq=16, n_threads=args.threads)
    try:
        for name in args.sets:
            m = extract(target, layers, conversations(name), args.dir / name, max_tokens=10**9, regenerate=True,
                        max_prompt=384, max_new=MAX_NEW)
            print(f"{name}: {m['tokens']} tokens, {len(m['shards'])} shards -> {args.dir / name}", file=sys.stderr)
    finally:
        target.close()
    return 0


def score(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from edge_eagle.defaults import default_target
    from edge_eagle.gguf_file import read_gguf
    from edge_eagle.train.trainer import TrainOptions, init_model, read_manifest, simulated_acceptance
    from edge_eagle.train.ttt import FeatureData

    target = read_gguf(args.target or default_target())
    results = []
    for ck in args.checkpoints:
        path = Path(ck) / "train_state.pt" if Path(ck).is_dir() else Path(ck)
        if not path.is_file():
            raise SystemExit(f"{ck} has no train_state.pt; pass a checkpoint folder written by `edge-eagle train`.")
        state = torch.load(path, map_location="cpu", weights_only=False)
        opts = TrainOptions(**state["options"])
        d2t = np.asarray(state["d2t"], np.int64)
        t2d = np.full(target.vocab_size, -1, np.int64)
        t2d[d2t] = np.arange(len(d2t))
        row = {"checkpoint": str(ck), "step": state["step"]}
        layers = tuple(read_manifest(args.dir / args.sets[0], target)["layers"])
        model = init_model(target, layers, d2t, TrainOptions(**{**vars(opts), "init": "default"}))
        model.load_state_dict(state["model"])
        for name in args.sets:
            folder = args.dir / name
            manifest = read_manifest(folder, target, layers)
            data = FeatureData([folder / s for s in manifest["shards"]], t2d)
            row[name] = simulated_acceptance(model, data, opts.ttt_steps)
        results.append(row)
        if not args.json:
            print(f"{ck} (step {row['step']}): " + ", ".join(
                f"{n} tau {row[n]['tau']:.3f} [{' '.join(f'{x:.2f}' for x in row[n]['per_position_acceptance'])}]"
                for n in args.sets))
    if args.json:
        print(json.dumps(results))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="extract the evaluation feature sets")
    b.add_argument("--target", default=None, help="target GGUF (default: embedded SmolLM2-135M-Instruct)")
    b.add_argument("--layers", type=int, nargs=3)
    b.add_argument("--threads", type=int, default=None)
    s = sub.add_parser("score", help="simulated acceptance of checkpoints on the sets")
    s.add_argument("checkpoints", nargs="+")
    s.add_argument("--target", default=None)
    s.add_argument("--json", action="store_true")
    for p in (b, s):
        p.add_argument("--dir", type=Path, default=default_dir())
        p.add_argument("--sets", nargs="+", choices=SETS, default=list(SETS))
    args = ap.parse_args()
    return build(args) if args.cmd == "build" else score(args)


if __name__ == "__main__":
    sys.exit(main())
