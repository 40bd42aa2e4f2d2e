"""Feature extraction: run conversations through the target with the runtime's own capture
path, on the very GGUF that will be served, and cache what training needs:

- tokens, and the captured layer inputs (fp16) of every position;
- soft labels: the top-k of the target's next-token distribution at each labelled position
  (ids int32, probabilities fp16);
- a mask of the positions whose label trains the drafter (the assistant's tokens).

Shards are written atomically with a manifest after each, so an interrupted run resumes
where it stopped. With regenerate, the assistant turn is the target's own greedy answer.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generator, Iterable

import numpy as np

from ..api import render_chat
from ..errors import EdgeEagleError
from ..fsutil import atomic_path, atomic_write
from ..target import Target
from .data import Conversation, training_examples

MANIFEST = "manifest.json"


@dataclass
class Sequence_:
    tokens: np.ndarray  # int32 [T]
    feats: np.ndarray  # float16 [T, 3H] (row T-1 may be zeros: never decoded)
    top_ids: np.ndarray  # int32 [T, K]: label of position P = distribution of token P+1
    top_probs: np.ndarray  # float16 [T, K]
    mask: np.ndarray  # bool [T]: label of P is a training target


def _topk(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    import torch

    x = torch.from_numpy(np.ascontiguousarray(logits, dtype=np.float32))
    vals, ids = torch.topk(x, k, dim=-1)
    probs = torch.exp(vals - torch.logsumexp(x, dim=-1, keepdim=True))
    return ids.numpy().astype(np.int32), probs.numpy().astype(np.float16)


def _prompt_and_answer(target: Target, conv: Conversation) -> tuple[str, str | None] | None:
    """(prompt text, answer or None) of a conversation that ends with the answer to learn
    (training_examples cuts conversations there); None when it does not fit that shape."""
    if conv[0]["role"] == "text":
        return conv[0]["content"], None
    if conv[-1]["role"] == "assistant":
        if len(conv) < 2 or conv[-2]["role"] != "user":
            return None
        return render_chat(target, conv[:-1]), conv[-1]["content"]
    if conv[-1]["role"] == "user":
        return render_chat(target, conv), None
    return None


def _assemble(tokens: list[int], n_prompt: int, feats: list[np.ndarray], lab_ids: list[np.ndarray],
              lab_probs: list[np.ndarray], topk: int, width: int, labels_from_prompt_end: bool) -> Sequence_:
    """One cached sequence from the decoded pieces. With labels_from_prompt_end, the labels exist
    from the last prompt position on (regeneration); otherwise for every position."""
    T = len(tokens)
    f = np.zeros((T, width), np.float16)
    got = np.concatenate(feats)
    f[: len(got)] = got[:T]
    li = np.zeros((T, topk), np.int32)
    lp = np.zeros((T, topk), np.float16)
    ids_all, probs_all = np.concatenate(lab_ids), np.concatenate(lab_probs)
    if labels_from_prompt_end:
        li[n_prompt - 1:n_prompt - 1 + len(ids_all)] = ids_all[: T - n_prompt + 1]
        lp[n_prompt - 1:n_prompt - 1 + len(probs_all)] = probs_all[: T - n_prompt + 1]
    else:
        li[:], lp[:] = ids_all[:T], probs_all[:T]
    mask = np.zeros(T, bool)
    mask[n_prompt - 1: T - 1] = True  # label of P predicts token P+1, an answer token
    return Sequence_(np.asarray(tokens, np.int32), f, li, lp, mask)


def _prompt_tokens(target: Target, conv: Conversation, max_prompt: int) -> tuple[list[int], str, str | None] | None:
    pa = _prompt_and_answer(target, conv)
    if pa is None:
        return None
    prompt_text, answer = pa
    is_chat = conv[0]["role"] != "text"
    prompt = target.tokenize(prompt_text, add_special=not is_chat)
    if not 2 <= len(prompt) <= max_prompt:
        return None
    return prompt, prompt_text, answer


def _fixed_text(target: Target, prompt: list[int], prompt_text: str, answer: str, max_new: int, topk: int,
                seq: int = 0) -> Sequence_:
    """Features and soft labels of a given answer by prefill only (no generation), in sequence seq."""
    full = target.tokenize(prompt_text + answer + target.detokenize([target.eos]), add_special=False)
    return labelled_prefill(target, full[: min(target.n_ctx, len(prompt) + max_new)], len(prompt), topk, seq)


def labelled_prefill(target: Target, tokens: list[int], n_prompt: int, topk: int, seq: int = 0) -> Sequence_:
    """Features and soft labels of every position of `tokens` (the first n_prompt the prompt), by
    one prefill in n_batch chunks in sequence seq, which is empty before and after."""
    target.memory.remove_seq(seq)
    feats, lab_ids, lab_probs = [], [], []
    for i in range(0, len(tokens), target.n_batch):
        res = target.decode(tokens[i:i + target.n_batch], i, "all", seq)
        feats.append(res.require_features().astype(np.float16))
        ids, probs = _topk(res.logits, topk)
        lab_ids.append(ids)
        lab_probs.append(probs)
    target.memory.remove_seq(seq)
    return _assemble(tokens, n_prompt, feats, lab_ids, lab_probs, topk, 3 * target.n_embd, False)


def extract_one(target: Target, conv: Conversation, *, regenerate: bool, max_prompt: int, max_new: int,
                topk: int) -> Sequence_ | None:
    """One conversation, one sequence at a time (the reference for extract_many)."""
    got = _prompt_tokens(target, conv, max_prompt)
    if got is None:
        return None
    prompt, prompt_text, answer = got
    if not (regenerate or answer is None):
        return _fixed_text(target, prompt, prompt_text, answer, max_new, topk)
    target.memory.clear()
    res = target.prefill(prompt)
    feats = [res.require_features().astype(np.float16)]
    ids, probs = _topk(res.logits[-1:], topk)
    lab_ids, lab_probs = [ids], [probs]
    tokens = list(prompt)
    for _ in range(max_new):
        nxt = int(ids[0, 0])  # greedy: the top label
        tokens.append(nxt)
        if target.is_eog(nxt) or len(tokens) >= target.n_ctx:
            break
        res = target.decode([nxt], len(tokens) - 1, "last")
        feats.append(res.require_features().astype(np.float16))
        ids, probs = _topk(res.logits, topk)
        lab_ids.append(ids)
        lab_probs.append(probs)
    return _assemble(tokens, len(prompt), feats, lab_ids, lab_probs, topk, 3 * target.n_embd, True)


@dataclass
class _Slot:
    index: int  # the conversation's index in the input stream
    n_prompt: int
    tokens: list[int]
    feats: list[np.ndarray]
    lab_ids: list[np.ndarray]
    lab_probs: list[np.ndarray]


def extract_many(target: Target, items: Iterable[tuple[int, Conversation]], *, regenerate: bool, max_prompt: int,
                 max_new: int, topk: int) -> Generator[tuple[int, Sequence_ | None], None, None]:
    """extract_one for a stream of (index, conversation), regenerating up to target.n_seq answers
    at once: each new prompt is prefilled into a free sequence, then every answer in flight
    advances by one token per llama.cpp batch. Yields (index, sequence or None) as each one
    finishes, so not in input order."""
    width = 3 * target.n_embd
    free = list(range(target.n_seq))
    live: dict[int, _Slot] = {}
    it = iter(items)
    exhausted = False
    while True:
        while free and not exhausted:  # fill the free sequences with new prompts
            nxt = next(it, None)
            if nxt is None:
                exhausted = True
                break
            index, conv = nxt
            got = _prompt_tokens(target, conv, max_prompt)
            if got is None:
                yield index, None
                continue
            prompt, prompt_text, answer = got
            seq = free.pop(0)
            if not (regenerate or answer is None):  # fixed text: prefill only, in a free sequence
                yield index, _fixed_text(target, prompt, prompt_text, answer, max_new, topk, seq)
                free.insert(0, seq)
                continue
            target.memory.remove_seq(seq)
            res = target.prefill(prompt, 0, seq)
            ids, probs = _topk(res.logits[-1:], topk)
            live[seq] = _Slot(index, len(prompt), list(prompt), [res.require_features().astype(np.float16)], [ids],
                              [probs])
        if not live:
            return
        # every answer in flight takes its greedy next token; finished ones leave
        seqs, toks, poss = [], [], []
        for seq in sorted(live):
            slot = live[seq]
            token = int(slot.lab_ids[-1][-1, 0])
            slot.tokens.append(token)
            done = (target.is_eog(token) or len(slot.tokens) >= target.n_ctx
                    or len(slot.tokens) - slot.n_prompt >= max_new)
            if done:
                del live[seq]
                target.memory.remove_seq(seq)
                free.append(seq)
                yield slot.index, _assemble(slot.tokens, slot.n_prompt, slot.feats, slot.lab_ids, slot.lab_probs,
                                            topk, width, True)
                continue
            seqs.append(seq)
            toks.append(token)
            poss.append(len(slot.tokens) - 1)
        free.sort()
        if not seqs:
            continue
        res = target.decode_seqs(toks, poss, seqs)
        ids, probs = _topk(res.logits, topk)
        feats = res.require_features().astype(np.float16)
        for row, seq in enumerate(seqs):
            slot = live[seq]
            slot.feats.append(feats[row:row + 1])
            slot.lab_ids.append(ids[row:row + 1])
            slot.lab_probs.append(probs[row:row + 1])


def _save_shard(path: Path, seqs: list[Sequence_]) -> int:
    starts = np.cumsum([0] + [len(s.tokens) for s in seqs]).astype(np.int64)
    with atomic_path(path, suffix=".npz") as tmp:  # np.savez would append .npz to any other name
        np.savez(tmp, tokens=np.concatenate([s.tokens for s in seqs]), starts=starts,
                 feats=np.concatenate([s.feats for s in seqs]), top_ids=np.concatenate([s.top_ids for s in seqs]),
                 top_probs=np.concatenate([s.top_probs for s in seqs]), mask=np.concatenate([s.mask for s in seqs]))
    return int(starts[-1])


def _write_manifest(out: Path, manifest: dict) -> None:
    atomic_write(out / MANIFEST, json.dumps(manifest, indent=1))


def extract(target: Target, layers: tuple[int, int, int], convs: Iterable[Conversation], out: Path, *,
            max_tokens: int, regenerate: bool = True, max_prompt: int = 384, max_new: int = 256,
            topk: int = 16, shard_tokens: int = 16384, progress: bool = True, turns: str = "first") -> dict:
    """Extract until max_tokens positions are cached (resuming a previous run in `out`).

    Up to target.n_seq answers are regenerated at once (extract_many), so conversations finish
    out of order; the manifest keeps `conversations_seen` (every conversation before it is done)
    plus `done_beyond` (those after it that are done), and a resumed run skips exactly those.
    turns: "first" (each conversation's first answer) or "all" (every answer, with the
    conversation so far as its prompt)."""
    out.mkdir(parents=True, exist_ok=True)
    identity = {"target": os.path.basename(target.path), "fingerprint": target.gguf.vocab_fingerprint(),
                "layers": list(layers), "hidden": target.n_embd, "topk": topk, "regenerate": regenerate,
                "turns": turns}
    manifest: dict[str, Any] = {**identity, "shards": [], "conversations_seen": 0, "done_beyond": [], "tokens": 0}
    if (out / MANIFEST).is_file():
        old = json.loads((out / MANIFEST).read_text())
        old.setdefault("turns", "first")  # manifests written before the option
        if {k: old.get(k) for k in identity} != identity:
            raise EdgeEagleError(f"{out} holds features from another target or settings; pass a new --features "
                                 "directory.")
        manifest = {**old, "done_beyond": old.get("done_beyond", [])}
        if manifest["tokens"] >= max_tokens:
            return manifest  # already done: read-only, so several trainings can share it
    target.set_capture(layers)
    seen = manifest["conversations_seen"]
    done_beyond = set(manifest["done_beyond"])
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=max_tokens, initial=min(manifest["tokens"], max_tokens), unit="tok", desc="features")
    pending: list[Sequence_] = []
    finished: list[int] = []  # indices whose result (a sequence in `pending`, or nothing) is final
    items = ((i, c) for i, c in enumerate(training_examples(convs, turns))
             if i >= seen and i not in done_beyond)

    def save() -> None:
        nonlocal seen, pending, finished
        if pending:
            name = f"shard-{len(manifest['shards']):05d}.npz"
            manifest["tokens"] += _save_shard(out / name, pending)
            manifest["shards"].append(name)
        done_beyond.update(finished)
        while seen in done_beyond:
            done_beyond.discard(seen)
            seen += 1
        manifest["conversations_seen"], manifest["done_beyond"] = seen, sorted(done_beyond)
        _write_manifest(out, manifest)
        pending, finished = [], []

    try:
        gen = extract_many(target, items, regenerate=regenerate, max_prompt=max_prompt, max_new=max_new, topk=topk)
        for index, seq in gen:
            finished.append(index)
            if seq is not None:
                pending.append(seq)
                if bar is not None:
                    bar.update(len(seq.tokens))
            if sum(len(s.tokens) for s in pending) >= shard_tokens:
                save()
            if manifest["tokens"] + sum(len(s.tokens) for s in pending) >= max_tokens:
                break
        gen.close()
        save()
    finally:
        if bar is not None:
            bar.close()
    return manifest
