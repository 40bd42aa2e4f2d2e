"""The drafter's llama.cpp batches: fc over target features (the encoder), and decoder rows of
(token, g). Batches is the reference implementation through llama-cpp-python's ctypes;
native.NativeBatches runs the same batches, and whole chains and cycles, in C.

The eagle3 decoder graph has no out_ids, so llama.cpp copies its FIRST n_outputs rows: a short
batch marks every row as output and reads the last; a long one (a prefill) runs all but the last
row without outputs, then the last row alone.
"""

from __future__ import annotations

import ctypes
from typing import Any, Sequence

import numpy as np
from llama_cpp import llama_cpp as C

from .. import _bindings as B
from .._llama import float_view
from ..errors import LlamaCallError
from .norms import Norms

ALL_OUTPUTS_MAX = 16  # decoder batches up to this many rows mark every row as an output


class Batches:
    """One drafter context's batches, through ctypes."""

    def __init__(self, ctx: Any, norms: Norms, n_embd: int, n_vocab: int, n_batch: int):
        self.ctx, self.norms = ctx, norms
        self.n_embd, self.n_vocab, self.n_batch = n_embd, n_vocab, n_batch
        self.batch = C.llama_batch_ext_init(ctx)
        self._pos = C.llama_pos(0)

    def encode(self, feats: np.ndarray, pos0: int) -> np.ndarray:
        """fc (and norm_before_fc / fc_norm) of target features [n, 3H_t] -> g [n, H].

        The encoder ignores positions, but llama.cpp checks them against the KV memory:
        they must continue from its last position, so pass the rows' real positions."""
        feats = self.norms.features(feats)
        n, width = feats.shape
        out = np.empty((n, self.n_embd), np.float32)
        for lo in range(0, n, self.n_batch):
            hi = min(n, lo + self.n_batch)
            C.llama_batch_ext_clear(self.batch)
            for i in range(lo, hi):
                row = feats[i]
                idx = C.llama_batch_ext_add_embd(self.batch, 0, C.llama_embd(
                    row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, width))
                self._pos.value = pos0 + i - lo  # every chunk continues from the same memory state
                C.llama_batch_ext_set_pos(self.batch, idx, ctypes.byref(self._pos))
                C.llama_batch_ext_set_output_logits(self.batch, idx, True)
            rc = C.llama_process(self.ctx, C.LLAMA_PROCESS_TYPE_ENCODE, self.batch)
            if rc != 0:
                raise LlamaCallError("drafter encoder", rc)
            out[lo:hi] = float_view(B.llama_get_embeddings_nextn(self.ctx), hi - lo, self.n_embd)
        return out

    def decode_rows(self, tokens: Sequence[int], g: np.ndarray, positions: Sequence[int], outputs: bool,
                    seqs: Sequence[int] | None = None) -> None:
        """One decoder batch: row i is (tokens[i], g[i]) at positions[i] in sequence seqs[i]
        (default 0)."""
        C.llama_batch_ext_clear(self.batch)
        for i, tok in enumerate(tokens):
            idx = C.llama_batch_ext_add_token(self.batch, 0 if seqs is None else seqs[i], int(tok))
            self._pos.value = positions[i]
            C.llama_batch_ext_set_pos(self.batch, idx, ctypes.byref(self._pos))
            C.llama_batch_ext_set_embd_token(self.batch, idx, C.llama_embd(
                g[i].ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, self.n_embd))
            if outputs:
                C.llama_batch_ext_set_output_logits(self.batch, idx, True)
        rc = C.llama_process(self.ctx, C.LLAMA_PROCESS_TYPE_DECODE, self.batch)
        if rc != 0:
            raise LlamaCallError("drafter decode", rc)

    def decode(self, tokens: Sequence[int], g: np.ndarray, pos0: int) -> tuple[np.ndarray, np.ndarray]:
        """Decoder rows (tokens[i], g[i]) at pos0+i; logits [n_vocab] (a view) and pre-norm h [H]
        (a copy) of the last."""
        n = len(tokens)
        g = np.ascontiguousarray(g, dtype=np.float32)
        if n <= ALL_OUTPUTS_MAX:
            self.decode_rows(tokens, g, range(pos0, pos0 + n), outputs=True)
            last = n - 1
        else:
            for lo in range(0, n - 1, self.n_batch):
                hi = min(n - 1, lo + self.n_batch)
                self.decode_rows(tokens[lo:hi], g[lo:hi], range(pos0 + lo, pos0 + hi), outputs=False)
            self.decode_rows(tokens[n - 1:], g[n - 1:], [pos0 + n - 1], outputs=True)
            last = 0
        logits, h = self.row(last)
        return logits, h.copy()

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Output row i of the last decoder batch: its logits and pre-norm h (views)."""
        logits = float_view(C.llama_get_logits_ith(self.ctx, i), 1, self.n_vocab)[0]
        h = float_view(B.llama_get_embeddings_nextn_ith(self.ctx, i), 1, self.n_embd)[0]
        return logits, h

    def close(self) -> None:
        if self.batch is not None:
            C.llama_batch_ext_free(self.batch)
            self.batch = None
