"""`edge-eagle bench`: every runner on the same prompts, interleaved prompt by prompt (and round
by round, with --rounds); then the memory phase, the divergence check and the report
(summary.py)."""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
from typing import Any, Callable, Sequence

from ..costs import measure_batch_costs
from ..errors import EdgeEagleError
from ..threads import LoadMeter, current_decision, decide
from .divergence import divergences
from .memory import memory_phase
from .options import BenchOptions
from .prompts import load_prompts
from .runners import EngineRunner, Runner, RunResult, UpstreamRunner
from .suite import Bench
from .summary import summarize

__all__ = ["BenchOptions", "run_bench"]


def _machine(threads: int, repack: str | None, flash_attn: str | None = None, n_gpu_layers: int = 0) -> dict[str, Any]:
    from .. import system

    mem = None
    try:
        mem = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    return {"cpu": system.cpu_name(), "cores": os.cpu_count(), "threads": threads,
            "memory_gib": mem, "os": platform.platform(), "python": platform.python_version(),
            "backend": "llama.cpp CPU (llama-cpp-python 0.3.36)", "repack": system.repack_for(0, None, repack).reason,
            "flash_attn": system.flash_attn_for(n_gpu_layers, flash_attn).reason}


def median_run(runs: Sequence[RunResult]) -> RunResult:
    """The run with the median tokens/s (the lower of the two middle ones for an even count)."""
    ordered = sorted(runs, key=lambda r: r.tokens_per_second)
    return ordered[(len(ordered) - 1) // 2]


def _prompt_rounds(runners: list[Runner], i: int, rounds: int, tokens: list[int], text: str, n: int,
                   started: Callable[[Runner], None], done: Callable[[], None]) -> dict[str, RunResult]:
    """Every runner on prompt i, `rounds` times in rotating order; each runner's median run. An
    engine runner whose answers join its engine's history (auto's) adds only its last round's,
    so no round drafts from an earlier round's answer to the same prompt."""
    keeps = {r.name: r.history for r in runners if isinstance(r, EngineRunner)}
    runs: dict[str, list[RunResult]] = {r.name: [] for r in runners}
    try:
        for j in range(rounds):
            shift = (i + j) % len(runners)  # rotate: no runner always first
            for r in runners[shift:] + runners[:shift]:
                if isinstance(r, EngineRunner):
                    r.history = keeps[r.name] and j == rounds - 1
                started(r)
                runs[r.name].append(r.run(tokens, text, n))
                done()
    finally:
        for r in runners:
            if isinstance(r, EngineRunner):
                r.history = keeps[r.name]
    return {name: median_run(found) for name, found in runs.items()}


def _shows(bar: Any, label: str) -> Callable[[Runner], None]:
    """The progress bar's note for a runner's run on the prompt `label`."""
    return lambda r: bar.set_postfix_str(f"{label}: {r.name}")


def run_bench(opts: BenchOptions, progress: bool = True) -> dict[str, Any]:
    from tqdm import tqdm

    if opts.rounds < 1:
        raise EdgeEagleError(f"--rounds must be 1 or more, got {opts.rounds}.")
    prompts = load_prompts(opts.prompts, opts.limit, opts.every)
    # the thread policy's count for this machine now, fixed for every runner (a fair comparison)
    decision = current_decision(opts.threads)
    if decision.reason == "busy":
        print(f"edge-eagle bench: warning: other programs keep {decision.other_load:.1f} of {decision.cores} cores "
              "busy; timings will be noisy and slower (close them, or compare only ratios from this run).",
              file=sys.stderr)
    opts = dataclasses.replace(opts, threads=decision.threads)
    meter = LoadMeter()
    bench = Bench(opts)
    try:
        runners = bench.runners
        n_mem = sum(not isinstance(r, UpstreamRunner) for r in runners) if opts.memory else 0
        bar = tqdm(total=len(prompts) * len(runners) * opts.rounds + n_mem + 2, desc="bench", unit="run",
                   disable=not progress, file=sys.stderr)
        bar.set_postfix_str("measuring target costs")
        costs = measure_batch_costs(bench.engines[0].target, max([8, *opts.ks, *opts.trees]) + 1, reps=5) or {}
        bar.update(1)
        if opts.warmup:
            tokens, text = bench.prompt_tokens(prompts[0])
            for r in runners:
                r.run(tokens, text, min(16, opts.max_tokens))
        for eng in bench.engines:  # the warm-up's answers must not be drafted from
            eng.reset_history()
        results: dict[str, list[RunResult]] = {r.name: [] for r in runners}
        prompt_ids: list[list[int]] = []
        for i, p in enumerate(prompts):
            tokens, text = bench.prompt_tokens(p)
            prompt_ids.append(tokens)
            label = f"{p.category} {p.id}"
            medians = _prompt_rounds(runners, i, opts.rounds, tokens, text, opts.max_tokens,
                                     _shows(bar, label), lambda: bar.update(1))
            for name, result in medians.items():
                results[name].append(result)
        peak = memory_phase(bench, prompts[0], bar.update) if opts.memory else {}
        bar.set_postfix_str("checking divergences")
        noise, found = divergences(bench, prompts, prompt_ids, results)
        bar.update(1)
        bar.close()
        machine = _machine(decision.threads, opts.repack, opts.flash_attn, opts.n_gpu_layers)
        load = meter.sample()
        machine["thread_policy"] = decision.describe()
        machine["other_load_during_run"] = None if load is None else round(load, 2)
        if load is not None and decide(decision.cores, load).reason == "busy":
            print(f"edge-eagle bench: warning: other programs used {load:.1f} cores on average during the timed "
                  "runs; the figures are from a busy machine.", file=sys.stderr)
        return summarize(bench, prompts, results, costs, peak, machine, found, noise)
    finally:
        bench.close()


