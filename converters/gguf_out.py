"""Write an eagle3 GGUF from reference-named weights, against a target GGUF.

The per-tensor knowledge (GGUF name, transform, may-quantize) is edge_eagle.tensors'
table. Keys and tensor names match upstream llama.cpp 0c1e57098's converter, so upstream
loads the file; EAGLE-3.1 and provenance go into edge_eagle.* keys it ignores.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, LlamaFileType
from gguf.quants import quantize

from edge_eagle import gguf_keys as K
from edge_eagle import tensors as T
from edge_eagle.checks.reference import Eagle3Config
from edge_eagle.errors import EdgeEagleError
from edge_eagle.fsutil import atomic_path
from edge_eagle.gguf_file import GGUFFile

CONVERTER_VERSION = "edge-eagle-convert/0.1.0"

D2T = "d2t"
FILE_TYPES = {"f32": LlamaFileType.ALL_F32, "f16": LlamaFileType.MOSTLY_F16, "bf16": LlamaFileType.MOSTLY_BF16,
              "q8_0": LlamaFileType.MOSTLY_Q8_0}
OUTTYPES = {
    "f32": GGMLQuantizationType.F32,
    "f16": GGMLQuantizationType.F16,
    "bf16": GGMLQuantizationType.BF16,
    "q8_0": GGMLQuantizationType.Q8_0,
}


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
    unknown = sorted(set(weights) - set(T.BY_REF))
    if unknown:
        raise EdgeEagleError(f"Unexpected tensors {unknown[:5]}; the checkpoint layout is not one edge-eagle knows.")

    with atomic_path(out, suffix=".part") as tmp:
        w = GGUFWriter(str(tmp), arch)
        w.add_name(name)
        w.add_file_type(FILE_TYPES[outtype])
        w.add_context_length(cfg.max_position_embeddings)
        w.add_embedding_length(cfg.hidden_size)
        w.add_block_count(1)
        w.add_feed_forward_length(cfg.intermediate_size)
        w.add_head_count(cfg.num_attention_heads)
        w.add_head_count_kv(cfg.num_key_value_heads)
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
        w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
        w.add_rope_freq_base(cfg.rope_theta)
        w.add_rope_dimension_count(cfg.head_dim)
        w.add_vocab_size(cfg.vocab_size)
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

        for row in T.DRAFTER_TENSORS:
            if row.ref not in weights or row.gguf is None or row.ref == D2T:
                continue
            dst = row.gguf
            data = row.transform(np.asarray(weights[row.ref], dtype=np.float32), cfg)
            if row.quantizable and data.ndim == 2 and qtype != GGMLQuantizationType.F32:
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
