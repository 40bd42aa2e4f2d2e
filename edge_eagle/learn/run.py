"""`edge-eagle learn adapt`: one adaptation of a store's drafter on the requests it has kept.

The starting weights are the version in use (versions.py; the base drafter before the first).
The general set that guards against forgetting is the first `general_prompts` MT-bench first
turns taken from its 8 categories in turn, answered by the target (greedy, 96 tokens), kept as
token ids in the store's folder (general.json) so every later adaptation is scored on the same
text. The next `replay_prompts` such questions, answered the same way, are mixed into the
training data (never scored on), so that the drafter keeps what it knew of general chat:
measured on HumanEval requests, training on the user's requests alone raised their simulated
tau 1.38 -> 2.01 but lost 4.6% on the general set, beyond the 2% the rule allows.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from ..errors import EdgeEagleError
from ..fsutil import atomic_write
from .adapt import AdaptOptions, Request, adapt, model_weights
from .store import WORK, LearnStore
from .versions import Versions

GENERAL = "general.json"
GENERAL_TOKENS = 96
SAMPLES = "samples.json"  # in work/: sampled answers, kept for later adaptations
SAMPLE_TOKENS = 128  # a sampled answer's most tokens (a file chunk's continuation is longer)


def sampled_answers(store_dir: Path, target_path: str | os.PathLike[str], drafter: str | os.PathLike[str],
                    requests: list[Request], n: int, temperature: float, max_answer: int,
                    n_threads: int | None = None, log: Callable[[str], Any] = print) -> list[Request]:
    """n answers per request's prompt sampled from the target (speculatively with `drafter`,
    which keeps the target's distribution), each at most as long as the kept answer; seeded per
    prompt and kept in work/samples.json, so a later adaptation samples only new prompts."""
    import hashlib

    if n <= 0 or not requests:
        return []
    path = store_dir / WORK / SAMPLES
    try:
        cache = json.loads(path.read_text()) if path.is_file() else {}
    except ValueError:
        cache = {}
    keys = [hashlib.sha1(json.dumps([list(p), temperature]).encode()).hexdigest() for p, _ in requests]
    todo = [(key, p, a) for key, (p, a) in zip(keys, requests) if len(cache.get(key, [])) < n]
    if todo:
        from ..api import EdgeEagle

        log(f"sampling {n} more answers for each of {len(todo)} prompts with the target")
        longest = max(len(p) + min(len(a), max_answer) for _, p, a in todo)
        with EdgeEagle(target_path, str(drafter), n_ctx=longest + 64, n_threads=n_threads) as ee:
            for key, prompt, answer in todo:
                got = cache.get(key, [])
                for i in range(len(got), n):
                    gen = ee.generate(list(prompt), max_tokens=max(1, min(len(answer), max_answer, SAMPLE_TOKENS)),
                                      temperature=temperature, seed=int(key[:8], 16) + i, history=False)
                    got.append(gen.result().tokens)
                cache[key] = got
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(cache))
    return [(list(p), a) for key, (p, _) in zip(keys, requests) for a in cache[key][:n] if a]


def general_requests(store_dir: Path, target_path: str | os.PathLike[str], n: int,
                     log: Callable[[str], Any] = print, n_threads: int | None = None) -> list[Request]:
    """The store's first n general requests (made on first use: MT-bench first turns, taken from
    each of its 8 categories in turn, and the target's answers): the general set, then the
    replay data after it. A file made from other questions is made again."""
    from ..bench.prompts import by_category_in_turn, load_prompts

    if n <= 0:
        return []
    prompts = by_category_in_turn(load_prompts("mtbench"))[:n]
    path = store_dir / GENERAL
    if path.is_file():
        data = json.loads(path.read_text())
        if [r.get("id") for r in data[:n]] == [p.id for p in prompts]:
            return [(r["prompt"], r["answer"]) for r in data[:n]]
    from ..api import EdgeEagle

    log(f"answering {n} MT-bench prompts with the target for the general set (once per store)")
    out = []
    with EdgeEagle(target_path, None, n_ctx=2048, n_threads=n_threads) as ee:
        for p in prompts:
            text = ee.apply_chat_template([{"role": "user", "content": p.text}])
            ids = ee.target.tokenize(text, add_special=False)
            answer = ee.generate(ids, max_tokens=GENERAL_TOKENS, speculative=False, history=False).result()
            out.append({"id": p.id, "prompt": ids, "answer": answer.tokens})
    atomic_write(path, json.dumps(out) + "\n")
    return [(r["prompt"], r["answer"]) for r in out]


def adapt_store(target_path: str | os.PathLike[str], base_drafter: str | os.PathLike[str], store: LearnStore,
                opts: AdaptOptions, *, general_prompts: int = 24, replay_prompts: int = 32,
                out: str | os.PathLike[str] | None = None,
                outtype: str = "q8_0", progress: bool = True, log: Callable[[str], Any] = print,
                n_threads: int | None = None, watch: list[Request] | None = None) -> dict[str, Any]:
    """Adapt the drafter in use for this store on its requests; keep the candidate as the next
    version (and write it to `out` too) only when adapt() accepts it. Returns the report.
    watch: requests scored for the report's history only (adapt's)."""
    from edge_eagle.converters.gguf_out import write_eagle3

    from ..target import Target

    versions = Versions(store.directory)
    start = versions.current_path() or Path(base_drafter)
    requests = [(p, a) for p, a, _ in store.requests()]
    if len(requests) < 2:
        raise EdgeEagleError(f"Adapting needs at least 2 kept requests and the store holds {len(requests)}; "
                             "use chat or serve with --learn for a while first.")
    mt = general_requests(store.directory, target_path, general_prompts + replay_prompts if general_prompts else 0,
                          log, n_threads)
    general, replay = mt[:general_prompts], mt[general_prompts:]
    longest = max(len(p) + min(len(a), opts.max_answer) for p, a in requests + mt + (watch or []))
    target = Target(target_path, n_ctx=max(64, longest + 8), n_batch=512, n_threads=n_threads)
    bar = None
    try:
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=opts.steps, desc="adapt", unit="step")

        def report(phase: str, done: int, total: int) -> None:
            if bar is not None:
                bar.set_postfix_str(phase)
                if phase == "train":
                    bar.update(done - bar.n)

        def augment(train: list[Request]) -> list[Request]:
            """The training requests' sampled answers, and the replayed ones' (which keeps the
            share of general text in training as it was without samples)."""
            return sampled_answers(store.directory, target_path, start, train + replay, opts.samples,
                                   opts.sample_temperature, opts.max_answer, n_threads, log)

        result, model = adapt(target, start, requests, store.directory / WORK, opts, general=general,
                              replay=replay, watch=watch or (), augment=augment, progress=report)
        if bar is not None:
            bar.close()
        version = versions.current
        written = None
        if result.accepted:
            def write(path: Path) -> None:
                write_eagle3(path, model_weights(model), model.cfg, target.gguf, outtype=outtype,
                             provenance={"adapted_from": os.path.basename(start), "learn_store": str(store.path)},
                             name="eagle3 drafter (adapted)")

            version, written = versions.add(write, {"tau_before": result.tau_before, "tau_after": result.tau_after,
                                                    "general_before": result.general_before,
                                                    "general_after": result.general_after,
                                                    "requests": result.train_requests})
            if out is not None:
                write(Path(out))
    finally:
        target.close()
    return {**result.to_dict(), "started_from": str(start), "version": version,
            "written": None if written is None else str(written), "out": str(out) if out and written else None}
