"""The host side of EAGLE-3.1's two norms, which upstream llama.cpp does not run:
- fc_norm: each captured layer's state gets its own RMSNorm before fc;
- norm_output: the state fed to the next chain step is norm(h), not the pre-norm h.
"""

from __future__ import annotations

import os

import numpy as np

from .. import gguf_keys as K
from ..errors import ModelFileError
from ..gguf_file import GGUFFile
from .spec import Eagle3Spec


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis as ggml computes it: the sum of squares in double (each
    float32 product is exact there), mean and scale in float32, then (x * scale) * weight.
    The native fast path (_fastpath.c) does the same operations, so both give the same bits."""
    x = x.astype(np.float32, copy=False)
    # einsum for the sum of squares: np.mean's Python-level wrapper costs more than the math here
    mean = (np.einsum("...i,...i->...", x, x, dtype=np.float64) / x.shape[-1]).astype(np.float32)
    scale = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
    return (x * scale[..., None] * weight).astype(np.float32, copy=False)


class Norms:
    """A drafter's host-side norms: fc_norm's three weights ([3, H_tgt], or None) and the final
    norm's weight when norm_output feeds norm(h) back (or None), with their epsilon."""

    def __init__(self, gguf: GGUFFile, spec: Eagle3Spec):
        self.eps = spec.rms_eps
        self.target_hidden_size = spec.target_hidden_size
        self.fc_norm_w: np.ndarray | None = None
        self.out_norm_w: np.ndarray | None = None
        if spec.fc_norm:
            weights = [np.asarray(gguf.meta[K.FC_NORM_WEIGHTS.format(i=i)], np.float32) for i in range(3)]
            if any(w.shape != (spec.target_hidden_size,) for w in weights):
                raise ModelFileError(f"{os.path.basename(gguf.path)} has fc_norm weights of the wrong size; "
                                     "re-convert it.")
            self.fc_norm_w = np.stack(weights)
        if spec.norm_output:
            self.out_norm_w = gguf.tensor_array(K.T_OUTPUT_NORM).astype(np.float32)

    def features(self, feats: np.ndarray) -> np.ndarray:
        """Target features [n, 3 H_tgt] as fc takes them: each layer's part RMS-normed (fc_norm)."""
        if self.fc_norm_w is None:
            return np.ascontiguousarray(feats, dtype=np.float32)
        n, h = len(feats), self.target_hidden_size  # the three layers' RMSNorms in one pass
        return rms_norm(feats.reshape(n, 3, h), self.fc_norm_w, self.eps).reshape(n, 3 * h)

    def carry(self, h: np.ndarray) -> np.ndarray:
        """The state fed to the next chain step: h (EAGLE-3) or norm(h) (EAGLE-3.1 norm_output)."""
        if self.out_norm_w is not None:
            return rms_norm(h, self.out_norm_w, self.eps)
        return h
