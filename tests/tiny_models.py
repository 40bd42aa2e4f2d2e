"""Tiny synthetic GGUF models for fast tests: a llama-arch target with random weights and
the real SmolLM2 tokenizer, and eagle3 drafters built from the torch reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from edge_eagle.converters.gguf_out import copy_tokenizer, write_eagle3
from edge_eagle.converters.layouts import BY_NAME, to_layout
from gguf import GGUFWriter

from edge_eagle import defaults
from edge_eagle.checks.reference import Eagle3Config, Eagle3Reference, random_reference
from edge_eagle.gguf_file import GGUFFile, read_gguf

TINY = dict(n_layer=8, hidden=64, heads=4, kv_heads=2, ffn=128, rope_theta=10000.0, eps=1e-5)


def smollm_path() -> Path:
    return defaults.default_target()


def write_tiny_target(path: Path, seed: int = 0, arch: str = "llama", chat_template: str | None = None,
                      **overrides: int) -> Path:
    """A GGUF of `arch` (llama or qwen2): TINY sizes, random f32 weights, SmolLM2's tokenizer
    and chat template (chat_template, when given, in its place)."""
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
    if chat_template is not None:
        w.add_chat_template(chat_template)

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
    model = random_drafter_model(target, drafter_config(target, draft_vocab, **flags), seed)
    write_eagle3(path, reference_weights(model), model.cfg, target, upstream_only=upstream_only)
    return path, model


def random_drafter_model(target: GGUFFile, cfg: Eagle3Config, seed: int) -> Eagle3Reference:
    """Random weights, the target's embedding unless cfg has its own, a random sorted draft vocabulary."""
    embed = None if cfg.has_embedding else torch.from_numpy(target.tensor_array("token_embd.weight"))
    d2t = torch.randperm(target.vocab_size, generator=torch.Generator().manual_seed(seed))
    return random_reference(cfg, seed=seed, embed=embed, d2t=d2t[:cfg.draft_vocab_size].sort().values)


# --- published-checkpoint layouts, written from a reference model -------------------------

LAYOUT_FLAGS = {  # Eagle3Config flags each layout's fixture exercises
    "safeailab": {},
    "specforge": {},
    "eagle3.1": {"fc_norm": True, "norm_output": True},
    "speculators": {"norm_before_residual": True},
    "eagle3-v3": {"norm_before_fc": True},
    "nemo": {"fc_norm": True, "norm_output": True, "has_embedding": True},
}


def reference_weights(model) -> dict[str, np.ndarray]:
    """A reference model's state dict as numpy, in the reference names of edge_eagle.tensors."""
    return {k: v.detach().cpu().float().numpy() if v.is_floating_point() else v.detach().cpu().numpy()
            for k, v in model.state_dict().items()}


def write_checkpoint(directory: Path, layout: str, model: Eagle3Reference, *, weights: str = "safetensors",
                     config_overrides: dict | None = None) -> Path:
    """A checkpoint directory as `layout` publishes it: HF d2t offsets, t2d, its config.json."""
    import json

    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    c = model.cfg
    sd = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    d2t_abs = sd.pop("d2t")
    sd["d2t"] = d2t_abs - np.arange(len(d2t_abs))  # HF convention: offsets
    t2d = np.zeros(c.vocab_size, dtype=bool)
    t2d[d2t_abs] = True
    sd["t2d"] = t2d
    tensors = {to_layout(BY_NAME[layout], k): v for k, v in sd.items()}
    arch = {"hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
            "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta, "num_hidden_layers": 1,
            "max_position_embeddings": c.max_position_embeddings, "vocab_size": c.vocab_size}
    eagle = {"draft_vocab_size": c.draft_vocab_size, "target_hidden_size": c.target_hidden_size}
    ids = list(c.target_layers)
    if layout == "safeailab":
        config = {"architectures": ["LlamaForCausalLMEagle3"], **arch, **eagle,
                  "eagle_aux_hidden_state_layer_ids": ids}
    elif layout in ("specforge", "eagle3.1"):
        config = {"architectures": ["LlamaForCausalLMEagle3"], **arch, **eagle,
                  "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in ids]}}
        if layout == "eagle3.1":
            config.update(fc_norm=True, norm_output=True)
    elif layout == "speculators":
        config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                  "transformer_layer_config": {**arch, "model_type": "llama"}, **eagle,
                  "eagle_aux_hidden_state_layer_ids": ids}  # norm_before_residual: default true
    elif layout == "eagle3-v3":
        config = {"architectures": ["LlamaForCausalLMEagle3"], **arch, **eagle, "norm_before_fc": True,
                  "eagle_aux_hidden_state_layer_ids": ids}
    elif layout == "nemo":
        config = {"architectures": ["LlamaForCausalLM"], **arch, **eagle, "norm_output": True,
                  "eagle_aux_hidden_state_layer_ids": ids}
    else:
        raise ValueError(layout)
    config.update(config_overrides or {})
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    if weights == "safetensors":
        save_file(tensors, str(directory / "model.safetensors"))
    elif weights == "sharded":
        names = sorted(tensors)
        half = len(names) // 2
        shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
        for fname, part in shards.items():
            save_file({n: tensors[n] for n in part}, str(directory / fname))
        index = {"metadata": {}, "weight_map": {n: f for f, part in shards.items() for n in part}}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    elif weights == "bin":
        torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()},
                   directory / "pytorch_model.bin")
    return directory


def layout_reference(layout: str, target_path: Path, seed: int = 0) -> Eagle3Reference:
    target = read_gguf(target_path)
    cfg = drafter_config(target, 2048, **LAYOUT_FLAGS[layout])
    cfg.target_layers = (2, 3, 5)  # not the default: the converter must read them from config.json
    return random_drafter_model(target, cfg, seed)
