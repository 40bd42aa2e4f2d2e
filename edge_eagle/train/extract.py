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
from typing import Iterable, Iterator

import numpy as np

from ..api import render_chat
from ..errors import EdgeEagleError
from ..fsutil import atomic_path, atomic_write
from ..target import Target
from .data import Conversation

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
    if conv[0]["role"] == "text":
        return conv[0]["content"], None
    msgs = []
    for turn in conv:
        if turn["role"] == "assistant":
            if msgs and msgs[-1]["role"] == "user":
                return render_chat(target, msgs), turn["content"]
            return None
        msgs.append(turn)
    if msgs and msgs[-1]["role"] == "user":
        return render_chat(target, msgs), None
    return None


def extract_one(target: Target, conv: Conversation, *, regenerate: bool, max_prompt: int, max_new: int,
                topk: int) -> Sequence_ | None:
    pa = _prompt_and_answer(target, conv)
    if pa is None:
        return None
    prompt_text, answer = pa
    is_chat = conv[0]["role"] != "text"
    prompt = target.tokenize(prompt_text, add_special=not is_chat)
    if not 2 <= len(prompt) <= max_prompt:
        return None
    target.memory.clear()
    width = 3 * target.n_embd
    if regenerate or answer is None:
        res = target.prefill(prompt)
        feats = [res.features.astype(np.float16)]
        ids, probs = _topk(res.logits[-1:], topk)
        lab_ids, lab_probs = [ids], [probs]
        tokens = list(prompt)
        for _ in range(max_new):
            nxt = int(ids[0, 0])  # greedy: the top label
            tokens.append(nxt)
            if target.is_eog(nxt) or len(tokens) >= target.n_ctx:
                break
            res = target.decode([nxt], len(tokens) - 1, "last")
            feats.append(res.features.astype(np.float16))
            ids, probs = _topk(res.logits, topk)
            lab_ids.append(ids)
            lab_probs.append(probs)
        n_prompt = len(prompt)
    else:
        full = target.tokenize(prompt_text + answer + target.detokenize([target.eos]), add_special=False)
        full = full[: min(target.n_ctx, len(prompt) + max_new)]
        feats, lab_ids, lab_probs = [], [], []
        for i in range(0, len(full), target.n_batch):
            res = target.decode(full[i:i + target.n_batch], i, "all")
            feats.append(res.features.astype(np.float16))
            ids, probs = _topk(res.logits, topk)
            lab_ids.append(ids)
            lab_probs.append(probs)
        tokens, n_prompt = full, len(prompt)
    T = len(tokens)
    f = np.zeros((T, width), np.float16)
    got = np.concatenate(feats)
    f[: len(got)] = got[:T]
    li = np.zeros((T, topk), np.int32)
    lp = np.zeros((T, topk), np.float16)
    ids_all, probs_all = np.concatenate(lab_ids), np.concatenate(lab_probs)
    if regenerate or answer is None:  # labels exist from the last prompt position on
        li[n_prompt - 1:n_prompt - 1 + len(ids_all)] = ids_all[: T - n_prompt + 1]
        lp[n_prompt - 1:n_prompt - 1 + len(probs_all)] = probs_all[: T - n_prompt + 1]
    else:
        li[:], lp[:] = ids_all[:T], probs_all[:T]
    mask = np.zeros(T, bool)
    mask[n_prompt - 1: T - 1] = True  # label of P predicts token P+1, an answer token
    return Sequence_(np.asarray(tokens, np.int32), f, li, lp, mask)


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
            topk: int = 16, shard_tokens: int = 16384, progress: bool = True) -> dict:
    """Extract until max_tokens positions are cached (resuming a previous run in `out`)."""
    out.mkdir(parents=True, exist_ok=True)
    identity = {"target": os.path.basename(target.path), "fingerprint": target.gguf.vocab_fingerprint(),
                "layers": list(layers), "hidden": target.n_embd, "topk": topk, "regenerate": regenerate}
    manifest = {**identity, "shards": [], "conversations_seen": 0, "tokens": 0}
    if (out / MANIFEST).is_file():
        old = json.loads((out / MANIFEST).read_text())
        if {k: old.get(k) for k in identity} != identity:
            raise EdgeEagleError(f"{out} holds features from another target or settings; pass a new --out.")
        manifest = old
        if manifest["tokens"] >= max_tokens:
            return manifest  # already done: read-only, so several trainings can share it
    target.set_capture(layers)
    seen = manifest["conversations_seen"]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=max_tokens, initial=min(manifest["tokens"], max_tokens), unit="tok", desc="features")
    pending: list[Sequence_] = []
    it: Iterator[Conversation] = iter(convs)
    for _ in range(seen):  # resume: skip what earlier runs consumed
        next(it, None)
    try:
        for conv in it:
            if manifest["tokens"] >= max_tokens:
                break
            seq = extract_one(target, conv, regenerate=regenerate, max_prompt=max_prompt, max_new=max_new,
                              topk=topk)
            seen += 1
            if seq is not None:
                pending.append(seq)
                if bar is not None:
                    bar.update(len(seq.tokens))
            if sum(len(s.tokens) for s in pending) >= shard_tokens:
                name = f"shard-{len(manifest['shards']):05d}.npz"
                manifest["tokens"] += _save_shard(out / name, pending)
                manifest["shards"].append(name)
                manifest["conversations_seen"] = seen
                _write_manifest(out, manifest)
                pending = []
        if pending:
            name = f"shard-{len(manifest['shards']):05d}.npz"
            manifest["tokens"] += _save_shard(out / name, pending)
            manifest["shards"].append(name)
        manifest["conversations_seen"] = seen
        _write_manifest(out, manifest)
    finally:
        if bar is not None:
            bar.close()
    return manifest
