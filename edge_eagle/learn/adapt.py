"""Adapting a drafter to a user's requests: features and soft labels from the target on the kept
requests, fine-tuning from the drafter's current weights, and a candidate that is kept only when
it measures better.

1. The requests (learn/store.py) split by age: the newest `heldout` share (at least one) is the
   user's held-out slice, never trained on; the rest is the training data.
2. Each request's prompt and answer ids go through the target once (a prefill, no generation):
   the captured layer inputs the drafter reads and the target's top-16 next-token probabilities
   (train/extract.py's format).
3. The drafter, read back from its GGUF (learn/weights.py), trains with the trainer's
   training-time-test loss (train/ttt.py) at a fine-tuning learning rate, for at most `steps`
   steps or `minutes` of wall time, whichever ends first. The rate warms up linearly over
   `warmup` steps, then falls by a cosine to `lr_final` of itself at step `steps` (lr_scale; a
   run cut short by `minutes` stops higher on the curve). Its draft vocabulary (d2t) stays.
4. Candidate and current drafter are scored by simulated greedy acceptance on the held-out
   slice and, when given, on a fixed general set: the tau that greedy decoding with a chain of
   `ttt_steps` drafts would report (train/trainer.simulated_acceptance's tau_decode, within
   0.02 of llama.cpp's measured tau on HumanEval requests). Six times in a run (and at its end)
   the weights are scored; the candidate is the best of them on the slice among those within
   the general margin (early stopping), or the last when none is. The candidate is accepted
   only if it wins on the slice by more than `min_gain` and loses at most `general_margin`
   (relative) on the general set. General requests given as
   `replay` join the training data, so that fine-tuning keeps what the drafter knew.
5. The training prompts' answers can be augmented (`augment`: learn/run.py's sampled answers): the
   target samples `samples` more answers to each, at `sample_temperature`. On 32 HumanEval
   requests, simulated decoding tau on unseen problems went 1.376 -> 1.505 after 120 steps on
   the kept answers alone, and -> 1.563 after 120 (1.611 after 240) with two sampled answers
   more per prompt.
6. The draft vocabulary can follow the user's text (`vocab_swap`): a drafter's vocabulary is
   the most frequent tokens of its own training data, and a domain's text has others (93% of
   HumanEval answers' tokens are in the shipped drafter's 8,192, so about one position in 14
   can never be drafted). Tokens the training text holds at least `vocab_min_count` times and
   the vocabulary lacks replace entries that none of the text at hand uses (the highest ids
   first: a BPE vocabulary numbers its rarer merges later), at most `vocab_swap` of them; a new
   entry's lm_head row starts from the target's own output row for that token, scaled to the
   drafter's rows, as training initialises the head. The vocabulary stays in ascending order.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import EdgeEagleError

Request = tuple[Sequence[int], Sequence[int]]  # (prompt ids, answer ids)


@dataclass
class AdaptOptions:
    minutes: float = 10.0  # wall-time bound of the training steps
    steps: int = 900  # optimizer steps at most (unseen HumanEval problems still gained at 900 with 4 samples)
    lr: float = 2e-4  # a fine-tuning rate: the drafter starts trained
    lr_final: float = 1.0  # the rate at step `steps` as a share of lr, reached by a cosine after warm-up (1: constant)
    warmup: int = 10
    batch_rows: int = 256  # rows per step (a few requests): small streams get several epochs
    ttt_steps: int = 5
    step_decay: float = 0.8
    grad_clip: float = 0.5
    weight_decay: float = 0.0
    heldout: float = 0.2  # the newest share of the requests held out for scoring
    min_gain: float = 0.0  # the slice's tau must rise by more than this share
    general_margin: float = 0.02  # the general set's tau may fall by at most this share
    max_answer: int = 512  # answer tokens per request used (a longer answer is cut)
    samples: int = 4  # answers the target samples per training prompt, trained on beside the kept one
    sample_temperature: float = 0.8
    vocab_swap: int = 0  # draft-vocabulary entries that may be swapped for the user's missing tokens (0: none)
    vocab_min_count: int = 2  # a missing token is added when the training text holds it this often
    seed: int = 0


@dataclass
class AdaptResult:
    accepted: bool
    reason: str
    tau_before: float
    tau_after: float
    general_before: float | None
    general_after: float | None
    train_requests: int
    heldout_requests: int
    train_tokens: int
    steps: int
    train_s: float
    extract_s: float
    history: list[dict[str, Any]] = field(default_factory=list)  # per eval: step, tokens seen, slice and general tau
    chosen_step: int = 0  # the step whose weights are the candidate (early stopping)
    vocab_swapped: int = 0  # draft-vocabulary entries swapped for the user's tokens (AdaptOptions.vocab_swap)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def request_sequences(target: Any, layers: tuple[int, int, int], requests: Sequence[Request], *,
                      max_answer: int = 512, topk: int = 16) -> list[Any]:
    """train/extract.Sequence_ per request: its prompt and answer decoded by the target in one
    prefill (extract.labelled_prefill), the answer's labels in the mask."""
    from ..train.extract import labelled_prefill

    target.set_capture(layers)
    out = []
    for prompt, answer in requests:
        prompt, answer = list(prompt), list(answer)[:max_answer]
        full = (prompt + answer)[: target.n_ctx]
        if prompt and len(full) > len(prompt):
            out.append(labelled_prefill(target, full, len(prompt), topk))
    return out


def feature_data(seqs: list[Any], d2t: np.ndarray, vocab_size: int, work: Path, name: str) -> Any:
    """train/ttt.FeatureData over these sequences (one shard in `work`), mapped to this draft vocabulary."""
    from ..train.extract import _save_shard
    from ..train.trainer import draft_index
    from ..train.ttt import FeatureData

    t2d = draft_index(d2t, vocab_size)
    if not seqs:
        return FeatureData([], t2d)
    path = work / f"{name}.npz"
    _save_shard(path, seqs)
    return FeatureData([path], t2d)


def adapt(target: Any, drafter_path: str | Path, requests: Sequence[Request], work: Path,
          opts: AdaptOptions | None = None, *, general: Sequence[Request] = (), replay: Sequence[Request] = (),
          watch: Sequence[Request] = (), augment: Callable[[list[Request]], list[Request]] | None = None,
          should_stop: Callable[[], bool] | None = None,
          progress: Callable[[str, int, int], None] | None = None) -> tuple[AdaptResult, Any]:
    """Fine-tune the drafter at drafter_path on `requests` (oldest first) with the loaded target
    (a target.Target whose n_batch and context fit them); returns the result and the candidate
    model (an Eagle3Reference; the caller writes it when result.accepted). should_stop() is asked
    between steps: training then ends at once and the candidate is scored as it is. replay:
    general requests mixed into the training data (not scored on), against forgetting. watch:
    requests scored at every checkpoint for the report's history only, never for choosing (a
    benchmark's unseen prompts: tau against learned tokens). augment(training requests): more
    training requests made from them (never from the held-out ones). progress(phase, done, total)
    reports extraction and training."""
    import torch

    from ..train.trainer import adamw, optimizer_step, simulated_acceptance
    from .weights import reference_from_gguf

    opts = opts or AdaptOptions()
    requests = [(list(p), list(a)) for p, a in requests if len(p) and len(a)]
    if len(requests) < 2:
        raise EdgeEagleError(f"Adapting needs at least 2 finished requests, and {len(requests)} are kept; "
                             "use the drafter with --learn for a while first.")
    n_held = max(1, int(round(len(requests) * opts.heldout)))
    train_reqs, held_reqs = requests[:-n_held], requests[-n_held:]
    extra = augment(train_reqs) if augment is not None and train_reqs else []
    model = reference_from_gguf(drafter_path, target.gguf)
    t0 = time.perf_counter()
    training = train_reqs + extra + [(list(p), list(a)) for p, a in replay]
    sets = _feature_sets(target, model, work, opts, progress,
                         {"train": training, "heldout": held_reqs, "general": list(general), "watch": list(watch)})
    extract_s = time.perf_counter() - t0

    def score(m: Any, name: str) -> float | None:
        data = sets[name]
        return simulated_acceptance(m, data, opts.ttt_steps)["tau_decode"] if data.seqs else None

    tau_before, general_before = score(model, "heldout") or 0.0, score(model, "general")
    watch_before = score(model, "watch")
    swapped = _swap_vocabulary(model, target.gguf, opts, train_reqs + extra, training + held_reqs + list(general),
                               sets) if opts.vocab_swap > 0 else 0
    torch.manual_seed(opts.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optim = adamw(params, opts.lr, opts.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda i: lr_scale(opts, i))
    rng = np.random.default_rng(opts.seed)
    train_tokens = sum(len(a) for _, a in train_reqs)  # the user's: replayed general text not counted
    history: list[dict[str, Any]] = [{"step": 0, "tokens_seen": 0, "tau": tau_before, "general": general_before,
                                      "watch": watch_before}]
    step, seen, t1 = 0, 0, time.perf_counter()
    deadline = t1 + 60.0 * opts.minutes
    eval_every = max(1, opts.steps // 6)
    best: tuple[float, int, dict[str, Any]] | None = None  # (held-out tau, step, weights) within the margin

    def checkpoint() -> None:
        """Score the weights now; keep them when they are the best so far that lose at most the
        margin on the general set (early stopping on the held-out slice)."""
        nonlocal best
        model.eval()
        tau, general = score(model, "heldout") or 0.0, score(model, "general")
        model.train()
        history.append({"step": step, "tokens_seen": seen, "tau": tau, "general": general,
                        "watch": score(model, "watch")})
        within = general is None or general_before is None or general >= general_before * (1 - opts.general_margin)
        if within and (best is None or tau > best[0]):
            best = (tau, step, copy.deepcopy(model.state_dict()))

    model.train()
    while sets["train"].seqs and step < opts.steps:
        for batch in sets["train"].batches(opts.batch_rows, rng):
            if step >= opts.steps or time.perf_counter() >= deadline or (should_stop is not None and should_stop()):
                break
            optimizer_step(model, batch, params, optim, sched, opts.ttt_steps, opts.step_decay, opts.grad_clip)
            step += 1
            seen += int(batch.valid.sum())
            if progress is not None:
                progress("train", step, opts.steps)
            if step % eval_every == 0:
                checkpoint()
        else:
            continue
        break
    train_s = time.perf_counter() - t1
    if step and history[-1]["step"] != step:
        checkpoint()
    model.eval()
    if best is not None:  # the best weights within the general margin; else the last, which the rule refuses
        model.load_state_dict(best[2])
    tau_after, general_after = score(model, "heldout") or 0.0, score(model, "general")
    accepted, reason = _verdict(opts, step, tau_before, tau_after, general_before, general_after)
    result = AdaptResult(accepted, reason, tau_before, tau_after, general_before, general_after,
                         len(train_reqs), len(held_reqs), train_tokens, step, round(train_s, 2),
                         round(extract_s, 2), history, best[1] if best is not None else step, swapped)
    return result, model


def lr_scale(opts: AdaptOptions, i: int) -> float:
    """The learning rate's share of opts.lr at step i: a linear warm-up, then a cosine from 1 to
    opts.lr_final at opts.steps (constant when lr_final is 1)."""
    from ..train.trainer import warmup_cosine

    return warmup_cosine(i, opts.warmup, opts.steps, final=opts.lr_final, start=opts.warmup)


def _swap_vocabulary(model: Any, target: Any, opts: AdaptOptions, own: list[Request], texts: list[Request],
                     sets: dict[str, Any]) -> int:
    """widen_vocabulary with the user's training requests' tokens (own) against every text at
    hand (texts); the feature sets then map labels to the new vocabulary."""
    from ..train.trainer import draft_index

    counts = token_counts(own, opts.max_answer)
    used = token_counts(texts, opts.max_answer, prompts=True)
    swapped = widen_vocabulary(model, target, counts, set(used), opts.vocab_swap, opts.vocab_min_count)
    if swapped:
        t2d = draft_index(model.d2t.numpy(), target.vocab_size)
        for data in sets.values():
            data.t2d = t2d
    return swapped


def token_counts(requests: Sequence[Request], max_answer: int, *, prompts: bool = False) -> dict[int, int]:
    """How often each token comes in the requests' answers (cut at max_answer), and with prompts
    in their prompts too."""
    from collections import Counter

    counts: Counter[int] = Counter()
    for prompt, answer in requests:
        counts.update(int(t) for t in list(answer)[:max_answer])
        if prompts:
            counts.update(int(t) for t in prompt)
    return dict(counts)


def widen_vocabulary(model: Any, target: Any, counts: dict[int, int], used: set[int], limit: int,
                     min_count: int) -> int:
    """Swap up to `limit` draft-vocabulary entries that no text in `used` holds (never a control
    token; the highest ids first) for the tokens `counts` holds at least min_count times that the
    vocabulary lacks (the most frequent first). A new entry's lm_head row is the target's output
    row for the token, scaled by the ratio of the drafter's row norms to the target's rows of its
    own vocabulary. Returns how many entries were swapped; the vocabulary stays ascending."""
    import torch

    from ..train.trainer import output_head

    d2t = model.d2t.numpy().astype(np.int64)
    have = set(d2t.tolist())
    missing = sorted((t for t, n in counts.items() if n >= min_count and t not in have and 0 <= t < target.vocab_size),
                     key=lambda t: (-counts[t], t))
    types = target.meta.get("tokenizer.ggml.token_type")
    control = set(np.flatnonzero(np.asarray(types) != 1).tolist()) if types is not None else set()
    keep = used | control
    spare = [i for i in np.argsort(-d2t, kind="stable").tolist() if int(d2t[i]) not in keep]
    n = min(limit, len(missing), len(spare))
    if n == 0:
        return 0
    head = output_head(target)
    with torch.no_grad():
        w = model.lm_head.weight
        scale = float(w.norm(dim=1).mean()) / float(np.linalg.norm(head[d2t], axis=1).mean())
        for slot, token in zip(spare[:n], missing[:n]):
            d2t[slot] = token
            w[slot] = torch.from_numpy(head[token] * scale)
        order = np.argsort(d2t, kind="stable")
        w.copy_(w[torch.from_numpy(order)].clone())
        model.d2t.copy_(torch.from_numpy(d2t[order]))
    return n


def _feature_sets(target: Any, model: Any, work: Path, opts: AdaptOptions,
                  progress: Callable[[str, int, int], None] | None, named: dict[str, list[Request]]) -> dict[str, Any]:
    """The target's features for each named list of requests, as FeatureData written under work."""
    work.mkdir(parents=True, exist_ok=True)
    sets = {}
    for name, reqs in named.items():
        if progress is not None:
            progress(f"features: {name}", 0, len(reqs))
        seqs = request_sequences(target, model.cfg.target_layers, reqs, max_answer=opts.max_answer)
        sets[name] = feature_data(seqs, model.d2t.numpy(), target.gguf.vocab_size, work, name)
    return sets


def _verdict(opts: AdaptOptions, step: int, tau_before: float, tau_after: float, general_before: float | None,
             general_after: float | None) -> tuple[bool, str]:
    """Whether the candidate is kept, and why."""
    if step == 0:
        return False, "no training step ran"
    if tau_after <= tau_before * (1 + opts.min_gain):
        return False, f"tau on the held-out requests did not rise enough ({tau_before:.3f} -> {tau_after:.3f})"
    if general_before is not None and general_after is not None and \
            general_after < general_before * (1 - opts.general_margin):
        return False, (f"tau on the general set fell beyond {opts.general_margin:.0%} "
                       f"({general_before:.3f} -> {general_after:.3f})")
    return True, f"tau on the held-out requests {tau_before:.3f} -> {tau_after:.3f}"


def model_weights(model: Any) -> dict[str, np.ndarray]:
    """A reference model's weights as the GGUF writer takes them (reference names, numpy)."""
    out = {}
    for name, t in model.state_dict().items():
        if name == "target_embed":
            continue
        t = t.detach().cpu()
        out[name] = t.float().numpy() if t.is_floating_point() else t.numpy()
    return out
