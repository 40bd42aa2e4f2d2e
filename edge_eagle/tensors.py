"""The drafter's tensors, named once: one row per tensor, keyed by its reference name (the
SafeAILab/EAGLE `midlayer.*` names of reference.Eagle3Reference's state dict).

Each row says the GGUF name (None: the tensor goes into metadata, as EAGLE-3.1's fc_norm
weights do, since upstream llama.cpp refuses unknown tensors), the shape a config implies,
whether every checkpoint has it, whether the GGUF writer may quantize it, and the transform
from the reference layout to llama.cpp's. The converter (which tensors a checkpoint must and
may have, and their shapes), the GGUF writer (names, transforms, quantization) and the
trainer's speculators writer (through edge_eagle.converters.layouts) all read this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import gguf_keys as K

Shape = Callable[[Any], tuple[int, ...]]  # config (reference.Eagle3Config) -> shape
Transform = Callable[[np.ndarray, Any], np.ndarray]


def _same(w: np.ndarray, cfg: Any) -> np.ndarray:
    return w


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's interleaved-rope q/k rows -> HF rotate_half (the inverse of _permute)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate_half q/k rows -> llama.cpp's interleaved rope (conversion/llama.py permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@dataclass(frozen=True)
class DrafterTensor:
    ref: str
    gguf: str | None
    shape: Shape
    required: bool
    quantizable: bool
    transform: Transform = _same


def _q(c: Any) -> int:
    return c.num_attention_heads * c.head_dim


def _kv(c: Any) -> int:
    return c.num_key_value_heads * c.head_dim


_M = "midlayer."
DRAFTER_TENSORS: tuple[DrafterTensor, ...] = (
    DrafterTensor("fc.weight", K.T_FC, lambda c: (c.hidden_size, 3 * c.target_hidden_size), True, True),
    DrafterTensor("input_norm.weight", K.T_ENC_NORM, lambda c: (3 * c.target_hidden_size,), False, False),
    *(DrafterTensor(f"fc_norm.{i}.weight", None, lambda c: (c.target_hidden_size,), False, False) for i in range(3)),
    DrafterTensor("embed_tokens.weight", K.T_TOKEN_EMBD, lambda c: (c.vocab_size, c.hidden_size), False, True),
    DrafterTensor(_M + "input_layernorm.weight", K.T_ATTN_NORM, lambda c: (c.hidden_size,), True, False),
    DrafterTensor(_M + "hidden_norm.weight", K.T_ATTN_NORM_2, lambda c: (c.hidden_size,), True, False),
    DrafterTensor(_M + "self_attn.q_proj.weight", K.T_ATTN_Q, lambda c: (_q(c), 2 * c.hidden_size), True, True,
                  lambda w, c: _permute(w, c.num_attention_heads)),
    DrafterTensor(_M + "self_attn.k_proj.weight", K.T_ATTN_K, lambda c: (_kv(c), 2 * c.hidden_size), True, True,
                  lambda w, c: _permute(w, c.num_key_value_heads)),
    DrafterTensor(_M + "self_attn.v_proj.weight", K.T_ATTN_V, lambda c: (_kv(c), 2 * c.hidden_size), True, True),
    DrafterTensor(_M + "self_attn.o_proj.weight", K.T_ATTN_OUT, lambda c: (c.hidden_size, _q(c)), True, True),
    DrafterTensor(_M + "post_attention_layernorm.weight", K.T_FFN_NORM, lambda c: (c.hidden_size,), True, False),
    DrafterTensor(_M + "mlp.gate_proj.weight", K.T_FFN_GATE, lambda c: (c.intermediate_size, c.hidden_size),
                  True, True),
    DrafterTensor(_M + "mlp.up_proj.weight", K.T_FFN_UP, lambda c: (c.intermediate_size, c.hidden_size), True, True),
    DrafterTensor(_M + "mlp.down_proj.weight", K.T_FFN_DOWN, lambda c: (c.hidden_size, c.intermediate_size),
                  True, True),
    DrafterTensor("norm.weight", K.T_OUTPUT_NORM, lambda c: (c.hidden_size,), True, False),
    DrafterTensor("lm_head.weight", K.T_OUTPUT, lambda c: (c.draft_vocab_size, c.hidden_size), True, True),
    # draft id -> target id; absolute ids (int64) in GGUF, offsets in HF checkpoints
    DrafterTensor("d2t", K.T_D2T, lambda c: (c.draft_vocab_size,), False, False),
)
BY_REF = {t.ref: t for t in DRAFTER_TENSORS}
REQUIRED = tuple(t.ref for t in DRAFTER_TENSORS if t.required)


def expected_shapes(cfg: Any) -> dict[str, tuple[int, ...]]:
    return {t.ref: t.shape(cfg) for t in DRAFTER_TENSORS}
