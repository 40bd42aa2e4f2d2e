"""From the raw runs of a bench to its report: per-runner speed as per-prompt ratios against
plain decoding, the acceptance figures (stats.SpecStats, summed over prompts), the time split,
peak RSS, greedy equality, and the cost model's predictions (costs.py) beside the measured
speedups."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from ..costs import MEMORY_BOUND_MAX_N, memory_bound_cost, predicted_speedup, tree_cycle_cost
from ..stats import SpecStats
from .divergence import greedy_equal
from .options import label
from .prompts import BenchPrompt
from .runners import Runner, RunResult
from .suite import Bench


def spread(values: Sequence[float]) -> dict[str, float | None]:
    """Median, min-max and quartiles of per-prompt values (None for none)."""
    if not values:
        return {"median": None, "min": None, "max": None, "q1": None, "q3": None}
    v = sorted(values)
    q = statistics.quantiles(v, n=4) if len(v) >= 2 else [v[0]] * 3
    return {"median": round(statistics.median(v), 4), "min": round(v[0], 4), "max": round(v[-1], 4),
            "q1": round(q[0], 4), "q3": round(q[2], 4)}


def summarize(bench: Bench, prompts: list[BenchPrompt], results: dict[str, list[RunResult]],
              costs: dict[int, float], peak: dict[str, int], machine: dict[str, Any],
              divergences: dict[str, list[dict[str, Any]]] | None = None, noise: float = 0.0) -> dict[str, Any]:
    o = bench.opts
    plain = results["plain"]
    c1 = costs[1]
    c_rel = {n: costs[n] / c1 for n in sorted(costs)}
    # drafter step cost relative to one target step: edge-eagle's drafting time per drafted token
    d_rel: dict[str, float] = {}
    for r in bench.runners:
        if r.kind == "edge-eagle" and isinstance(r.k, int):
            total = SpecStats.total(x.stats for x in results[r.name] if x.stats is not None)
            if total.drafted:
                d_rel[r.drafter or ""] = (total.t_draft / total.drafted) / c1
    runners_out = []
    # the prompts on which every runner wrote plain decoding's text: there all did the same work,
    # so their speeds compare paired (where a runner's greedy text took the other side of a
    # near-tie, it decodes another text from there on, which may copy more or less)
    equal = {r.name: [greedy_equal(x, p, o.max_tokens) for x, p in zip(results[r.name], plain)]
             for r in bench.runners}
    same = [all(col) for col in zip(*equal.values())]
    for r in bench.runners:
        rs = results[r.name]
        gen = sum(x.generated for x in rs)
        secs = sum(x.seconds for x in rs)
        # each prompt's ratio to plain decoding (None where plain decoding took no time to measure)
        per_prompt = [x.tokens_per_second / p.tokens_per_second if p.tokens_per_second > 0 else None
                      for x, p in zip(rs, plain)]
        ratios = [v for v in per_prompt if v is not None]
        entry: dict[str, Any] = {"name": r.name, "kind": r.kind, "k": r.k,
                                 "drafter": label(r.drafter) if r.drafter else None,
                                 "tokens_per_second": round(gen / secs, 3) if secs else 0.0}
        s = spread(ratios)
        entry["speedup"] = s["median"]
        entry.update({f"speedup_{k}": v for k, v in s.items() if k != "median"})
        spec = [x.stats for x in rs if x.stats is not None]
        if rs and len(spec) == len(rs) and r.kind != "plain":
            t = SpecStats.total(spec)
            entry.update({"tau": round(t.tau, 4) if t.verify_steps else None,
                          "per_position_acceptance": [round(a, 4) for a in t.per_position_acceptance],
                          "acceptance_rate": round(t.acceptance_rate, 4) if t.drafted else None,
                          "verify_steps": t.verify_steps, "drafted": t.drafted, "accepted": t.accepted})
        else:
            entry.update({"tau": None, "per_position_acceptance": [], "acceptance_rate": None})
        if rs and rs[0].timed:
            tot = sum(x.seconds for x in rs) or 1.0
            t = SpecStats.total(spec)
            entry["time_split"] = {"verify": round(t.t_verify / tot, 4), "draft": round(t.t_draft / tot, 4),
                                   "overhead": round(sum(x.t_overhead for x in spec) / tot, 4)}
        if r.kind == "edge-eagle" and r.k == "auto":
            entry["k_mean"] = round(statistics.mean(x.k_mean for x in spec), 3) if spec else None
        if spec and r.kind == "edge-eagle" and (r.tree or r.k == "auto"):
            t = SpecStats.total(spec)
            entry.update({"tree": r.tree, "tree_nodes_mean": round(t.tree_nodes_mean, 3),
                          "tree_depth_mean": round(t.tree_depth_mean, 3),
                          "accepted_rank_at": [list(row) for row in t.accepted_rank_at],
                          "proposers": dict(t.proposers)})
        rss = peak.get(r.name) or max((x.peak_rss or 0 for x in rs), default=0)
        entry["peak_rss_mb"] = round(rss / 2**20, 1) if rss else None
        eq = sum(equal[r.name])
        div = (divergences or {}).get(r.name, [])
        near = sum(d["top2_gap"] <= noise for d in div)
        entry["greedy_equals_plain"] = {"equal": eq, "prompts": len(rs), "ok": eq == len(rs),
                                        "near_tie_divergences": near,
                                        "explained": eq + near == len(rs)}
        entry["divergences"] = div
        paired = [x.tokens_per_second / p.tokens_per_second for x, p, ok in zip(rs, plain, same)
                  if ok and p.tokens_per_second > 0]
        entry["speedup_same_text"] = {**spread(paired), "prompts": len(paired)}
        entry.update(predict(r, entry, c_rel, d_rel))
        cats: dict[str, list[float]] = {}
        for p, ratio in zip(prompts, per_prompt):
            if ratio is not None:
                cats.setdefault(p.category, []).append(ratio)
        entry["speedup_by_category"] = {c: round(statistics.median(v), 4) for c, v in sorted(cats.items())}
        # what each prompt gave: for comparing runs of two versions, or reading the outputs
        entry["outputs"] = outputs(prompts, rs, per_prompt, equal[r.name])
        runners_out.append(entry)
    plain_rss = next((e["peak_rss_mb"] for e in runners_out if e["name"] == "plain"), None)
    for e in runners_out:
        e["rss_over_plain_mb"] = (round(e["peak_rss_mb"] - plain_rss, 1)
                                  if e["peak_rss_mb"] is not None and plain_rss is not None else None)
    return {
        "edge_eagle_bench": 1,
        "machine": machine,
        "settings": {k: v for k, v in asdict(o).items() if k not in ("memory", "warmup")},
        "target": Path(bench.target_path).name,
        "prompts": {"set": o.prompts, "count": len(prompts),
                    "categories": sorted({p.category for p in prompts})},
        "cost_model": {"target_step_s": round(c1, 6), "c": {str(n): round(v, 4) for n, v in c_rel.items()},
                       "drafter_step": {(label(k) if k else "drafter"): round(v, 4) for k, v in d_rel.items()},
                       "formula": "speedup(k) = tau / (c(k+1) + k * d); tree of N nodes: tau / (c(N+1) + "
                                  "depth * d); memory-bound: c(n) = 1 for n <= "
                                  f"{MEMORY_BOUND_MAX_N}, n / {MEMORY_BOUND_MAX_N} beyond"},
        "runners": runners_out,
        "numeric_noise_logits": noise,
        "skipped": bench.skipped,
    }


def outputs(prompts: list[BenchPrompt], rs: list[RunResult], speedups: list[float | None],
            equal: list[bool]) -> list[dict[str, Any]]:
    """Each prompt's text, speed against plain decoding, greedy equality and counts."""
    return [{"prompt": p.id, "text": x.text, "generated": x.generated,
             "tokens_per_second": round(x.tokens_per_second, 3),
             "speedup": None if speedup is None else round(speedup, 4),
             "greedy_equals_plain": same,
             "verify_steps": x.stats.verify_steps if x.stats else None,
             "drafted": x.stats.drafted if x.stats else None,
             "accepted": x.stats.accepted if x.stats else None}
            for p, x, speedup, same in zip(prompts, rs, speedups, equal)]


def predict(r: Runner, entry: dict[str, Any], c_rel: dict[int, float], d_rel: dict[str, float]) -> dict[str, Any]:
    """The cost model's speedup from the measured tau: tau / (c(k+1) + k d), here and memory-bound;
    for a tree of N nodes, tau / (c(N+1) + depth d), with its measured mean depth."""
    tau, k = entry.get("tau"), r.k
    if r.tree and tau is not None:
        d = d_rel.get(r.drafter or "", None)
        n1, depth = r.tree + 1, entry.get("tree_depth_mean") or 0.0
        if d is None or n1 not in c_rel:
            return {"predicted_speedup": None, "predicted_speedup_memory_bound": None}
        return {"predicted_speedup": round(tau / tree_cycle_cost(c_rel[n1], depth, d), 4),
                "predicted_speedup_memory_bound": round(tau / tree_cycle_cost(memory_bound_cost(n1), depth, d), 4)}
    if tau is None or not isinstance(k, int):
        return {"predicted_speedup": 1.0 if r.kind == "plain" else None,
                "predicted_speedup_memory_bound": 1.0 if r.kind == "plain" else None}
    d = 0.0 if r.kind == "prompt-lookup" else d_rel.get(r.drafter or "", None)
    if d is None or (k + 1) not in c_rel:
        return {"predicted_speedup": None, "predicted_speedup_memory_bound": None}
    here = predicted_speedup(tau, k, c_rel[k + 1], d)
    gpu = predicted_speedup(tau, k, memory_bound_cost(k + 1), d)
    return {"predicted_speedup": round(here, 4), "predicted_speedup_memory_bound": round(gpu, 4)}

