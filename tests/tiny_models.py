"""Tiny synthetic GGUF models for fast tests: a llama-arch target with random weights and
the real SmolLM2 tokenizer, and eagle3 drafters built from the torch reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGUFWriter

from converters.gguf_out import copy_tokenizer, reference_weights, write_eagle3
from edge_eagle import defaults
from edge_eagle.gguf_file import GGUFFile, read_gguf
from edge_eagle.reference import Eagle3Config, Eagle3Reference, random_reference

TINY = dict(n_layer=8, hidden=64, heads=4, kv_heads=2, ffn=128, rope_theta=10000.0, eps=1e-5)


def smollm_path() -> Path:
    return defaults.default_target()


def write_tiny_target(path: Path, seed: int = 0, arch: str = "llama", **overrides: int) -> Path:
    """A GGUF of `arch` (llama or qwen2): TINY sizes, random f32 weights, SmolLM2's tokenizer
    and chat template."""
    cfg = {**TINY, **overrides}
    tok_src = read_gguf(smollm_path())
    rng = np.random.default_rng(seed)
    h, f, nl = cfg["hidden"], cfg["ffn"], cfg["n_layer"]
    hd = h // cfg["heads"]
    w = GGUFWriter(str(path), arch)
    w.add_string("general.name", "tiny test target")
    w.add_uint32(f"{arch}.block_count", nl)
    w.add_uint32(f"{arch}.context_length", 2048)
    w.add_uint32(f"{arch}.embedding_length", h)
    w.add_uint32(f"{arch}.feed_forward_length", f)
    w.add_uint32(f"{arch}.attention.head_count", cfg["heads"])
    w.add_uint32(f"{arch}.attention.head_count_kv", cfg["kv_heads"])
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg["eps"])
    w.add_float32(f"{arch}.rope.freq_base", cfg["rope_theta"])
    w.add_uint32(f"{arch}.rope.dimension_count", hd)
    w.add_uint32(f"{arch}.vocab_size", tok_src.vocab_size)
    copy_tokenizer(w, tok_src)

    def lin(out_f: int, in_f: int) -> np.ndarray:
        return (rng.standard_normal((out_f, in_f)) / np.sqrt(in_f)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w.add_tensor("token_embd.weight", rng.standard_normal((tok_src.vocab_size, h)).astype(np.float32))
    w.add_tensor("output_norm.weight", norm(h))
    for i in range(nl):
        w.add_tensor(f"blk.{i}.attn_norm.weight", norm(h))
        w.add_tensor(f"blk.{i}.attn_q.weight", lin(h, h))
        w.add_tensor(f"blk.{i}.attn_k.weight", lin(cfg["kv_heads"] * hd, h))
        w.add_tensor(f"blk.{i}.attn_v.weight", lin(cfg["kv_heads"] * hd, h))
        w.add_tensor(f"blk.{i}.attn_output.weight", lin(h, h))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", norm(h))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", lin(f, h))
        w.add_tensor(f"blk.{i}.ffn_up.weight", lin(f, h))
        w.add_tensor(f"blk.{i}.ffn_down.weight", lin(h, f))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def drafter_config(target: GGUFFile, draft_vocab: int = 2048, **flags: bool) -> Eagle3Config:
    h = int(target.require("{arch}.embedding_length"))
    nl = int(target.require("{arch}.block_count"))
    heads = int(target.require("{arch}.attention.head_count"))
    kv = int(target.require("{arch}.attention.head_count_kv"))
    return Eagle3Config(hidden_size=h, intermediate_size=2 * h, num_attention_heads=heads, num_key_value_heads=kv,
                        target_hidden_size=h, vocab_size=target.vocab_size, draft_vocab_size=draft_vocab,
                        target_layers=(2, nl // 2, nl - 3), rope_theta=float(target.get("{arch}.rope.freq_base")),
                        rms_norm_eps=1e-5, **flags)


def make_drafter(path: Path, target_path: Path, seed: int = 0, draft_vocab: int = 2048, upstream_only: bool = False,
                 **flags: bool) -> tuple[Path, Eagle3Reference]:
    """A random eagle3 drafter for this target, written to GGUF; returns the path and the reference."""
    target = read_gguf(target_path)
    cfg = drafter_config(target, draft_vocab, **flags)
    embed = None if cfg.has_embedding else torch.from_numpy(target.tensor_array("token_embd.weight"))
    d2t = torch.randperm(target.vocab_size, generator=torch.Generator().manual_seed(seed))[:draft_vocab].sort().values
    model = random_reference(cfg, seed=seed, embed=embed, d2t=d2t)
    write_eagle3(path, reference_weights(model), cfg, target, upstream_only=upstream_only)
    return path, model
