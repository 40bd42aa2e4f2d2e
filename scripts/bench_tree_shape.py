#!/usr/bin/env python
"""How much of a draft tree's tau its shape decides: node-selection rules compared on the same
cycles, without timing.

    python scripts/bench_tree_shape.py [--prompts mtbench] [--limit 16] [--every 5] [-n 64]
                                       [--nodes 7 15] [--json OUT]

The engine decodes each prompt (chat-formatted, greedy) with a large draft tree every cycle: up
to 60 nodes, 8 nodes expanded per depth, 8 children each, depth 6. Each cycle records the
tree, every node's draft log-probability given its parent, and the path the target accepted
through it. Greedy verification accepts the longest path of the target's own choices, so the
tau of any subtree (closed under parents) follows from the record alone: 1 + how much of the
accepted path it holds. Per budget of N nodes, these rules pick a subtree of each recorded tree:

- chain: the drafter's first choice at each depth, N deep (a chain of N drafts);
- eagle2 b4 c4 / b4 c8: the engine's growth (eagle/tree.py) with 4 nodes expanded per depth and
  4 or 8 children each, then the N best by cumulative draft log-probability;
- best joint: the N best nodes of the whole recorded tree by cumulative log-probability;
- calibrated: the N best by the product of acceptance rates estimated per (depth, draft
  probability) on the other half of the prompts (two folds): what a perfectly calibrated
  drafter confidence would choose.

Reported per rule and budget: tau over the recorded cycles and its ratio to the chain's; the
calibration table. Cycles start where the large tree's cycles did, the same for every rule.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

from edge_eagle import EdgeEagle  # noqa: E402
from edge_eagle import cycle as cycles  # noqa: E402
from edge_eagle.bench import prompts as sets  # noqa: E402
from edge_eagle.fsutil import emit_report  # noqa: E402
from edge_eagle.system import cpu_name  # noqa: E402

RECORD_NODES, RECORD_BRANCH, RECORD_CHILDREN, RECORD_DEPTH = 60, 8, 8, 6

Cycle = dict  # tokens, parents, lp (per node, given its parent), path (accepted nodes)


def record(ee: EdgeEagle, prompt: str, n: int) -> list[Cycle]:
    """One greedy generation with large trees; each tree cycle's record."""
    out: list[Cycle] = []
    drafter = ee.drafter
    real = cycles.verify_tree

    def verify_tree(sampler, logits, proposal, pos=None, history=None):
        path, bonus, ranks = real(sampler, logits, proposal, pos, history)
        out.append({"parents": list(proposal.parents), "lp": list(drafter.trees.logprobs), "path": list(path)})
        return path, bonus, ranks

    cycles.verify_tree = verify_tree
    try:
        ee.chat([{"role": "user", "content": prompt}], max_tokens=n).result()
    finally:
        cycles.verify_tree = real
    return out


def held(selected: set[int], path: list[int]) -> int:
    """Accepted drafts of a subtree: how much of the accepted path it holds."""
    n = 0
    for node in path:
        if node not in selected:
            break
        n += 1
    return n


def children_of(c: Cycle) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(c["parents"]):
        kids[p].append(i)
    for p in kids:
        kids[p].sort(key=lambda i: -c["lp"][i])
    return kids


def best_first(score: list[float], parents: list[int], budget: int) -> set[int]:
    """The `budget` best nodes by score that form a subtree."""
    chosen: set[int] = set()
    for i in sorted(range(len(score)), key=lambda i: (-score[i], i)):
        if len(chosen) >= budget:
            break
        if parents[i] < 0 or parents[i] in chosen:
            chosen.add(i)
    return chosen


def cumulative(c: Cycle, per_node: list[float]) -> list[float]:
    out: list[float] = []
    for i, p in enumerate(c["parents"]):
        out.append((out[p] if p >= 0 else 0.0) + per_node[i])
    return out


def chain(c: Cycle, budget: int) -> set[int]:
    kids, node, chosen = children_of(c), -1, set()
    for _ in range(budget):
        if not kids.get(node):
            break
        node = kids[node][0]
        chosen.add(node)
    return chosen


def eagle2(c: Cycle, budget: int, branch: int, children: int, depth: int = RECORD_DEPTH) -> set[int]:
    """TreeDrafter.grow's selection, replayed on the recorded tree."""
    kids, lp = children_of(c), c["lp"]
    score: dict[int, float] = {}
    frontier = [-1]
    for d in range(1, depth + 1):
        new = []
        for f in frontier:
            base = score[f] if f >= 0 else 0.0
            for i in kids.get(f, [])[:min(children, budget)]:
                score[i] = base + lp[i]
                new.append(i)
        if d == depth:
            break
        ranked = sorted(score.values(), reverse=True)
        floor = -math.inf if len(ranked) < budget else ranked[budget - 1]
        frontier = sorted((i for i in new if score[i] > floor), key=lambda i: -score[i])[:branch]
        if not frontier:
            break
    return set(sorted(score, key=lambda i: (-score[i], i))[:budget])


def depth_of(c: Cycle) -> list[int]:
    out: list[int] = []
    for p in c["parents"]:
        out.append(1 if p < 0 else out[p] + 1)
    return out


def bucket(depth: int, lp: float) -> tuple[int, int]:
    return min(depth, 3), min(9, int(math.exp(lp) * 10))


def fit(train: list[Cycle]) -> dict[tuple[int, int], list[float]]:
    """(depth, probability decile) -> [accepted, reached] over the nodes whose parent was accepted."""
    table: dict[tuple[int, int], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for c in train:
        accepted, depths = set(c["path"]), depth_of(c)
        for i, p in enumerate(c["parents"]):
            if p < 0 or p in accepted:
                cell = table[bucket(depths[i], c["lp"][i])]
                cell[0] += i in accepted
                cell[1] += 1
    return table


def calibrated(c: Cycle, table: dict[tuple[int, int], list[float]], budget: int) -> set[int]:
    depths = depth_of(c)
    rate = []
    for i, lp in enumerate(c["lp"]):
        hits, seen = table.get(bucket(depths[i], lp), (0.0, 0.0))
        rate.append(math.log(max(1e-6, (hits + 0.5) / (seen + 1.0) if seen else math.exp(lp))))
    return best_first(cumulative(c, rate), c["parents"], budget)


RULES = ("chain", "eagle2 b4 c4", "eagle2 b4 c8", "best joint", "calibrated")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", choices=("mtbench", "humaneval", "gsm8k"), default="mtbench")
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--every", type=int, default=5, help="every n-th prompt (MT-bench: by category in turn)")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--nodes", type=int, nargs="+", default=[7, 15])
    ap.add_argument("--json")
    args = ap.parse_args()
    pool = {"mtbench": lambda: sets.by_category_in_turn(sets.mtbench()), "humaneval": sets.humaneval,
            "gsm8k": sets.gsm8k}[args.prompts]()
    prompts = pool[:: max(1, args.every)][: args.limit]
    recorded: list[list[Cycle]] = []
    with EdgeEagle(tree=RECORD_NODES, tree_paths=RECORD_NODES + 3, history=False) as ee:
        drafter = ee.drafter
        assert drafter is not None and drafter.supports_trees
        drafter.propose_tree = functools.partial(drafter.propose_tree, branch=RECORD_BRANCH,  # type: ignore[method-assign]
                                                 children=RECORD_CHILDREN, depth=RECORD_DEPTH)
        for p in tqdm(prompts, desc="bench_tree_shape", file=sys.stderr):
            recorded.append(record(ee, p.text, args.n))
    half = len(recorded) // 2
    folds = [(recorded[:half], recorded[half:]), (recorded[half:], recorded[:half])]
    results: dict[str, dict[str, float]] = {}
    for budget in args.nodes:
        accepted: dict[str, list[int]] = {r: [] for r in RULES}
        for train, test in folds:
            table = fit([c for cs in train for c in cs])
            for c in (c for cs in test for c in cs):
                path = c["path"]
                accepted["chain"].append(held(chain(c, budget), path))
                accepted["eagle2 b4 c4"].append(held(eagle2(c, budget, 4, 4), path))
                accepted["eagle2 b4 c8"].append(held(eagle2(c, budget, 4, 8), path))
                accepted["best joint"].append(held(best_first(cumulative(c, c["lp"]), c["parents"], budget), path))
                accepted["calibrated"].append(held(calibrated(c, table, budget), path))
        taus = {r: 1.0 + sum(v) / max(1, len(v)) for r, v in accepted.items()}
        results[str(budget)] = {r: round(t, 3) for r, t in taus.items()}
        results[str(budget)].update({f"{r} / chain": round(t / taus["chain"], 3)
                                     for r, t in taus.items() if r != "chain"})
    table = fit([c for cs in recorded for c in cs])
    report = {"cpu": cpu_name(), "prompts": f"{args.prompts} ({len(prompts)})", "max_tokens": args.n,
              "cycles": sum(len(cs) for cs in recorded),
              "command": "python scripts/bench_tree_shape.py " + " ".join(sys.argv[1:]),
              "tau_by_nodes": results,
              "acceptance_given_parent": {f"depth {d}{'+' if d == 3 else ''}, q {b / 10:.1f}-{(b + 1) / 10:.1f}":
                                          {"rate": round(v[0] / v[1], 3), "nodes": int(v[1])}
                                          for (d, b), v in sorted(table.items()) if v[1] >= 20}}
    emit_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
