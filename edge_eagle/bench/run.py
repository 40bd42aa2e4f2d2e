"""`edge-eagle bench`: every runner on the same prompts, interleaved prompt by prompt, then
speedups as per-prompt ratios against plain decoding, acceptance, time split, peak RSS,
a greedy-equality check, and a cost model's predictions beside the measured speedups."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import EdgeEagleError
from .prompts import BenchPrompt, load_prompts
from .runners import (EngineRunner, PromptLookupRunner, RunResult, Runner, UpstreamRunner, run_measured,
                      upstream_binary)

MEMORY_BOUND_MAX_N = 8  # the projection: a batch of up to 8 tokens costs one step


@dataclass
class BenchOptions:
    prompts: str = "mtbench"
    limit: int | None = None
    every: int = 1
    max_tokens: int = 96
    target: str | None = None  # None: the embedded default target
    drafters: list[str] = field(default_factory=lambda: ["default"])
    ks: list[int] = field(default_factory=lambda: [3])
    auto: bool = True
    upstream: bool = True  # the C++ loop, when its binary is built (or build_upstream)
    build_upstream: bool = False
    prompt_lookup_k: int | None = 3  # None: no prompt-lookup runner
    draft_model: str | None = None  # a classic small draft GGUF for the target (upstream draft-simple)
    draft_model_k: int = 3
    n_ctx: int = 2048
    threads: int | None = None
    memory: bool = True  # measure each runner's peak RSS in a child process
    warmup: bool = True


def _label(path: str) -> str:
    return "default" if path == "default" else Path(path).name.removesuffix(".gguf")


class Bench:
    """Builds the runners for a set of options and owns their models."""

    def __init__(self, opts: BenchOptions):
        from ..api import EdgeEagle
        from .. import defaults

        self.opts = opts
        self.target_path = str(opts.target or defaults.default_target())
        self.drafter_paths = [self._drafter_path(d) for d in opts.drafters if d != "none"]
        self.engines: list[EdgeEagle] = []
        self.runners: list[Runner] = []
        self.skipped: list[dict[str, str]] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _drafter_path(self, d: str) -> str:
        from .. import defaults

        if d != "default":
            if not Path(d).is_file():
                raise EdgeEagleError(f"Drafter {d} not found; pass an eagle3 GGUF path or 'default'.")
            return d
        path = defaults.default_drafter() if self.opts.target is None else None
        if path is None:
            raise EdgeEagleError("There is no default drafter for this target; pass --drafter PATH.gguf.")
        return str(path)

    def _build(self) -> None:
        from ..api import EdgeEagle

        o = self.opts
        many = len(self.drafter_paths) > 1
        k_max = max([8] + list(o.ks))
        if not self.drafter_paths:  # plain decoding and the non-EAGLE runners only
            self.engines.append(EdgeEagle(self.target_path, None, n_ctx=o.n_ctx, n_threads=o.threads))
            self.runners.append(EngineRunner(self.engines[0], None))
        for i, dpath in enumerate(self.drafter_paths):
            eng = EdgeEagle(self.target_path, dpath, n_ctx=o.n_ctx, n_threads=o.threads, k_max=k_max)
            self.engines.append(eng)
            if i == 0:
                self.runners.append(EngineRunner(eng, None))
            for k in [*o.ks, *(["auto"] if o.auto else [])]:
                self.runners.append(EngineRunner(eng, k, dpath, label=_label(dpath) if many else None))
        target = self.engines[0].target
        echo = lambda toks: "".join(target.token_bytes(t, special=True).decode("utf-8", "replace")  # noqa: E731
                                    for t in toks)
        binary = None
        if o.upstream or o.draft_model:
            binary = upstream_binary(build=o.build_upstream)
            if binary is None:
                self.skipped.append({"runner": "llama.cpp (C++ loop)", "why": "llama-speculative-simple is not "
                                     "built; run scripts/build_upstream.sh or pass --build-upstream"})
        if binary is not None and o.upstream:
            for dpath in self.drafter_paths:
                for k in o.ks:
                    name = f"llama.cpp draft-eagle3 k={k}" + (f" [{_label(dpath)}]" if many else "")
                    self.runners.append(UpstreamRunner(binary, self.target_path, dpath, k, o.n_ctx, o.threads,
                                                       name=name, prompt_echo=echo))
        if o.prompt_lookup_k:
            eos = {t for t in range(target.n_vocab) if target.is_eog(t)} if target.n_vocab < 300_000 else {target.eos}
            self.runners.append(PromptLookupRunner(self.target_path, o.prompt_lookup_k, o.n_ctx, o.threads, eos))
        if o.draft_model:
            if not Path(o.draft_model).is_file():
                raise EdgeEagleError(f"Draft model {o.draft_model} not found; pass a GGUF path to --draft-model.")
            if binary is not None:
                self.runners.append(UpstreamRunner(binary, self.target_path, o.draft_model, o.draft_model_k,
                                                   o.n_ctx, o.threads, spec_type="draft-simple",
                                                   name=f"draft-model k={o.draft_model_k}", prompt_echo=echo))

    def prompt_tokens(self, p: BenchPrompt) -> tuple[list[int], str]:
        """The chat-formatted prompt, tokenized as llama.cpp's tools do (special tokens parsed)."""
        eng = self.engines[0]
        text = eng.apply_chat_template([{"role": "user", "content": p.text}]) if eng.target.chat_template else p.text
        tokens = eng.target.tokenize(text, add_special=True, parse_special=True)
        if len(tokens) + self.opts.max_tokens + 16 > self.opts.n_ctx:
            tokens = tokens[-(self.opts.n_ctx - self.opts.max_tokens - 16):]
            text = eng.target.detokenize(tokens)
        return tokens, text

    def close(self) -> None:
        for r in self.runners:
            r.close()
        for e in self.engines:
            e.close()
        self.runners, self.engines = [], []


def measure_costs(engine, n_max: int, reps: int = 5) -> dict[int, float]:
    """Median seconds of one target decode of n tokens (n = 1..n_max) after a short context."""
    from ..api import calibrate
    from ..controller import KController

    ctl = KController(k_max=n_max - 1)
    calibrate(engine.target, ctl, n_max, reps=reps)
    return dict(ctl.costs.verify_s)


def _summary(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "min": None, "max": None, "q1": None, "q3": None}
    v = sorted(values)
    q = statistics.quantiles(v, n=4) if len(v) >= 2 else [v[0]] * 3
    return {"median": round(statistics.median(v), 4), "min": round(v[0], 4), "max": round(v[-1], 4),
            "q1": round(q[0], 4), "q3": round(q[2], 4)}


def _greedy_equal(r: RunResult, plain: RunResult, n: int) -> bool:
    if r.tokens is not None and plain.tokens is not None:
        return r.tokens[:n] == plain.tokens[:n]
    text, ref = r.text, plain.text
    if len(text) >= len(ref):
        return text.startswith(ref)
    return ref.startswith(text)  # stopped early (end of generation)


def _machine(threads: int | None) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        mem = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    from .._llama import n_threads_default

    return {"cpu": cpu, "cores": os.cpu_count(), "threads": threads or n_threads_default(), "memory_gib": mem,
            "os": platform.platform(), "python": platform.python_version(), "backend": "llama.cpp CPU (llama-cpp-python "
            "0.3.36)"}


def _memory_phase(bench: Bench, prompt: BenchPrompt, progress) -> dict[str, int]:
    """Peak RSS of each in-process runner alone (plain target; target + drafter; ...), each
    measured in a fresh child process running one prompt."""
    out: dict[str, int] = {}
    o = bench.opts
    for r in bench.runners:
        if isinstance(r, UpstreamRunner):
            continue
        spec = {"kind": r.kind, "k": r.k, "drafter": getattr(r, "drafter", None), "target": bench.target_path,
                "n_ctx": o.n_ctx, "threads": o.threads, "prompt": prompt.text, "max_tokens": o.max_tokens}
        rc, _, err, rss = run_measured([sys.executable, "-m", "edge_eagle.bench.memory", json.dumps(spec)])
        if rc != 0:
            raise EdgeEagleError(f"measuring memory of {r.name} failed: {err.strip().splitlines()[-1:]}")
        out[r.name] = rss
        progress(1)
    return out


def run_bench(opts: BenchOptions, progress: bool = True) -> dict[str, Any]:
    from tqdm import tqdm

    prompts = load_prompts(opts.prompts, opts.limit, opts.every)
    bench = Bench(opts)
    try:
        runners = bench.runners
        n_mem = sum(not isinstance(r, UpstreamRunner) for r in runners) if opts.memory else 0
        bar = tqdm(total=len(prompts) * len(runners) + n_mem + 2, desc="bench", unit="run", disable=not progress,
                   file=sys.stderr)
        bar.set_postfix_str("measuring target costs")
        costs = measure_costs(bench.engines[0], max([8] + list(opts.ks)) + 1)
        bar.update(1)
        if opts.warmup:
            tokens, text = bench.prompt_tokens(prompts[0])
            for r in runners:
                r.run(tokens, text, min(16, opts.max_tokens))
        results: dict[str, list[RunResult]] = {r.name: [] for r in runners}
        prompt_ids: list[list[int]] = []
        for i, p in enumerate(prompts):
            tokens, text = bench.prompt_tokens(p)
            prompt_ids.append(tokens)
            order = runners[i % len(runners):] + runners[: i % len(runners)]  # rotate: no runner always first
            for r in order:
                bar.set_postfix_str(f"{p.category} {p.id}: {r.name}")
                results[r.name].append(r.run(tokens, text, opts.max_tokens))
                bar.update(1)
        peak = _memory_phase(bench, prompts[0], bar.update) if opts.memory else {}
        bar.set_postfix_str("checking divergences")
        noise, divergences = _divergences(bench, prompts, prompt_ids, results)
        bar.update(1)
        bar.close()
        return _report(bench, prompts, results, costs, peak, divergences, noise)
    finally:
        bench.close()


def numeric_noise(target, prompt: list[int], continuation: list[int]) -> float:
    """How far llama.cpp's own logits move with the batch shape alone: the largest logit
    difference between decoding `continuation` one token at a time and two at a time after
    the same prompt (same model, same context; on CPU, kernels and thread splits change with
    the batch and context length). A divergence from plain decoding where the top-2 gap is
    within this is rounding, not a fault of the speculative loop."""
    runs = []
    for bs in (1, 2):
        target.memory.clear()
        target.set_capture(())
        target.prefill(prompt)
        rows = []
        for i in range(0, len(continuation), bs):
            chunk = continuation[i:i + bs]
            rows.append(np.asarray(target.decode(chunk, len(prompt) + i, "all").logits, dtype=np.float64))
        runs.append(np.concatenate(rows))
    target.memory.clear()
    n = min(len(runs[0]), len(runs[1]))
    return float(np.abs(runs[0][:n] - runs[1][:n]).max()) if n else 0.0


def _divergences(bench: Bench, prompts: list[BenchPrompt], prompt_ids: list[list[int]],
                 results: dict[str, list[RunResult]]) -> tuple[float, dict[str, list[dict[str, Any]]]]:
    """For every output that differs from plain decoding: where it first differs, and the gap
    between the target's top two logits there on plain decoding's own prefix. Greedy
    speculation is exact up to floating point: llama.cpp's kernels round differently for
    different batch shapes, which can flip a near-tie; a divergence at a clear winner is a bug."""
    target = bench.engines[0].target
    plain = results["plain"]
    out: dict[str, list[dict[str, Any]]] = {}
    longest = max(range(len(prompts)), key=lambda i: len(prompt_ids[i]))
    noise = round(numeric_noise(target, prompt_ids[longest], (plain[longest].tokens or [])[:24]), 4)
    for name, rs in results.items():
        for i, (x, p) in enumerate(zip(rs, plain)):
            if name == "plain" or _greedy_equal(x, p, bench.opts.max_tokens):
                continue
            ref = p.tokens or []
            if x.tokens is not None:
                j = next((n for n, (a, b) in enumerate(zip(x.tokens, ref)) if a != b), min(len(x.tokens), len(ref)))
            else:  # text only: the plain token whose text holds the first differing character
                c = next((n for n, (a, b) in enumerate(zip(x.text, p.text)) if a != b), min(len(x.text), len(p.text)))
                j, length = 0, 0
                while j < len(ref):
                    piece = len(target.detokenize([ref[j]]))
                    if length + piece > c:
                        break
                    length += piece
                    j += 1
            if j >= len(ref):
                continue
            target.memory.clear()
            target.set_capture(())
            logits = np.asarray(target.prefill(prompt_ids[i] + ref[:j]).logits[-1], dtype=np.float64)
            top2 = np.sort(logits)[-2:]
            out.setdefault(name, []).append({"prompt": prompts[i].id, "token": j,
                                             "top2_gap": round(float(top2[1] - top2[0]), 4)})
    target.memory.clear()
    return noise, out


def _report(bench: Bench, prompts: list[BenchPrompt], results: dict[str, list[RunResult]],
            costs: dict[int, float], peak: dict[str, int],
            divergences: dict[str, list[dict[str, Any]]] | None = None, noise: float = 0.0) -> dict[str, Any]:
    o = bench.opts
    plain = results["plain"]
    c1 = costs[1]
    c_rel = {n: costs[n] / c1 for n in sorted(costs)}
    # drafter step cost relative to one target step: edge-eagle's drafting time per drafted token
    d_rel: dict[str, float] = {}
    for r in bench.runners:
        if r.kind == "edge-eagle" and r.k != "auto":
            rs = results[r.name]
            drafted = sum(x.drafted for x in rs)
            t_draft = sum((x.time_split or {}).get("draft", 0.0) for x in rs)
            if drafted:
                d_rel[r.drafter or ""] = (t_draft / drafted) / c1
    runners_out = []
    for r in bench.runners:
        rs = results[r.name]
        gen = sum(x.generated for x in rs)
        secs = sum(x.seconds for x in rs)
        ratios = [x.tokens_per_second / p.tokens_per_second for x, p in zip(rs, plain) if p.tokens_per_second > 0]
        entry: dict[str, Any] = {"name": r.name, "kind": r.kind, "k": r.k,
                                 "drafter": _label(r.drafter) if r.drafter else None,
                                 "tokens_per_second": round(gen / secs, 3) if secs else 0.0}
        s = _summary(ratios)
        entry["speedup"] = s["median"]
        entry.update({f"speedup_{k}": v for k, v in s.items() if k != "median"})
        if rs and rs[0].spec:
            steps = sum(x.verify_steps for x in rs)
            acc = sum(x.accepted for x in rs)
            drafted = sum(x.drafted for x in rs)
            width = max((len(x.drafted_at) for x in rs), default=0)
            d_at = [sum(x.drafted_at[i] for x in rs if i < len(x.drafted_at)) for i in range(width)]
            a_at = [sum(x.accepted_at[i] for x in rs if i < len(x.accepted_at)) for i in range(width)]
            entry.update({"tau": round(1 + acc / steps, 4) if steps else None,
                          "per_position_acceptance": [round(a / d, 4) if d else 0.0 for a, d in zip(a_at, d_at)],
                          "acceptance_rate": round(acc / drafted, 4) if drafted else None,
                          "verify_steps": steps, "drafted": drafted, "accepted": acc})
        else:
            entry.update({"tau": None, "per_position_acceptance": [], "acceptance_rate": None})
        if rs and rs[0].time_split is not None:
            tot = sum(x.seconds for x in rs) or 1.0
            entry["time_split"] = {k: round(sum(x.time_split[k] for x in rs) / tot, 4)  # type: ignore[index]
                                   for k in ("verify", "draft", "overhead")}
        if r.kind == "edge-eagle" and r.k == "auto":
            entry["k_mean"] = round(statistics.mean(x.k_mean or 0.0 for x in rs), 3) if rs else None
        rss = peak.get(r.name) or max((x.peak_rss or 0 for x in rs), default=0)
        entry["peak_rss_mb"] = round(rss / 2**20, 1) if rss else None
        eq = sum(_greedy_equal(x, p, o.max_tokens) for x, p in zip(rs, plain))
        div = (divergences or {}).get(r.name, [])
        near = sum(d["top2_gap"] <= noise for d in div)
        entry["greedy_equals_plain"] = {"equal": eq, "prompts": len(rs), "ok": eq == len(rs),
                                        "near_tie_divergences": near,
                                        "explained": eq + near == len(rs)}
        entry["divergences"] = div
        entry.update(_predict(r, entry, c_rel, d_rel))
        cats: dict[str, list[float]] = {}
        for p, ratio in zip(prompts, ratios):
            cats.setdefault(p.category, []).append(ratio)
        entry["speedup_by_category"] = {c: round(statistics.median(v), 4) for c, v in sorted(cats.items())}
        runners_out.append(entry)
    plain_rss = next((e["peak_rss_mb"] for e in runners_out if e["name"] == "plain"), None)
    for e in runners_out:
        e["rss_over_plain_mb"] = (round(e["peak_rss_mb"] - plain_rss, 1)
                                  if e["peak_rss_mb"] is not None and plain_rss is not None else None)
    return {
        "edge_eagle_bench": 1,
        "machine": _machine(o.threads),
        "settings": {k: v for k, v in asdict(o).items() if k not in ("memory", "warmup")},
        "target": Path(bench.target_path).name,
        "prompts": {"set": o.prompts, "count": len(prompts),
                    "categories": sorted({p.category for p in prompts})},
        "cost_model": {"target_step_s": round(c1, 6), "c": {str(n): round(v, 4) for n, v in c_rel.items()},
                       "drafter_step": {(_label(k) if k else "drafter"): round(v, 4) for k, v in d_rel.items()},
                       "formula": "speedup(k) = tau / (c(k+1) + k * d); memory-bound: c(n) = 1 for n <= 8"},
        "runners": runners_out,
        "numeric_noise_logits": noise,
        "skipped": bench.skipped,
    }


def _predict(r: Runner, entry: dict[str, Any], c_rel: dict[int, float], d_rel: dict[str, float]) -> dict[str, Any]:
    """The cost model's speedup from the measured tau: tau / (c(k+1) + k d), here and memory-bound."""
    tau, k = entry.get("tau"), r.k
    if tau is None or not isinstance(k, int):
        return {"predicted_speedup": 1.0 if r.kind == "plain" else None,
                "predicted_speedup_memory_bound": 1.0 if r.kind == "plain" else None}
    d = 0.0 if r.kind == "prompt-lookup" else d_rel.get(r.drafter or "", None)
    if d is None or (k + 1) not in c_rel:
        return {"predicted_speedup": None, "predicted_speedup_memory_bound": None}
    here = tau / (c_rel[k + 1] + k * d)
    gpu = tau / (1.0 + k * d) if k + 1 <= MEMORY_BOUND_MAX_N else None
    return {"predicted_speedup": round(here, 4), "predicted_speedup_memory_bound": round(gpu, 4) if gpu else None}

