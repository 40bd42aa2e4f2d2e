"""Training-time test (TTT): train the drafter on its own chained states, as it runs.

Row P of a sequence consumes (token[P+1], g) and is trained on the target's distribution
of token[P+2] (the soft label of position P+1). Step 0 uses g = fc(features[P]). Step s
uses g = carry(h_{s-1}[P-1]) (the state the drafter itself produced one position earlier,
post-norm under EAGLE-3.1) and attends to the real rows at positions <= P-s plus the s
chain rows of its own chain (positions P-s+1..P), exactly the KV the runtime has when it
drafts the s-th token of a chain seeded at P-s. The loss is forward KL (soft cross-entropy
on the top-k labels) summed over steps with weight decay**s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch import Tensor

from ..checks.reference import Eagle3Reference


@dataclass
class Batch:
    feats: Tensor  # [B, T, 3Ht] float32, rows 0..T-1 (T = rows, i.e. positions with a next token)
    tokens: Tensor  # [B, T] int64: token[P+1]
    label_ids: Tensor  # [B, T, K] int64 draft ids (-1 outside the draft vocab): distribution of token[P+2]
    label_probs: Tensor  # [B, T, K] float32, renormalised over the draft vocab
    valid: Tensor  # [B, T] bool
    pos: Tensor  # [B, T] int64


class FeatureData:
    """All cached sequences (read into memory: fp16 features), with the draft-id mapping."""

    def __init__(self, shard_paths: list[Path], t2d_index: np.ndarray, max_len: int = 1024):
        self.t2d = t2d_index
        self.seqs: list[dict[str, np.ndarray]] = []
        keys = ("tokens", "feats", "top_ids", "top_probs", "mask")
        for path in shard_paths:
            with np.load(path) as z:
                arrays = {k: z[k] for k in keys}  # each NpzFile access re-reads the whole array
                starts = z["starts"]
            for a, b in zip(starts[:-1], starts[1:]):
                b = min(b, a + max_len)
                if b - a < 3 or not arrays["mask"][a + 1:b].any():
                    continue
                self.seqs.append({k: arrays[k][a:b].copy() for k in keys})

    def split(self, n: int) -> "FeatureData":
        """Move every k-th sequence (n of them, spread over the data) into a new held-out set."""
        n = min(n, len(self.seqs) // 10)
        held = FeatureData([], self.t2d)
        if n <= 0:
            return held
        stride = len(self.seqs) // n
        picked = set(range(stride - 1, stride * n, stride))
        held.seqs = [s for i, s in enumerate(self.seqs) if i in picked]
        self.seqs = [s for i, s in enumerate(self.seqs) if i not in picked]
        return held

    @property
    def n_rows(self) -> int:
        return sum(int(s["mask"][1:].sum()) for s in self.seqs)

    def batches(self, batch_rows: int, rng: np.random.Generator) -> Iterator[Batch]:
        """Shuffled batches of whole sequences, ~batch_rows rows each (similar lengths together)."""
        order = rng.permutation(len(self.seqs))
        # bucket by length within chunks of 64 to limit padding, keep randomness across chunks
        chunks = [sorted(order[i:i + 64], key=lambda j: len(self.seqs[j]["tokens"]))
                  for i in range(0, len(order), 64)]
        groups, cur, rows = [], [], 0
        for chunk in chunks:
            for j in chunk:
                cur.append(j)
                rows += len(self.seqs[j]["tokens"])
                if rows >= batch_rows:
                    groups.append(cur)
                    cur, rows = [], 0
        if cur:
            groups.append(cur)
        for g in rng.permutation(len(groups)):
            yield self.collate([self.seqs[j] for j in groups[g]])

    def collate(self, seqs: list[dict[str, np.ndarray]]) -> Batch:
        T = max(len(s["tokens"]) for s in seqs) - 1
        B, width, K = len(seqs), seqs[0]["feats"].shape[1], seqs[0]["top_ids"].shape[1]
        feats = np.zeros((B, T, width), np.float32)
        tokens = np.zeros((B, T), np.int64)
        lid = np.full((B, T, K), -1, np.int64)
        lp = np.zeros((B, T, K), np.float32)
        valid = np.zeros((B, T), bool)
        for b, s in enumerate(seqs):
            n = len(s["tokens"]) - 1  # rows P = 0..n-1 consume token[P+1]
            feats[b, :n] = s["feats"][:n]
            tokens[b, :n] = s["tokens"][1:n + 1]
            # row P learns the label of position P+1 (distribution of token P+2), if that is an answer token
            ids = self.t2d[s["top_ids"][1:n + 1]]
            probs = np.where(ids >= 0, s["top_probs"][1:n + 1].astype(np.float32), 0.0)
            total = probs.sum(-1, keepdims=True)
            ok = s["mask"][1:n + 1] & (total[:, 0] > 0)
            lid[b, :n] = ids
            lp[b, :n] = probs / np.maximum(total, 1e-9)
            valid[b, :n] = ok
        pos = np.broadcast_to(np.arange(T), (B, T)).copy()
        return Batch(torch.from_numpy(feats), torch.from_numpy(tokens), torch.from_numpy(lid),
                     torch.from_numpy(lp), torch.from_numpy(valid), torch.from_numpy(pos))


def _ttt_attention(model: Eagle3Reference, x: Tensor, pos: Tensor, step: int, ks: list[Tensor],
                   vs: list[Tensor]) -> Tensor:
    a = model.midlayer.self_attn
    B, T, _ = x.shape
    q = a.rope(a.q_proj(x).view(B, T, a.n_head, a.head_dim), pos)
    k = a.rope(a.k_proj(x).view(B, T, a.n_kv, a.head_dim), pos)
    v = a.v_proj(x).view(B, T, a.n_kv, a.head_dim)
    ks.append(k)
    vs.append(v)
    rep = a.n_head // a.n_kv
    scale = 1.0 / math.sqrt(a.head_dim)
    k0, v0 = ks[0].repeat_interleave(rep, 2), vs[0].repeat_interleave(rep, 2)
    scores = torch.einsum("bthd,bshd->bhts", q, k0) * scale  # real rows
    idx = torch.arange(T)
    causal = idx[None, :] <= (idx[:, None] - step)  # key position <= query position - step
    scores = scores.masked_fill(~causal[None, None], float("-inf"))
    diag_s, diag_v = [], []
    for j in range(1, step + 1):  # chain rows: step j's key at position P - (step - j)
        shift = step - j
        kj = ks[j].repeat_interleave(rep, 2)
        vj = vs[j].repeat_interleave(rep, 2)
        if shift:
            kj = torch.cat([kj.new_zeros(B, shift, *kj.shape[2:]), kj[:, :-shift]], 1)
            vj = torch.cat([vj.new_zeros(B, shift, *vj.shape[2:]), vj[:, :-shift]], 1)
        diag_s.append((q * kj).sum(-1).transpose(1, 2) * scale)  # [B, H, T]
        diag_v.append(vj)
    if diag_s:
        all_scores = torch.cat([scores, torch.stack(diag_s, -1)], -1)  # [B, H, T, T + step]
    else:
        all_scores = scores
    # rows with no visible key at all (P < step) would be NaN; they are masked out of the loss
    all_scores = torch.where(torch.isinf(all_scores).all(-1, keepdim=True), torch.zeros_like(all_scores),
                             all_scores)
    w = all_scores.softmax(-1)
    out = torch.einsum("bhts,bshd->bthd", w[..., :T], v0)
    for j, vj in enumerate(diag_v):
        out = out + w[..., T + j].transpose(1, 2)[..., None] * vj
    return a.o_proj(out.reshape(B, T, -1))


def ttt_states(model: Eagle3Reference, feats: Tensor, tokens: Tensor, pos: Tensor, steps: int) -> Iterator[Tensor]:
    """Yield the pre-norm state h_s [B, T, H] of every row at each step s = 0..steps-1."""
    g = model.encode(feats)
    ks: list[Tensor] = []
    vs: list[Tensor] = []
    h: Tensor | None = None  # the previous step's state
    for s in range(steps):
        if h is not None:
            carried = model.carry(h)
            g = torch.cat([carried.new_zeros(carried.shape[0], 1, carried.shape[2]), carried[:, :-1]], 1)
        h = model.block(tokens, g, lambda x, s=s: _ttt_attention(model, x, pos, s, ks, vs))
        yield h


def ttt_loss(model: Eagle3Reference, batch: Batch, steps: int, decay: float) -> tuple[Tensor, list[float], list[float]]:
    """Weighted soft-CE over `steps` chained steps; returns (loss, per-step loss, per-step top-1 acc)."""
    total = batch.feats.new_zeros(())
    losses, accs = [], []
    weight_sum = 0.0
    for s, h in enumerate(ttt_states(model, batch.feats, batch.tokens, batch.pos, steps)):
        valid = batch.valid & (batch.pos >= s)  # a chain seeded before position 0 does not exist
        rows = h[valid]
        if rows.shape[0] == 0:
            break
        logp = torch.log_softmax(model.draft_logits(rows).float(), -1)
        ids, probs = batch.label_ids[valid], batch.label_probs[valid]
        picked = logp.gather(-1, ids.clamp(min=0)) * (ids >= 0)
        loss = -(probs * picked).sum(-1).mean()
        total = total + decay ** s * loss
        weight_sum += decay ** s
        losses.append(float(loss.detach()))
        accs.append(float((logp.argmax(-1) == ids[:, 0]).float().mean()))
    return total / max(weight_sum, 1e-9), losses, accs
