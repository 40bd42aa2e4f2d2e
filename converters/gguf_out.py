"""Write an eagle3 GGUF from reference-named weights, against a target GGUF.

The table below is all the per-tensor knowledge: reference name -> (GGUF name, transform,
may-quantize). Keys and tensor names match upstream llama.cpp 0c1e57098's converter, so
upstream loads the file; EAGLE-3.1 and provenance go into edge_eagle.* keys it ignores.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf.quants import quantize

from edge_eagle import gguf_keys as K
from edge_eagle.errors import EdgeEagleError
from edge_eagle.fsutil import atomic_path
from edge_eagle.gguf_file import GGUFFile
from edge_eagle.reference import Eagle3Config

CONVERTER_VERSION = "edge-eagle-convert/0.1.0"

OUTTYPES = {
    "f32": GGMLQuantizationType.F32,
    "f16": GGMLQuantizationType.F16,
    "bf16": GGMLQuantizationType.BF16,
    "q8_0": GGMLQuantizationType.Q8_0,
}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate_half q/k rows -> llama.cpp's interleaved rope (conversion/llama.py permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


Transform = Callable[[np.ndarray, Eagle3Config], np.ndarray]
_same: Transform = lambda w, cfg: w  # noqa: E731

# reference name -> (gguf name, transform, quantizable)
TENSOR_TABLE: dict[str, tuple[str, Transform, bool]] = {
    "fc.weight": (K.T_FC, _same, True),
    "input_norm.weight": (K.T_ENC_NORM, _same, False),
    "embed_tokens.weight": (K.T_TOKEN_EMBD, _same, True),
    "midlayer.input_layernorm.weight": (K.T_ATTN_NORM, _same, False),
    "midlayer.hidden_norm.weight": (K.T_ATTN_NORM_2, _same, False),
    "midlayer.self_attn.q_proj.weight": (K.T_ATTN_Q, lambda w, c: _permute(w, c.num_attention_heads), True),
    "midlayer.self_attn.k_proj.weight": (K.T_ATTN_K, lambda w, c: _permute(w, c.num_key_value_heads), True),
    "midlayer.self_attn.v_proj.weight": (K.T_ATTN_V, _same, True),
    "midlayer.self_attn.o_proj.weight": (K.T_ATTN_OUT, _same, True),
    "midlayer.post_attention_layernorm.weight": (K.T_FFN_NORM, _same, False),
    "midlayer.mlp.gate_proj.weight": (K.T_FFN_GATE, _same, True),
    "midlayer.mlp.up_proj.weight": (K.T_FFN_UP, _same, True),
    "midlayer.mlp.down_proj.weight": (K.T_FFN_DOWN, _same, True),
    "norm.weight": (K.T_OUTPUT_NORM, _same, False),
    "lm_head.weight": (K.T_OUTPUT, _same, True),
}
# kept out of the tensor data: fc_norm goes to metadata (upstream rejects unknown tensors)
METADATA_TENSORS = {f"fc_norm.{i}.weight" for i in range(3)}
D2T = "d2t"


def copy_tokenizer(w: GGUFWriter, target: GGUFFile) -> None:
    for key, (vtype, item) in target.types.items():
        if not key.startswith(K.TOKENIZER_PREFIX):
            continue
        value = target.value(key)
        if isinstance(value, np.ndarray):
            value = value.tolist()
        w.add_key_value(key, value, GGUFValueType(vtype), GGUFValueType(item) if item is not None else None)


def write_eagle3(out: str | os.PathLike[str], weights: Mapping[str, np.ndarray], cfg: Eagle3Config,
                 target: GGUFFile, *, outtype: str = "f32", provenance: Mapping[str, str] | None = None,
                 name: str = "eagle3 drafter", progress: bool = False, upstream_only: bool = False) -> Path:
    """Write atomically: the file appears complete at `out`, or not at all.

    upstream_only writes exactly what upstream's convert_hf_to_gguf.py writes (no
    edge_eagle.* keys), which cannot express EAGLE-3.1."""
    if upstream_only and (cfg.fc_norm or cfg.norm_output):
        raise EdgeEagleError("An upstream-only GGUF cannot carry EAGLE-3.1 fc_norm/norm_output; drop upstream_only.")
    if outtype not in OUTTYPES:
        raise EdgeEagleError(f"Unknown --outtype '{outtype}'; use one of {', '.join(OUTTYPES)}.")
    qtype = OUTTYPES[outtype]
    out = Path(out)
    arch = K.EAGLE3
    fmt = lambda key: key.format(arch=arch)  # noqa: E731
    known = set(TENSOR_TABLE) | METADATA_TENSORS | {D2T}
    unknown = sorted(set(weights) - known)
    if unknown:
        raise EdgeEagleError(f"Unexpected tensors {unknown[:5]}; the checkpoint layout is not one edge-eagle knows.")

    with atomic_path(out, suffix=".part") as tmp:
        w = GGUFWriter(str(tmp), arch)
        w.add_string("general.name", name)
        w.add_uint32("general.file_type", {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7}[outtype])
        w.add_uint32(fmt(K.CONTEXT_LENGTH), cfg.max_position_embeddings)
        w.add_uint32(fmt(K.EMBEDDING_LENGTH), cfg.hidden_size)
        w.add_uint32(fmt(K.BLOCK_COUNT), 1)
        w.add_uint32(fmt(K.FEED_FORWARD_LENGTH), cfg.intermediate_size)
        w.add_uint32(fmt(K.HEAD_COUNT), cfg.num_attention_heads)
        w.add_uint32(fmt(K.HEAD_COUNT_KV), cfg.num_key_value_heads)
        w.add_uint32(fmt(K.KEY_LENGTH), cfg.head_dim)
        w.add_uint32(fmt(K.VALUE_LENGTH), cfg.head_dim)
        w.add_float32(fmt(K.RMS_EPS), cfg.rms_norm_eps)
        w.add_float32(fmt(K.ROPE_FREQ_BASE), cfg.rope_theta)
        w.add_uint32(fmt(K.ROPE_DIM), cfg.head_dim)
        w.add_uint32(fmt(K.VOCAB_SIZE), cfg.vocab_size)
        w.add_array(K.TARGET_LAYERS, list(cfg.target_layers))
        w.add_uint32(K.TARGET_HIDDEN_SIZE, cfg.target_hidden_size)
        w.add_bool(K.NORM_BEFORE_RESIDUAL, cfg.norm_before_residual)
        w.add_bool(K.NORM_BEFORE_FC, cfg.norm_before_fc)
        if not upstream_only:
            w.add_bool(K.FC_NORM, cfg.fc_norm)
            w.add_bool(K.NORM_OUTPUT, cfg.norm_output)
            if cfg.fc_norm:
                for i in range(3):
                    w.add_array(K.FC_NORM_WEIGHTS.format(i=i), np.asarray(weights[f"fc_norm.{i}.weight"],
                                                                         np.float32).tolist())
            w.add_string(K.TARGET_VOCAB_FINGERPRINT, target.vocab_fingerprint())
            w.add_string(K.CONVERTER_VERSION, CONVERTER_VERSION)
            for key, value in (provenance or {}).items():
                w.add_string(f"edge_eagle.{key}", str(value))
        copy_tokenizer(w, target)

        for src, (dst, transform, quantizable) in TENSOR_TABLE.items():
            if src not in weights:
                continue
            data = transform(np.asarray(weights[src], dtype=np.float32), cfg)
            if quantizable and data.ndim == 2 and qtype != GGMLQuantizationType.F32:
                if qtype == GGMLQuantizationType.Q8_0 and data.shape[-1] % 32:
                    w.add_tensor(dst, data.astype(np.float16))  # q8_0 needs rows of 32k; keep f16
                else:
                    w.add_tensor(dst, quantize(data, qtype), raw_dtype=qtype)
            else:
                w.add_tensor(dst, np.ascontiguousarray(data, dtype=np.float32))
        if cfg.rope_freq_factors is not None:
            w.add_tensor("rope_freqs.weight", np.asarray(cfg.rope_freq_factors, dtype=np.float32))
        if D2T in weights:
            w.add_tensor(K.T_D2T, np.asarray(weights[D2T], dtype=np.int64).reshape(-1),
                         raw_dtype=GGMLQuantizationType.I64)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file(progress=progress)
        w.close()
    return out


def reference_weights(model: Any) -> dict[str, np.ndarray]:
    """A reference model's state dict as numpy, in the names TENSOR_TABLE knows."""
    sd = {k: v.detach().cpu().float().numpy() if v.is_floating_point() else v.detach().cpu().numpy()
          for k, v in model.state_dict().items()}
    return sd
