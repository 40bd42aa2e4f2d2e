"""The EAGLE-3 / EAGLE-3.1 drafter, run by llama.cpp with EAGLE-3.1 finished on the host.

llama.cpp runs the encoder (fc, plus norm_before_fc) and the one-layer decoder. Upstream
has no EAGLE-3.1, so two things happen here, switched by GGUF metadata:
- fc_norm: each captured layer's state gets its own RMSNorm before fc;
- norm_output: the state fed to the next chain step is norm(h), not the pre-norm h.

Pairing (NOTES §1): at position P the decoder consumes (token[P+1], g[P]). Rows whose
next token is not known yet stay pending until propose() supplies it, and only rows the
target accepted are ever run: after a verify the loop ingests just the accepted rows.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from llama_cpp import llama_cpp as C

from . import _bindings as B
from . import _fast
from . import gguf_keys as K
from ._llama import (Memory, common_prefix, float_view, free_context, free_model, load_model, n_threads_default,
                     new_context)
from .drafter import Drafter
from .errors import EdgeEagleError, ModelFileError, PairMismatchError
from .gguf_file import GGUFFile, check_hparams, read_gguf
from .proposal import Proposal
from .target import Target


@dataclass(frozen=True)
class Eagle3Spec:
    """What a drafter GGUF says about itself, as the runtime needs it."""

    hidden_size: int
    target_hidden_size: int
    target_layers: tuple[int, int, int]
    draft_vocab_size: int
    rms_eps: float
    norm_before_residual: bool
    norm_before_fc: bool
    fc_norm: bool
    norm_output: bool
    has_embedding: bool
    has_lm_head: bool
    vocab_size: int
    vocab_fingerprint: str | None

    @property
    def version(self) -> str:
        return "EAGLE-3.1" if (self.fc_norm or self.norm_output) else "EAGLE-3"

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> "Eagle3Spec":
        name = g.path.name
        if g.arch != K.EAGLE3:
            raise ModelFileError(f"{name} is not an EAGLE-3 drafter (architecture '{g.arch}'); pass an eagle3 "
                                 "GGUF made by `edge-eagle convert`, or --drafter none.")
        layers = g.require(K.TARGET_LAYERS)
        if len(layers) != 3:
            raise ModelFileError(f"{name} names {len(layers)} target layers, not 3; re-convert it.")
        for t in (K.T_FC, K.T_OUTPUT_NORM, K.T_ATTN_Q):
            if t not in g.tensors:
                raise ModelFileError(f"{name} lacks tensor '{t}'; re-convert it with `edge-eagle convert`.")
        # llama.cpp GGML_ASSERTs (aborts the process) on these at decode time: refuse them here
        if int(g.require(K.BLOCK_COUNT)) != 1:
            raise ModelFileError(f"{name} has {g.get(K.BLOCK_COUNT)} decoder layers; an EAGLE-3 drafter has exactly 1.")
        if g.get(K.KEY_LENGTH, 0) != g.get(K.VALUE_LENGTH, 0):
            raise ModelFileError(f"{name} has different key and value head sizes, which llama.cpp's eagle3 cannot run.")
        fc_norm = bool(g.meta.get(K.FC_NORM, False))
        norm_before_fc = bool(g.get(K.NORM_BEFORE_FC, False))
        if fc_norm and norm_before_fc:
            raise ModelFileError(f"{name} sets both fc_norm and norm_before_fc; re-convert it with one of them.")
        d2t = g.tensors.get(K.T_D2T)
        return cls(
            hidden_size=int(g.require(K.EMBEDDING_LENGTH)),
            target_hidden_size=int(g.require(K.TARGET_HIDDEN_SIZE)),
            target_layers=tuple(int(x) for x in layers),  # type: ignore[arg-type]
            draft_vocab_size=int(d2t.shape[0]) if d2t else g.vocab_size,
            rms_eps=float(g.require(K.RMS_EPS)),
            norm_before_residual=bool(g.get(K.NORM_BEFORE_RESIDUAL, False)),
            norm_before_fc=norm_before_fc,
            fc_norm=fc_norm,
            norm_output=bool(g.meta.get(K.NORM_OUTPUT, False)),
            has_embedding=K.T_TOKEN_EMBD in g.tensors,
            has_lm_head=K.T_OUTPUT in g.tensors,
            vocab_size=g.vocab_size,
            vocab_fingerprint=g.meta.get(K.TARGET_VOCAB_FINGERPRINT),
        )


def layer_ids_problem(ids: Sequence[int], n_layer: int, arch: str, target_name: str) -> str | None:
    """Why these captured-layer ids (layer-input convention) cannot run on this target, or None.

    0 (the token embeddings, the input of layer 0) works where llama.cpp exports layer inputs;
    N (the final hidden state, speculators' "include last layer") is no layer's input, so
    llama.cpp's layer-input API cannot give it."""
    ids = [int(i) for i in ids]
    if n_layer in ids:
        return (f"captures layer id {n_layer}, the final hidden state of {target_name}'s {n_layer} layers, which "
                f"llama.cpp's layer-input capture cannot give (it ends at the input of layer {n_layer - 1}); use a "
                f"drafter trained on layer ids below {n_layer}.")
    bad = [i for i in ids if not 0 <= i < n_layer]
    if bad:
        return (f"captures target layers {ids}, some outside {target_name}'s {n_layer} layers; use a drafter made "
                "for this target (or convert one with `edge-eagle convert --target`).")
    if 0 in ids and arch not in K.LAYER_INPUT_ARCHS:
        return (f"captures layer 0 (the token embeddings), which the eval-callback capture that {target_name}'s "
                f"architecture ({arch}) needs cannot give; use a drafter whose layer ids start at 1.")
    return None


def check_pair(drafter: GGUFFile, target: GGUFFile) -> Eagle3Spec:
    """Raise PairMismatchError unless this drafter fits this target; return its spec."""
    spec = Eagle3Spec.from_gguf(drafter)
    d, t = drafter.path.name, target.path.name
    t_embd = int(target.require(K.EMBEDDING_LENGTH))
    t_layers = int(target.require(K.BLOCK_COUNT))
    hint = "use a drafter made for this target (or convert one with `edge-eagle convert --target`)."
    if spec.target_hidden_size != t_embd:
        raise PairMismatchError(f"{d} expects target hidden size {spec.target_hidden_size} but {t} has {t_embd}; {hint}")
    fc = drafter.tensors[K.T_FC]
    if fc.shape != (3 * t_embd, spec.hidden_size):
        raise PairMismatchError(f"{d} has fc of shape {list(fc.shape)}, which does not fit {t}; {hint}")
    problem = layer_ids_problem(spec.target_layers, t_layers, target.arch, t)
    if problem:
        raise PairMismatchError(f"{d} {problem}")
    if spec.vocab_size != target.vocab_size:
        raise PairMismatchError(f"{d} has a vocabulary of {spec.vocab_size} tokens but {t} has "
                                f"{target.vocab_size}; {hint}")
    if spec.vocab_fingerprint and spec.vocab_fingerprint != target.vocab_fingerprint():
        raise PairMismatchError(f"{d} was made for a different tokenizer than {t}'s (vocabulary fingerprints "
                                f"differ); {hint}")
    if (not spec.has_embedding or not spec.has_lm_head) and spec.hidden_size != t_embd:
        raise PairMismatchError(f"{d} borrows the target's embedding or lm_head but its hidden size "
                                f"{spec.hidden_size} differs from {t}'s {t_embd}; {hint}")
    if not spec.has_lm_head and spec.draft_vocab_size != target.vocab_size:
        raise PairMismatchError(f"{d} has a draft vocabulary but no lm_head of its own; re-convert it.")
    if K.T_D2T in drafter.tensors:
        d2t = drafter.tensor_array(K.T_D2T)
        if d2t.min() < 0 or d2t.max() >= target.vocab_size or len(np.unique(d2t)) != len(d2t):
            raise PairMismatchError(f"{d} maps draft tokens outside {t}'s vocabulary or twice; re-convert it.")
    return spec


TREE_DEPTH = 6  # default depth limit of a draft tree
TREE_BRANCH = 4  # default children per expanded node, and nodes expanded per depth
TREE_BRANCH_MAX = 8  # the drafter context holds one sequence per expanded node of a depth


def _top_logprobs(logits: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The k most probable tokens of a logit row and their log-probabilities, best first."""
    k = min(k, logits.shape[-1])
    top = np.argpartition(logits, -k)[-k:]
    top = top[np.argsort(-logits[top], kind="stable")]
    m = float(logits[top[0]])
    lse = m + float(np.log(np.exp(logits - m).sum()))
    return [(int(t), float(logits[t]) - lse) for t in top]


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis as ggml computes it: the sum of squares in double (each
    float32 product is exact there), mean and scale in float32, then (x * scale) * weight.
    The native fast path (_fastpath.c) does the same operations, so both give the same bits."""
    x = x.astype(np.float32, copy=False)
    # einsum for the sum of squares: np.mean's Python-level wrapper costs more than the math here
    mean = (np.einsum("...i,...i->...", x, x, dtype=np.float64) / x.shape[-1]).astype(np.float32)
    scale = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
    return (x * scale[..., None] * weight).astype(np.float32, copy=False)


class EagleDrafter(Drafter):
    """An eagle3 GGUF in a second llama.cpp context that borrows from the target's."""

    needs_features = True

    def __init__(self, path: str | os.PathLike[str], target: Target, *, n_gpu_layers: int = 0,
                 n_threads: int | None = None, gguf: GGUFFile | None = None, repack: str | None = None):
        self.path = os.fspath(path)
        self.gguf = gguf or read_gguf(self.path)
        check_hparams(self.gguf)
        self.spec = check_pair(self.gguf, target.gguf)
        self.name = f"{self.spec.version} ({os.path.basename(self.path)})"
        self.target_layers = self.spec.target_layers
        self.n_embd = self.spec.hidden_size
        self.n_vocab = target.n_vocab
        self.n_batch = 512
        eps = self.spec.rms_eps
        self._eps = eps
        if self.spec.fc_norm:
            self._fc_norm_w = [np.asarray(self.gguf.meta[K.FC_NORM_WEIGHTS.format(i=i)], np.float32)
                               for i in range(3)]
            if any(w.shape != (self.spec.target_hidden_size,) for w in self._fc_norm_w):
                raise ModelFileError(f"{os.path.basename(self.path)} has fc_norm weights of the wrong size; "
                                     "re-convert it.")
            self._fc_norm_w3 = np.stack(self._fc_norm_w)
        if self.spec.norm_output:
            self._out_norm_w = self.gguf.tensor_array(K.T_OUTPUT_NORM).astype(np.float32)

        threads = n_threads or n_threads_default()
        loaded = load_model(self.path, n_gpu_layers, 1, repack)
        self.model, self.repack, self.buffers = loaded.handle, loaded.repack, loaded.buffers
        # one sequence per expanded node of a depth; none when the target cannot verify trees
        self.tree_branch_max = min(TREE_BRANCH_MAX, min(self.n_batch, target.n_ctx) - 1) if target.tree_paths else 0
        self.supports_trees = self.tree_branch_max > 0
        self.ctx = new_context(self.model, os.path.basename(self.path), n_ctx=target.n_ctx,
                               n_batch=self.n_batch, n_ubatch=self.n_batch, n_threads=threads,
                               n_threads_batch=threads, no_perf=True, ctx_other=target.ctx,
                               n_seq_max=1 + self.tree_branch_max, kv_unified=self.supports_trees)
        B.llama_set_embeddings_nextn(self.ctx, True, True)
        self.memory = Memory(self.ctx)
        self._batch = C.llama_batch_ext_init(self.ctx)
        self._pos = C.llama_pos(0)
        self._init_fast()
        self.reset()

    def _init_fast(self) -> None:
        """The native fast path's inputs (None when it is off or not built): the draft vocabulary
        in ascending target ids (its logits are -inf elsewhere; None: scan every entry), the
        norm weights, and buffers for a chain's state and drafts."""
        self._fast = _fast.load()
        if self._fast is None:
            return
        ids = self.gguf.tensor_array(K.T_D2T).astype(np.int64) if K.T_D2T in self.gguf.tensors else None
        ascending = ids is not None and bool(np.all(np.diff(ids) > 0)) and int(ids[-1]) < self.n_vocab
        self._fast_ids = np.ascontiguousarray(ids, dtype=np.int32) if ascending else None
        self._fast_out_norm = np.ascontiguousarray(self._out_norm_w) if self.spec.norm_output else None
        self._fast_fc_norm = np.ascontiguousarray(self._fc_norm_w3.reshape(-1)) if self.spec.fc_norm else None
        self._fast_g = np.empty(self.n_embd, np.float32)
        self._fast_drafts = np.empty(64, np.int32)
        self._fast_rows = np.empty(0, np.int32)  # pending rows' tokens, g and fc_norm scratch (grown as needed)
        self._fast_feats: np.ndarray | None = None  # the _pend_buf that the session points into
        self._session = _fast.Session()  # the library's view of these buffers (see _session_buffers)
        self._session_addr = ctypes.addressof(self._session)
        self._fast_kmax = self._fast_nmax = 0  # the most drafts and pending rows the session's buffers hold

    @staticmethod
    def _ptr(a: np.ndarray | None) -> int | None:
        return None if a is None else a.ctypes.data

    # --- state ---------------------------------------------------------------------------

    def reset(self) -> None:
        self.memory.clear()
        self._clear_pending()
        # the decoder KV holds true rows (not chain rows) for positions 0.._kv_rows-1, computed from
        # _kv_tokens[:_kv_rows + 1] (row P consumes token P+1), or nothing reusable (-1)
        self._kv_rows = 0
        self._kv_tokens: Sequence[int] = ()

    def _clear_pending(self) -> None:
        # pending rows: their target features in _pend_buf[:_pend_rows] (grown as needed, reused)
        if getattr(self, "_pend_buf", None) is None:
            self._pend_buf = np.empty((64, 3 * self.spec.target_hidden_size), np.float32)
        self._pend_tokens: list[int] = []
        self._pend_pos0 = 0
        self._pend_rows = 0
        self._stale = False  # rows were dropped: the KV no longer continues into the pending rows

    def keep(self, tokens: Sequence[int], n_rows: int) -> int:
        # rows 0..n_rows-1 were computed from tokens 0..n_rows
        if not (0 < n_rows <= self._kv_rows and common_prefix(self._kv_tokens, tokens) > n_rows):
            self.reset()
            return 0
        self.memory.remove_from(n_rows)  # later rows and the last proposal's chain rows
        self._clear_pending()
        self._kv_rows = n_rows
        return n_rows

    def trim(self, keep: int) -> None:
        drop = self._pend_rows - max(1, keep)
        if drop <= 0:
            return
        self._pend_buf[: self._pend_rows - drop] = self._pend_buf[drop:self._pend_rows].copy()
        self._pend_tokens = self._pend_tokens[drop:]
        self._pend_pos0 += drop
        self._pend_rows -= drop
        self._stale = True

    def ingest(self, features: np.ndarray, pos0: int, tokens: Sequence[int]) -> None:
        if len(features) == 0:
            return
        if self._pend_rows and pos0 != self._pend_pos0 + self._pend_rows:
            raise RuntimeError(f"drafter rows must be contiguous: expected pos {self._pend_pos0 + self._pend_rows}, "
                               f"got {pos0}")
        if not self._pend_rows:
            self._pend_pos0 = pos0
        # the token at pos0 completes the previous pending row, if one waits for it
        self._pend_tokens.extend(int(t) for t in (tokens if self._pend_rows else tokens[1:]))
        end = self._pend_rows + len(features)
        self._pending_room(end)
        self._pend_buf[self._pend_rows:end] = features
        self._pend_rows = end

    def _pending_room(self, rows: int) -> None:
        """Grow the pending rows' buffer to hold at least `rows` rows, keeping the pending ones."""
        if rows > len(self._pend_buf):
            grown = np.empty((max(rows, 2 * len(self._pend_buf)), self._pend_buf.shape[1]), np.float32)
            grown[: self._pend_rows] = self._pend_buf[: self._pend_rows]
            self._pend_buf = grown

    # --- llama.cpp calls -----------------------------------------------------------------

    def _prepare_features(self, feats: np.ndarray) -> np.ndarray:
        if not self.spec.fc_norm:
            return np.ascontiguousarray(feats, dtype=np.float32)
        n, h = len(feats), self.spec.target_hidden_size  # the three layers' RMSNorms in one pass
        return rms_norm(feats.reshape(n, 3, h), self._fc_norm_w3, self._eps).reshape(n, 3 * h)

    def encode(self, feats: np.ndarray, pos0: int) -> np.ndarray:
        """fc (and norm_before_fc / fc_norm) of target features [n, 3H_t] -> g [n, H].

        The encoder ignores positions, but llama.cpp checks them against the KV memory:
        they must continue from its last position, so pass the rows' real positions."""
        if self._fast is not None:
            feats = np.ascontiguousarray(feats, dtype=np.float32)
            n, width = feats.shape
            out = np.empty((n, self.n_embd), np.float32)
            scratch = np.empty_like(feats) if self._fast_fc_norm is not None else None
            rc = self._fast.encode(self._fast.api_p, self.ctx, self._batch, feats.ctypes.data, n, width, pos0,
                                   self._ptr(self._fast_fc_norm), self._eps, self._ptr(scratch), self.n_batch,
                                   out.ctypes.data, self.n_embd)
            if rc != 0:
                raise EdgeEagleError(f"The drafter's encoder failed with code {rc}; check the drafter file.")
            return out
        feats = self._prepare_features(feats)
        n, width = feats.shape
        out = np.empty((n, self.n_embd), np.float32)
        for lo in range(0, n, self.n_batch):
            hi = min(n, lo + self.n_batch)
            C.llama_batch_ext_clear(self._batch)
            for i in range(lo, hi):
                row = feats[i]
                idx = C.llama_batch_ext_add_embd(self._batch, 0, C.llama_embd(
                    row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, width))
                self._pos.value = pos0 + i - lo  # every chunk continues from the same memory state
                C.llama_batch_ext_set_pos(self._batch, idx, ctypes.byref(self._pos))
                C.llama_batch_ext_set_output_logits(self._batch, idx, True)
            rc = C.llama_process(self.ctx, C.LLAMA_PROCESS_TYPE_ENCODE, self._batch)
            if rc != 0:
                raise EdgeEagleError(f"The drafter's encoder failed with code {rc}; check the drafter file.")
            out[lo:hi] = float_view(B.llama_get_embeddings_nextn(self.ctx), hi - lo, self.n_embd)
        return out

    def decode(self, tokens: Sequence[int], g: np.ndarray, pos0: int) -> tuple[np.ndarray, np.ndarray]:
        """Decoder rows (tokens[i], g[i]) at pos0+i; logits [n_vocab] and pre-norm h [H] of the last."""
        n = len(tokens)
        g = np.ascontiguousarray(g, dtype=np.float32)
        # The eagle3 decoder graph has no out_ids, so llama.cpp copies its FIRST n_outputs rows:
        # a short batch marks every row as output and reads the last; a long one (prefill) runs
        # all but the last row without outputs, then the last row alone.
        if n <= self._all_outputs_max:
            self._decode_rows(tokens, g, range(pos0, pos0 + n), outputs=True)
            last = n - 1
        else:
            for lo in range(0, n - 1, self.n_batch):
                hi = min(n - 1, lo + self.n_batch)
                self._decode_rows(tokens[lo:hi], g[lo:hi], range(pos0 + lo, pos0 + hi), outputs=False)
            self._decode_rows(tokens[n - 1:], g[n - 1:], [pos0 + n - 1], outputs=True)
            last = 0
        logits = float_view(C.llama_get_logits_ith(self.ctx, last), 1, self.n_vocab)[0]
        h = float_view(B.llama_get_embeddings_nextn_ith(self.ctx, last), 1, self.n_embd)[0]
        return logits, h.copy()

    _all_outputs_max = 16

    def _decode_rows(self, tokens: Sequence[int], g: np.ndarray, positions: Sequence[int], outputs: bool,
                     seqs: Sequence[int] | None = None) -> None:
        """One drafter batch: row i is (tokens[i], g[i]) at positions[i] in sequence seqs[i]
        (default 0)."""
        if self._fast is not None:
            toks = np.asarray(tokens, dtype=np.int32)
            pos = np.asarray(positions, dtype=np.int32)
            sq = None if seqs is None else np.asarray(seqs, dtype=np.int32)
            g = np.ascontiguousarray(g, dtype=np.float32)
            rc = self._fast.decode_rows(self._fast.api_p, self.ctx, self._batch, toks.ctypes.data, g.ctypes.data,
                                        pos.ctypes.data, self._ptr(sq), len(toks), self.n_embd, int(outputs))
        else:
            rc = self._decode_rows_py(tokens, g, positions, outputs, seqs)
        if rc != 0:
            raise EdgeEagleError(f"The drafter's decoder failed with code {rc}; the context may be full.")

    def _decode_rows_py(self, tokens: Sequence[int], g: np.ndarray, positions: Sequence[int], outputs: bool,
                        seqs: Sequence[int] | None) -> int:
        C.llama_batch_ext_clear(self._batch)
        for i, tok in enumerate(tokens):
            idx = C.llama_batch_ext_add_token(self._batch, 0 if seqs is None else seqs[i], int(tok))
            self._pos.value = positions[i]
            C.llama_batch_ext_set_pos(self._batch, idx, ctypes.byref(self._pos))
            C.llama_batch_ext_set_embd_token(self._batch, idx, C.llama_embd(
                g[i].ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, self.n_embd))
            if outputs:
                C.llama_batch_ext_set_output_logits(self._batch, idx, True)
        return C.llama_process(self.ctx, C.LLAMA_PROCESS_TYPE_DECODE, self._batch)

    def carry(self, h: np.ndarray) -> np.ndarray:
        """The state fed to the next chain step: h (EAGLE-3) or norm(h) (EAGLE-3.1 norm_output)."""
        if self.spec.norm_output:
            return rms_norm(h, self._out_norm_w, self._eps)
        return h

    # --- proposing -----------------------------------------------------------------------

    def propose(self, tokens: Sequence[int], k: int, p_min: float = 0.0, choose=None) -> Proposal:
        return self.propose_with_logits(tokens, k, p_min, choose, keep_logits=False)[0]

    def _take_pending(self, tokens: Sequence[int]) -> tuple[list[int], np.ndarray, int]:
        """The pending true rows, now that their tokens are all known: (tokens, features, pos0)
        of the rows to run, with the drafter's KV cut back to where they start."""
        pending, pos0, clear = self._claim_pending(tokens)
        if clear:
            self.memory.clear()
        else:
            self.memory.remove_from(pos0)  # drop chain rows of the last proposal
        # feats stays a view of _pend_buf until the next ingest
        return pending + [int(tokens[-1])], self._pend_buf[: len(pending) + 1], pos0

    def _claim_pending(self, tokens: Sequence[int]) -> tuple[list[int], int, bool]:
        """_take_pending's bookkeeping: (the pending rows' tokens but the last row's, which is
        tokens[-1]; their first position; whether the drafter's KV must be cleared rather than
        cut back to that position), the pending rows now taken."""
        if not self._pend_rows:
            raise RuntimeError("propose() needs ingested target features first")
        n_past = len(tokens) - 1
        if self._pend_pos0 + self._pend_rows != n_past:
            raise RuntimeError(f"drafter holds rows up to {self._pend_pos0 + self._pend_rows}, sequence is at {n_past}")
        pending, pos0, clear = self._pend_tokens, self._pend_pos0, self._stale
        if clear:  # llama.cpp accepts any start position on an empty KV, not a gap
            self._stale = False
            self._kv_rows = -1  # rows no longer start at position 0: nothing to reuse
        elif self._kv_rows != pos0:
            self._kv_rows = -1
        if self._kv_rows >= 0:
            self._kv_rows, self._kv_tokens = n_past, tokens  # the loop only appends to `tokens`
        self._pend_tokens, self._pend_rows = [], 0
        return pending, pos0, clear

    def _decode_pending(self, tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Run the pending true rows (their tokens now all known); the drafter's logits and
        pre-norm h at the last committed position, from which drafts start."""
        toks, feats, pos0 = self._take_pending(tokens)
        g = self.encode(feats, pos0)
        return self.decode(toks, g, pos0)

    def propose_with_logits(self, tokens: Sequence[int], k: int, p_min: float = 0.0,
                            choose=None, keep_logits: bool = True) -> tuple[Proposal, list[np.ndarray]]:
        """A chain of up to k drafts, with the drafter's logits at each step (keep_logits; else
        none are copied). choose(logits) -> (token, q or None) picks each draft (default
        greedy); sampled q's go into the Proposal."""
        if self._fast is not None and choose is None and not keep_logits and k > 0:
            return self._fast_propose(tokens, k, p_min), []
        logits, h = self._decode_pending(tokens)
        drafts: list[int] = []
        all_logits: list[np.ndarray] = []
        pos = len(tokens) - 2  # the row just decoded; chain rows follow it
        qs: list[np.ndarray] = []
        while k > 0:
            if p_min > 0.0:
                z = logits - logits.max()
                if 1.0 / np.exp(z[np.isfinite(z)]).sum() < p_min:
                    break
            d, q = (int(np.argmax(logits)), None) if choose is None else choose(logits)
            if q is not None:
                qs.append(q)
            drafts.append(d)
            if keep_logits:
                all_logits.append(logits.copy())
            if len(drafts) == k:
                break
            pos += 1
            logits, h = self.decode([d], self.carry(h)[None, :], pos)
        return Proposal.chain(drafts, qs if qs else None), all_logits

    def _fast_propose(self, tokens: Sequence[int], k: int, p_min: float) -> Proposal:
        """propose_with_logits' greedy chain in one native call: the pending rows' encoder and
        decoder batches, then the chain (the same drafts as the Python path)."""
        address = self._fast_ready(k)
        pending, pos0, clear = self._claim_pending(tokens)
        got = self._fast.propose(address, pending, tokens[-1], pos0, k, p_min, clear)
        if isinstance(got, int):
            raise EdgeEagleError(f"The drafter failed with code {got}; the context may be full.")
        return Proposal.chain(got, None)

    def fused_cycle(self, target: Target):
        """A function that runs whole greedy chain cycles natively (the library's `cycle`), or
        None when the fast path is off or the target captures through the eval callback. Called
        as cycle(tokens, k, p_min) once the target captures this drafter's layers, it drafts,
        verifies and ingests like propose(), Target.decode(), verify() and ingest() together,
        and answers (drafted, accepted tokens, bonus token, draft seconds, verify seconds, copy
        seconds); or None when this cycle cannot run natively (a tree left sequence ids in the
        target's batch, or k does not fit it)."""
        if self._fast is None or target.capture_path != "layer_inp" or len(self.target_layers) != 3:
            return None
        self._session.target = _fast.Target(target.ctx, ctypes.addressof(target._batch), target.memory._mem,
                                            target.n_vocab, target.n_embd, 3, (ctypes.c_uint32 * 3)(*self.target_layers))
        native, n_batch, address = self._fast.cycle, target.n_batch, self._session_addr

        def cycle(tokens: Sequence[int], k: int, p_min: float):
            if target._seq_rows or not 0 < k < n_batch:
                return None
            self._fast_ready(k)
            pending, pos0, clear = self._claim_pending(tokens)
            got = native(address, pending, tokens[-1], pos0, k, p_min, clear)
            target._epoch += 1
            if isinstance(got, int):
                raise EdgeEagleError(f"The speculative cycle failed with code {got}; the context may be full, "
                                     "start a new chat.")
            accepted = got[1]
            n_past = pos0 + len(pending) + 1
            target.memory.extend_at(n_past, [tokens[-1], *accepted])  # as Target.decode and remove_from leave it
            self._pend_tokens, self._pend_pos0, self._pend_rows = accepted, n_past, len(accepted) + 1
            return got

        return cycle

    def _fast_ready(self, k: int) -> int:
        """The session's address, its buffers fit for the pending rows and k drafts."""
        if self._fast_feats is not self._pend_buf or k > self._fast_kmax or self._pend_rows > self._fast_nmax:
            self._session_buffers(self._pend_rows, k)
        return self._session_addr

    def _session_buffers(self, n: int, k: int) -> None:
        """Point the session at buffers for n pending rows and k drafts (grown as needed; the
        pending rows' features are kept; a cycle writes the accepted rows' at rows 0..k), and at
        this drafter's constant inputs."""
        self._pending_room(k + 1)
        if k > len(self._fast_drafts):
            self._fast_drafts = np.empty(max(k, 2 * len(self._fast_drafts)), np.int32)
        n = max(n, k + 1)
        if n > len(self._fast_rows):
            self._fast_rows = np.empty(max(n, 2 * len(self._fast_rows)), np.int32)
            self._fast_gs = np.empty((len(self._fast_rows), self.n_embd), np.float32)
            self._fast_scratch = np.empty((len(self._fast_rows), self._pend_buf.shape[1]), np.float32)
        self._fast_feats = self._pend_buf  # ingest() may grow it into a new array: then this runs again
        ids, s = self._fast_ids, self._session
        for name, value in (
                ("api", ctypes.addressof(self._fast.api)), ("ctx", self.ctx), ("batch", self._batch),
                ("mem", self.memory._mem), ("feats", self._pend_buf.ctypes.data), ("feats_rows", len(self._pend_buf)),
                ("width", self._pend_buf.shape[1]), ("fc_norm_w", self._ptr(self._fast_fc_norm)), ("eps", self._eps),
                ("scratch", self._fast_scratch.ctypes.data), ("n_batch", self.n_batch),
                ("g", self._fast_gs.ctypes.data), ("tokens", self._fast_rows.ctypes.data),
                ("rows", len(self._fast_rows)), ("all_outputs_max", self._all_outputs_max), ("ids", self._ptr(ids)),
                ("n_ids", 0 if ids is None else len(ids)), ("n_vocab", self.n_vocab), ("n_embd", self.n_embd),
                ("out_norm_w", self._ptr(self._fast_out_norm)), ("gbuf", self._fast_g.ctypes.data),
                ("drafts", self._fast_drafts.ctypes.data), ("drafts_cap", len(self._fast_drafts))):
            setattr(s, name, value)
        # what the session's buffers hold: drafts (and accepted rows' features, rows 0..k), pending rows
        self._fast_kmax, self._fast_nmax = min(len(self._fast_drafts), len(self._pend_buf) - 1), len(self._fast_rows)

    # --- trees -----------------------------------------------------------------------------

    def propose_tree(self, tokens: Sequence[int], n_nodes: int, depth: int = TREE_DEPTH,
                     branch: int = TREE_BRANCH) -> Proposal:
        """A draft tree of at most n_nodes nodes, EAGLE-2's dynamic tree: depth by depth, the
        `branch` most probable frontier nodes (by cumulative draft log-probability) are
        expanded in one drafter batch, each into its `branch` most probable children; then
        the n_nodes best nodes overall are kept (an ancestor never scores below its
        descendants, so the kept set is a tree). Expansion stops early once no frontier node
        can enter the best n_nodes. Every expanded node is a row of the drafter's KV in its
        own sequence, sharing its ancestors' rows (EAGLE-3.1's norm(h) is fed per node), so
        each node's draft is what a chain along its path would draft. Nodes come in
        breadth-first order, siblings by descending score; drafts are deterministic (the
        verifier treats each as a point mass, which keeps sampling lossless)."""
        branch = min(branch, self.tree_branch_max)  # a tiny context holds fewer sequences
        if n_nodes < 1 or depth < 1 or branch < 1:
            raise ValueError("a tree needs n_nodes >= 1, depth >= 1, branch >= 1 and a context that holds trees")
        logits, h = self._decode_pending(tokens)
        pos = len(tokens) - 2  # the root row; depth-d nodes are decoded at pos + d
        node_tok: list[int] = []
        node_par: list[int] = []
        node_score: list[float] = []
        node_depth: list[int] = []
        # expanded nodes of the current depth: (node index or -1 for the root, its logits, h, seq)
        frontier: list[tuple[int, np.ndarray, np.ndarray, int]] = [(-1, logits, h, 0)]
        for d in range(1, depth + 1):
            new: list[int] = []
            for node, lg, _, _ in frontier:
                base = node_score[node] if node >= 0 else 0.0
                for t, lp in _top_logprobs(lg, min(branch, n_nodes)):
                    new.append(len(node_tok))
                    node_tok.append(t)
                    node_par.append(node)
                    node_score.append(base + lp)
                    node_depth.append(d)
            if d == depth:
                break
            scores = np.asarray(node_score)
            floor = -np.inf if len(scores) < n_nodes else float(np.partition(scores, -n_nodes)[-n_nodes])
            expand = sorted((i for i in new if node_score[i] > floor), key=lambda i: -node_score[i])[:branch]
            if not expand:
                break
            frontier = self._expand(expand, node_tok, node_par, frontier, pos + d)
        self._drop_tree_seqs()
        keep = sorted(range(len(node_tok)), key=lambda i: (-node_score[i], i))[:n_nodes]
        kept = set(keep)
        keep = [i for i in keep if node_par[i] < 0 or node_par[i] in kept]  # closure, against ties
        order = sorted(keep, key=lambda i: (node_depth[i], -node_score[i], i))
        index = {old: new for new, old in enumerate(order)}
        return Proposal(tuple(node_tok[i] for i in order),
                        tuple(index[node_par[i]] if node_par[i] >= 0 else -1 for i in order))

    def _expand(self, expand: list[int], node_tok: list[int], node_par: list[int],
                frontier: list[tuple[int, np.ndarray, np.ndarray, int]], pos: int
                ) -> list[tuple[int, np.ndarray, np.ndarray, int]]:
        """Decode the nodes `expand` (children of the frontier) in one drafter batch at `pos`,
        each in a sequence that holds its ancestors: a parent's sequence goes to its first
        expanded child, its other children get copies, unused ones are dropped."""
        parent_of = {node: (h, seq) for node, _, h, seq in frontier}
        seqs: list[int | None] = []
        claimed: set[int] = set()
        for i in expand:
            src = parent_of[node_par[i]][1]
            if src != 0 and src not in claimed:
                claimed.add(src)
                seqs.append(src)
            else:
                seqs.append(None)
        for _, seq in parent_of.values():
            if seq != 0 and seq not in claimed:
                self.memory.remove_seq(seq)
        free = [s for s in range(1, self.tree_branch_max + 1) if s not in claimed]
        for row, i in enumerate(expand):
            if seqs[row] is None:
                dst = free.pop(0)
                self.memory.copy_seq(parent_of[node_par[i]][1], dst)
                seqs[row] = dst
        g = np.stack([self.carry(parent_of[node_par[i]][0]) for i in expand]).astype(np.float32)
        self._decode_rows([node_tok[i] for i in expand], g, [pos] * len(expand), outputs=True, seqs=seqs)
        out = []
        for row, (i, seq) in enumerate(zip(expand, seqs)):
            lg = float_view(C.llama_get_logits_ith(self.ctx, row), 1, self.n_vocab)[0].copy()
            h = float_view(B.llama_get_embeddings_nextn_ith(self.ctx, row), 1, self.n_embd)[0].copy()
            out.append((i, lg, h, seq))
        return out

    def _drop_tree_seqs(self) -> None:
        for s in range(1, self.tree_branch_max + 1):
            self.memory.remove_seq(s)

    def close(self) -> None:
        if getattr(self, "ctx", None):
            C.llama_batch_ext_free(self._batch)
            free_context(self.ctx)
            self.ctx = None
        if getattr(self, "model", None):
            free_model(self.model)
            self.model = None

    def __del__(self) -> None:  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass
