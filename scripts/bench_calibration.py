#!/usr/bin/env python
"""How far the batch-cost calibration lands from the truth at a long context, by rounds.

    python scripts/bench_calibration.py [--rounds 3 5] [--repeats 3] [--context 1536] [--json OUT]

Each repeat runs one calibration per --rounds value (interleaved, as `calibrate()` measures:
every size after the 8-token context and again 1,024 tokens later), then measures the batch
costs directly after --context tokens (5 rounds). Reported per calibration: its time, its
single-step slope, and its c(8), c(9) and single step at --context against the direct
measurement's; and per rounds value, the spread of those errors.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

from edge_eagle import EdgeEagle  # noqa: E402
from edge_eagle.costs import CostModel, measure_batch_costs, measure_context_costs, relative_costs  # noqa: E402
from edge_eagle.fsutil import emit_report  # noqa: E402
from edge_eagle.system import cpu_name  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, nargs="+", default=[3, 5])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--context", type=int, default=1536)
    ap.add_argument("--json")
    args = ap.parse_args()
    runs: list[dict] = []
    with EdgeEagle(n_ctx=2048) as ee:
        target, n_max = ee.target, ee.cost_n_max
        pad = target.eos if target.eos >= 0 else 0
        for _ in tqdm(range(args.repeats), desc="repeats", file=sys.stderr):
            for rounds in args.rounds:
                t0 = time.perf_counter()
                measured = measure_context_costs(target, n_max, rounds)
                seconds = time.perf_counter() - t0
                assert measured is not None
                model = CostModel.from_measured(measured)
                model.context = args.context
                target.memory.clear()
                target.prefill([pad] * args.context, 0)
                truth = measure_batch_costs(target, 9, 5, keep=args.context)
                target.memory.clear()
                assert truth is not None and model.step_s() is not None
                rel = relative_costs(truth, 9)
                runs.append({"rounds": rounds, "seconds": round(seconds, 2),
                             "slope_ms_per_1k": round(measured.slope_s[1] * 1e6, 2),
                             "c8": [round(model.c(8), 2), round(rel[8], 2)],
                             "c9": [round(model.c(9), 2), round(rel[9], 2)],
                             "step_ms": [round(model.step_s() * 1e3, 2), round(truth[1] * 1e3, 2)]})
    summary = {}
    for rounds in args.rounds:
        mine = [r for r in runs if r["rounds"] == rounds]
        err = [abs(r["c8"][0] / r["c8"][1] - 1) for r in mine] + [abs(r["c9"][0] / r["c9"][1] - 1) for r in mine]
        summary[rounds] = {"seconds_median": round(statistics.median(r["seconds"] for r in mine), 2),
                           "slopes": [r["slope_ms_per_1k"] for r in mine],
                           "c8_c9_error_median": round(statistics.median(err), 3),
                           "c8_c9_error_max": round(max(err), 3)}
    emit_report({"cpu": cpu_name(), "command": "python scripts/bench_calibration.py " + " ".join(sys.argv[1:]),
                 "context": args.context, "runs": runs, "by_rounds": summary}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
