"""The torch reference forward of an EAGLE-3 / EAGLE-3.1 drafter (NOTES §1-2).

Parameter names follow the SafeAILab checkpoint layout (``fc``, ``midlayer.*``, ``norm``,
``lm_head``, ``d2t``) plus ``fc_norm.{0,1,2}`` (EAGLE-3.1) and ``input_norm``
(norm_before_fc). Weights are the HF convention: q/k are NOT permuted for llama.cpp's rope
(the GGUF writer does that). The parity tests, the converter's --verify and the trainer
all use this module.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor, nn


@dataclass
class Eagle3Config:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    target_hidden_size: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    target_layers: tuple[int, int, int]  # layer-INPUT ids (HF output_hidden_states indices)
    head_dim: int = 0
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    has_embedding: bool = False
    rope_freq_factors: tuple[float, ...] | None = None  # llama3 rope scaling: theta_i / factor_i

    def __post_init__(self) -> None:
        if not self.head_dim:
            self.head_dim = self.hidden_size // self.num_attention_heads
        self.target_layers = tuple(int(x) for x in self.target_layers)  # type: ignore[assignment]
        if self.rope_freq_factors is not None:
            self.rope_freq_factors = tuple(float(x) for x in self.rope_freq_factors)
            if len(self.rope_freq_factors) != self.head_dim // 2:
                raise ValueError("rope_freq_factors needs head_dim / 2 entries")
        if self.fc_norm and self.norm_before_fc:
            raise ValueError("fc_norm and norm_before_fc are exclusive")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)


class Attention(nn.Module):
    inv_freq: Tensor  # a buffer (register_buffer)

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.n_head, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(2 * h, self.n_head * d, bias=False)
        self.k_proj = nn.Linear(2 * h, self.n_kv * d, bias=False)
        self.v_proj = nn.Linear(2 * h, self.n_kv * d, bias=False)
        self.o_proj = nn.Linear(self.n_head * d, h, bias=False)
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        if cfg.rope_freq_factors is not None:
            inv = inv / torch.tensor(cfg.rope_freq_factors, dtype=torch.float64)
        self.register_buffer("inv_freq", inv.float(), persistent=False)

    def rope(self, x: Tensor, pos: Tensor) -> Tensor:
        # HF rotate_half convention; x [..., T, heads, d], pos [..., T]
        ang = pos.to(torch.float64)[..., None] * self.inv_freq.to(torch.float64)  # [..., T, d/2]
        cos = torch.cat([ang.cos(), ang.cos()], -1).float()[..., None, :]
        sin = torch.cat([ang.sin(), ang.sin()], -1).float()[..., None, :]
        x1, x2 = x[..., : self.head_dim // 2], x[..., self.head_dim // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def forward(self, x: Tensor, pos: Tensor, cache: dict | None, mask: Tensor | None = None) -> Tensor:
        """x [B, T, 2H]; pos [B, T]; cache {"k","v","pos"} extended in place (B == 1 with a cache).

        Without a mask, a query attends to every cached or new key at a position <= its own.
        """
        b, t, _ = x.shape
        q = self.rope(self.q_proj(x).view(b, t, self.n_head, self.head_dim), pos)
        k = self.rope(self.k_proj(x).view(b, t, self.n_kv, self.head_dim), pos)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim)
        kpos = pos
        if cache is not None:
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], 1), torch.cat([cache["v"], v], 1)
                kpos = torch.cat([cache["pos"], pos], 1)
            cache.update(k=k, v=v, pos=kpos)
        if mask is None:
            mask = kpos[:, None, :] <= pos[:, :, None]  # [B, T, S]
        rep = self.n_head // self.n_kv
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        att = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(self.head_dim)
        att = att.masked_fill(~mask[:, None], float("-inf")).softmax(-1)
        out = torch.einsum("bhts,bshd->bthd", att, v).reshape(b, t, -1)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)


class Eagle3Reference(nn.Module):
    """The drafter. `embed` is the target's token embedding when the drafter has none."""

    d2t: Tensor  # buffers (register_buffer)
    target_embed: Tensor

    def __init__(self, cfg: Eagle3Config, embed: Tensor | None = None):
        super().__init__()
        self.cfg = cfg
        h, ht = cfg.hidden_size, cfg.target_hidden_size
        if cfg.fc_norm:
            self.fc_norm = nn.ModuleList([RMSNorm(ht, cfg.rms_norm_eps) for _ in range(3)])
        if cfg.norm_before_fc:
            self.input_norm = RMSNorm(3 * ht, cfg.rms_norm_eps)
        self.fc = nn.Linear(3 * ht, h, bias=False)
        self.midlayer = MidLayer(cfg)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.arange(cfg.draft_vocab_size, dtype=torch.int64))
        if cfg.has_embedding:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        else:
            if embed is None:
                raise ValueError("a drafter without its own embedding needs the target's")
            self.register_buffer("target_embed", embed.float(), persistent=False)

    def embed(self, tokens: Tensor) -> Tensor:
        return self.embed_tokens(tokens) if self.cfg.has_embedding else self.target_embed[tokens]

    def encode(self, feats: Tensor) -> Tensor:
        """Target features [..., 3*Ht] (low, mid, high) -> g [..., H]."""
        if self.cfg.fc_norm:
            ht = self.cfg.target_hidden_size
            feats = torch.cat([n(feats[..., i * ht:(i + 1) * ht]) for i, n in enumerate(self.fc_norm)], -1)
        elif self.cfg.norm_before_fc:
            feats = self.input_norm(feats)
        return self.fc(feats)

    def layer(self, tokens: Tensor, g: Tensor, pos: Tensor, cache: dict | None = None,
              mask: Tensor | None = None) -> Tensor:
        """One decoder pass: tokens [B,T], g [B,T,H], pos [B,T] -> pre-norm h [B,T,H]."""
        return self.block(tokens, g, lambda x: self.midlayer.self_attn(x, pos, cache, mask))

    def block(self, tokens: Tensor, g: Tensor, attend) -> Tensor:
        """The decoder layer around a given attention: attend(x [B,T,2H]) -> [B,T,H].
        (The trainer passes its training-time-test attention here.)"""
        m = self.midlayer
        g_norm = m.hidden_norm(g)
        x = torch.cat([m.input_layernorm(self.embed(tokens)), g_norm], -1)
        residual = g_norm if self.cfg.norm_before_residual else g
        h = residual + attend(x)
        return h + m.mlp(m.post_attention_layernorm(h))

    def draft_logits(self, h: Tensor) -> Tensor:
        return self.lm_head(self.norm(h))

    def carry(self, h: Tensor) -> Tensor:
        """What feeds the next chain step: h, or norm(h) under EAGLE-3.1 norm_output."""
        return self.norm(h) if self.cfg.norm_output else h

    def target_logits(self, h: Tensor) -> Tensor:
        """Draft logits scattered onto the target vocabulary (-inf elsewhere), as llama.cpp does."""
        dl = self.draft_logits(h)
        out = torch.full((*dl.shape[:-1], self.cfg.vocab_size), float("-inf"), dtype=dl.dtype)
        out[..., self.d2t] = dl
        return out


@torch.no_grad()
def reference_chain(model: Eagle3Reference, feats: Tensor, tokens: Sequence[int], k: int) -> tuple[list[int], Tensor]:
    """What the runtime computes after a prefill: rows P = 0..N-1 pair (tokens[P+1], g[P]),
    then a greedy chain of k drafts. feats [N, 3Ht]; tokens has N+1 entries.
    Returns the drafts and the target-vocabulary logits at each chain step [k, V]."""
    n = feats.shape[0]
    assert len(tokens) == n + 1
    cache: dict = {}
    g = model.encode(feats.float())[None]
    toks = torch.tensor([list(tokens[1:])])
    h = model.layer(toks, g, torch.arange(n)[None], cache)[:, -1:]
    drafts, logits = [], []
    for step in range(k):
        lg = model.target_logits(h)[0, -1]
        logits.append(lg)
        d = int(lg.argmax())
        drafts.append(d)
        if step + 1 < k:
            h = model.layer(torch.tensor([[d]]), model.carry(h), torch.tensor([[n + step]]), cache)
    return drafts, torch.stack(logits)


def llama3_rope_factors(rope_theta: float, head_dim: int, scaling: Mapping[str, Any]) -> tuple[float, ...]:
    """Per-frequency divisors of Llama 3.1's rope scaling (llama.cpp's rope_freqs tensor)."""
    factor = float(scaling.get("factor", 8.0))
    low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
    old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * rope_theta ** (i / head_dim)
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return tuple(out)


def random_reference(cfg: Eagle3Config, seed: int = 0, embed: Tensor | None = None, scale: float = 1.0,
                     d2t: Tensor | None = None) -> Eagle3Reference:
    """A drafter with random weights (tests, fixtures): norms near 1, projections ~N(0, scale/sqrt(in))."""
    gen = torch.Generator().manual_seed(seed)
    model = Eagle3Reference(cfg, embed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * scale / math.sqrt(p.shape[-1]))
        if d2t is not None:
            model.d2t.copy_(d2t)
    return model
