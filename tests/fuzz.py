#!/usr/bin/env python
"""Longer fuzzing than CI's: the cases of tests/fuzz_cases.py for a time budget each.

    python -m tests.fuzz [--minutes 2] [--cases gguf_reader gguf_load ...] [--seed 0] [--json OUT]

Inputs are mutated real files: the shipped drafter GGUF, a tiny target and drafter (built
as the tests build them), a checkpoint written by `edge-eagle train` and its torch.save
twin. Reports, per case, how many inputs were tried and how many were accepted or refused
with a clear error; any other outcome stops the run with the reproducing seed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

from edge_eagle import defaults  # noqa: E402
from edge_eagle.fsutil import emit_report  # noqa: E402
from tests import fuzz_cases as F  # noqa: E402

CASES = ["gguf_reader", "gguf_load", "drafter_load", "safetensors", "config", "torch_zip"]


def build_inputs(work: Path) -> dict[str, Path]:
    """The real files to mutate: as the test fixtures make them."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from safetensors.torch import load_file

    from edge_eagle.gguf_file import read_gguf
    from edge_eagle.train import TrainOptions, save_checkpoint
    from edge_eagle.train.trainer import init_model
    from tests.tiny_models import make_drafter, write_tiny_target

    target = write_tiny_target(work / "tiny-target.gguf")
    drafter, _ = make_drafter(work / "tiny-drafter.gguf", target, seed=1, fc_norm=True, norm_output=True)
    import numpy as np

    g = read_gguf(target)
    d2t = np.arange(512, dtype=np.int64)
    save_checkpoint(init_model(g, (2, 4, 5), d2t, TrainOptions(draft_vocab=512)), work / "ckpt", g, {})
    torch.save(load_file(work / "ckpt" / "model.safetensors"), work / "pytorch_model.bin")
    return {"target": target, "drafter": drafter, "checkpoint": work / "ckpt", "bin": work / "pytorch_model.bin",
            "shipped": defaults.default_drafter()}


def run_case(name: str, rng: random.Random, inp: dict[str, Path], work: Path) -> str:
    if name == "gguf_reader":
        return F.case_gguf_reader(rng, inp["shipped"] if rng.random() < 0.5 else inp["target"], work)
    if name == "gguf_load":
        return F.case_gguf_load(rng, inp["target"], work)
    if name == "drafter_load":
        return F.case_gguf_load(rng, inp["target"], work, drafter=inp["drafter"])
    if name == "safetensors":
        return F.case_safetensors(rng, inp["checkpoint"], work)
    if name == "config":
        return F.case_config(rng, inp["checkpoint"], inp["target"], work)
    return F.case_torch_zip(rng, inp["bin"], work)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=2.0, help="time budget per case")
    ap.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    report = {"seed": args.seed, "minutes_per_case": args.minutes, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        inp = build_inputs(work)
        for name in args.cases:
            counts = {"tried": 0, "ok": 0, "error": 0}
            deadline = time.monotonic() + 60 * args.minutes
            with tqdm(desc=name, unit="case", file=sys.stderr) as bar:
                i = 0
                while time.monotonic() < deadline:
                    seed = args.seed * 1_000_003 + i
                    try:
                        outcome = run_case(name, random.Random(seed), inp, work)
                    except F.FuzzFailure as e:
                        print(f"\nFAILED {name} seed {seed}: {e}", file=sys.stderr)
                        report["cases"][name] = dict(counts, failure=str(e)[:2000], failing_seed=seed)
                        print(json.dumps(report, indent=2))
                        return 1
                    counts["tried"] += 1
                    counts[outcome] += 1
                    i += 1
                    bar.update(1)
            report["cases"][name] = counts
    report["total_tried"] = sum(c["tried"] for c in report["cases"].values())
    emit_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
