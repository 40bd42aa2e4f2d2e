"""A drafter GGUF read back into the torch reference (dequantised), so that training can start from
the weights a user runs: the shipped drafter, one trained here, or a published one converted by
`edge-eagle convert`. The inverse of converters/gguf_out.py: the same table (edge_eagle.tensors)
names every tensor, q/k rows go back from llama.cpp's interleaved rope to rotate_half, EAGLE-3.1's
fc_norm weights come from the metadata, and a drafter without its own embedding borrows the
target's."""

from __future__ import annotations

import os

import numpy as np

from .. import gguf_keys as K
from ..errors import ModelFileError
from ..gguf_file import GGUFFile, read_gguf
from ..tensors import DRAFTER_TENSORS, unpermute


def read_drafter(drafter: str | os.PathLike[str] | GGUFFile, target: str | os.PathLike[str] | GGUFFile):
    """(Eagle3Config, {reference name: float32 array, 'd2t': int64 absolute ids}) of a drafter GGUF
    that fits `target` (eagle.spec.check_pair's checks, with its messages)."""
    from ..checks.reference import Eagle3Config
    from ..eagle.spec import check_pair

    g = drafter if isinstance(drafter, GGUFFile) else read_gguf(drafter)
    t = target if isinstance(target, GGUFFile) else read_gguf(target)
    spec = check_pair(g, t)
    heads = int(g.require(K.HEAD_COUNT))
    kv = int(g.get(K.HEAD_COUNT_KV, heads))
    gate = g.tensors.get("blk.0.ffn_gate.weight")
    if gate is None:
        raise ModelFileError(f"{g.path.name} lacks blk.0.ffn_gate.weight; re-convert it with `edge-eagle convert`.")
    factors = None
    if "rope_freqs.weight" in g.tensors:
        factors = tuple(float(x) for x in g.tensor_array("rope_freqs.weight"))
    cfg = Eagle3Config(
        hidden_size=spec.hidden_size, intermediate_size=int(gate.shape[1]), num_attention_heads=heads,
        num_key_value_heads=kv, target_hidden_size=spec.target_hidden_size, vocab_size=t.vocab_size,
        draft_vocab_size=spec.draft_vocab_size, target_layers=spec.target_layers,
        head_dim=int(g.get(K.KEY_LENGTH, 0) or 0), rms_norm_eps=spec.rms_eps,
        rope_theta=float(g.get(K.ROPE_FREQ_BASE, 10000.0)),
        max_position_embeddings=int(g.get(K.CONTEXT_LENGTH, 8192)),
        norm_before_residual=spec.norm_before_residual, norm_before_fc=spec.norm_before_fc,
        fc_norm=spec.fc_norm, norm_output=spec.norm_output, has_embedding=spec.has_embedding,
        rope_freq_factors=factors)
    weights: dict[str, np.ndarray] = {}
    for row in DRAFTER_TENSORS:
        if row.ref == "d2t":
            continue
        if row.gguf is None or row.gguf not in g.tensors:
            continue
        w = np.asarray(g.tensor_array(row.gguf), dtype=np.float32)
        if row.ref.endswith("q_proj.weight"):
            w = unpermute(w, heads)
        elif row.ref.endswith("k_proj.weight"):
            w = unpermute(w, kv)
        weights[row.ref] = np.ascontiguousarray(w)
    if spec.fc_norm:
        for i in range(3):
            weights[f"fc_norm.{i}.weight"] = np.asarray(g.meta[K.FC_NORM_WEIGHTS.format(i=i)], np.float32)
    weights["d2t"] = (g.tensor_array(K.T_D2T).astype(np.int64) if K.T_D2T in g.tensors
                      else np.arange(cfg.draft_vocab_size, dtype=np.int64))
    return cfg, weights


def reference_from_gguf(drafter: str | os.PathLike[str] | GGUFFile, target: str | os.PathLike[str] | GGUFFile):
    """The drafter as a trainable checks.reference.Eagle3Reference (float32, dequantised)."""
    import torch

    from ..checks.reference import Eagle3Reference

    t = target if isinstance(target, GGUFFile) else read_gguf(target)
    cfg, weights = read_drafter(drafter, t)
    embed = None if cfg.has_embedding else torch.from_numpy(np.asarray(t.tensor_array(K.T_TOKEN_EMBD), np.float32))
    model = Eagle3Reference(cfg, embed)
    state = {name: torch.from_numpy(w) for name, w in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if m != "target_embed"]
    if missing or unexpected:
        raise ModelFileError(f"{getattr(drafter, 'path', drafter)} does not map onto an EAGLE-3 drafter "
                             f"(missing {missing[:3]}, unexpected {unexpected[:3]}); re-convert it.")
    return model
