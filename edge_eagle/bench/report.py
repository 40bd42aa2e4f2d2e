"""`edge-eagle bench` outputs: the JSON report, a Markdown table and two PNG plots."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ..fsutil import atomic_write


def _fmt(x: Any, spec: str = ".2f", none: str = "–") -> str:
    return none if x is None else format(x, spec)


def markdown(report: dict[str, Any]) -> str:
    m, p = report["machine"], report["prompts"]
    s = report["settings"]
    lines = [
        f"Target `{report['target']}`, {p['count']} prompts ({p['set']}; {len(p['categories'])} categories), "
        f"greedy, up to {s['max_tokens']} tokens each.",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['threads']} threads, {m['memory_gib']} GiB, {m['backend']}"
        + (f"; flash attention {m['flash_attn']}" if m.get("flash_attn") else "")
        + (f"; other programs' load during the runs: {m['other_load_during_run']} cores"
           if m.get("other_load_during_run") is not None else "") + ".",
        "Speedup = per-prompt tokens/s ratio against plain decoding, runners interleaved prompt by prompt"
        + (f" and round by round ({s['rounds']} rounds, each runner's median-speed run per prompt)"
           if s.get("rounds", 1) > 1 else "")
        + ": median (min–max). Predicted = cost model tau / (c(k+1) + k·d) with this machine's c(n); "
        "memory-bound = the same with c(n) = 1 for n ≤ 8. Greedy = plain: outputs identical to plain "
        "decoding; near-tie: they differ first where the target's top-2 logits are closer than llama.cpp's "
        f"own batch-shape noise on this model ({_fmt(report.get('numeric_noise_logits'), '.2f')} logits, "
        "measured in the run), listed per runner in the JSON.",
        "",
        "| runner | tokens/s | speedup | tau | acceptance by position | time verify/draft/other | peak RSS MB "
        "(+ over plain) | greedy = plain | predicted | memory-bound |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runners"]:
        pos = " ".join(f"{x:.2f}" for x in r["per_position_acceptance"][:5]) or "–"
        if len(r["per_position_acceptance"]) > 5:
            pos += " …"
        ts = r.get("time_split")
        split = f"{ts['verify']:.0%}/{ts['draft']:.0%}/{ts['overhead']:.0%}" if ts else "–"
        speed = (f"{r['speedup']:.2f}× ({r['speedup_min']:.2f}–{r['speedup_max']:.2f})"
                 if r["speedup"] is not None else "–")
        rss = _fmt(r["peak_rss_mb"], ".0f")
        if r.get("rss_over_plain_mb") is not None and r["name"] != "plain":
            rss += f" ({r['rss_over_plain_mb']:+.0f})"
        eq = r["greedy_equals_plain"]
        ties = eq.get("near_tie_divergences", 0)
        eq_s = f"{eq['equal']}/{eq['prompts']}" + (f" (+{ties} near-tie)" if ties else "")
        lines.append(f"| {r['name']} | {r['tokens_per_second']:.1f} | {speed} | {_fmt(r['tau'])} | {pos} | {split} | "
                     f"{rss} | {eq_s} | {_fmt(r['predicted_speedup'])} | "
                     f"{_fmt(r['predicted_speedup_memory_bound'])} |")
    same = [r for r in report["runners"] if r["name"] != "plain" and r.get("speedup_same_text")]
    if same and same[0]["speedup_same_text"]["prompts"]:
        n = same[0]["speedup_same_text"]["prompts"]
        lines.append(f"\nOn the {n} of {report['prompts']['count']} prompts where every runner wrote plain "
                     "decoding's text (the same work, paired): " +
                     ", ".join(f"{r['name']} {r['speedup_same_text']['median']:.2f}×" for r in same) + ".")
    elif same:
        lines.append("\nNo prompt where every runner wrote plain decoding's text: the speedups above compare "
                     "runners that decoded different texts after a near-tie.")
    for sk in report.get("skipped", []):
        lines.append(f"\nNot run: {sk['runner']} ({sk['why']}).")
    cm = report["cost_model"]
    lines.append("")
    lines.append("Target batch cost c(n), relative to one token: " +
                 ", ".join(f"c({n})={v:.2f}" for n, v in cm["c"].items()) +
                 f" (one token: {cm['target_step_s'] * 1000:.1f} ms). Drafter step d: " +
                 (", ".join(f"{k} {v:.3f}" for k, v in cm["drafter_step"].items()) or "–") + ".")
    return "\n".join(lines) + "\n"


def plots(report: dict[str, Any], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    spec = [r for r in report["runners"] if r["per_position_acceptance"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in spec:
        acc = r["per_position_acceptance"]
        ax.plot(range(1, len(acc) + 1), acc, marker="o", label=r["name"])
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"Per-position acceptance ({report['target']}, {report['prompts']['set']})")
    if spec:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(out_dir / "acceptance.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    others = [r for r in report["runners"] if r["name"] != "plain"]
    cats = report["prompts"]["categories"]
    fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(cats) + 2), 4 + 0.25 * len(others)))
    width = 0.8 / max(1, len(others))
    for j, r in enumerate(others):
        vals = [r["speedup_by_category"].get(c, 0.0) for c in cats]
        ax.bar([i + j * width for i in range(len(cats))], vals, width, label=r["name"])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cats))])
    ax.set_xticklabels(cats, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("speedup vs plain (median)")
    ax.set_title("Speedup by category")
    if others:  # below the axes: the bars near 1.0 stay visible
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=2, frameon=False)
    fig.tight_layout()
    paths.append(out_dir / "speedup_by_category.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def write_all(report: dict[str, Any], out_dir: Path, json_path: Path | None = None) -> dict[str, Path]:
    """bench.json (or json_path), bench.md and the two plots, each written atomically."""
    out_dir = Path(out_dir)
    data = (json.dumps(report, indent=2) + "\n").encode()
    written = {"json": Path(json_path) if json_path else out_dir / "bench.json"}
    atomic_write(written["json"], data)
    if json_path:
        atomic_write(out_dir / "bench.json", data)
    written["markdown"] = out_dir / "bench.md"
    atomic_write(written["markdown"], markdown(report).encode())
    tmp = Path(tempfile.mkdtemp(dir=out_dir, prefix=".plots."))
    try:
        for p in plots(report, tmp):
            os.replace(p, out_dir / p.name)
            written[p.stem] = out_dir / p.name
    finally:
        for leftover in tmp.iterdir():
            leftover.unlink()
        tmp.rmdir()
    return written
