"""The target model: a llama.cpp context that decodes batches (a chain, several independent
sequences, or a token tree in one batch) and captures the inputs of the drafter's three target
layers for every token of each decode (capture.py)."""

from __future__ import annotations

import codecs
import ctypes
import os
from typing import Any, Sequence

import numpy as np
from llama_cpp import llama_cpp as C

from . import gguf_keys as K
from ._llama import float_view, free_context, free_model, load_model, n_threads_default, new_context
from .capture import FeatureCapture
from .errors import EdgeEagleError, ModelFileError
from .gguf_file import GGUFFile, check_hparams, read_gguf
from .kv import Memory, move_cells, seq_state
from .proposal import Proposal
from .system import FlashAttnDecision, flash_attn_for

MAX_TREE_PATHS = 63  # llama.cpp's LLAMA_MAX_SEQ is 256; a tree verify rarely has more leaves than 16


class DecodeResult:
    """logits: [n_rows_with_logits, n_vocab], a view valid until the next decode.
    features: [n_tokens, 3 * n_embd] captured layer inputs (or None), built on first access
    from the three layers' buffers; feature_rows(rows) builds only those rows (the cycle
    needs the accepted ones only). Both must be read before the target's next decode, which
    reuses the buffers: reading later raises instead of returning another decode's rows."""

    __slots__ = ("logits", "_features", "_parts", "_epoch", "_owner")

    def __init__(self, logits: np.ndarray, features: np.ndarray | None = None,
                 parts: list[np.ndarray] | None = None, owner: "Target | None" = None):
        self.logits, self._features, self._parts = logits, features, parts
        self._owner = owner
        self._epoch = owner._epoch if owner is not None else 0

    def _check(self) -> None:
        if self._owner is not None and self._owner._epoch != self._epoch:
            raise RuntimeError("these features were overwritten by a later decode; read them before decoding again")

    @property
    def features(self) -> np.ndarray | None:
        if self._features is None and self._parts is not None:
            self._check()
            self._features = np.concatenate(self._parts, axis=1)
            self._parts = None
        return self._features

    def require_features(self) -> np.ndarray:
        """features, or RuntimeError when this decode captured none (a bug in the caller)."""
        features = self.features
        if features is None:
            raise RuntimeError("this decode captured no features; set_capture() the drafter's layers first")
        return features

    def feature_rows(self, rows: slice | list[int]) -> np.ndarray:
        if self._features is not None:
            return self._features[rows]
        if self._parts is None:
            raise RuntimeError("this decode captured no features; set_capture() the drafter's layers first")
        self._check()
        return np.concatenate([p[rows] for p in self._parts], axis=1)


class Target:
    """A target GGUF loaded in llama.cpp. decode()/prefill() run sequence 0; decode_seqs() runs
    several independent sequences in one batch (n_seq > 1: one KV stream per sequence, each of
    n_ctx tokens); decode_tree() verifies a token tree in one batch (tree_paths > 0: one unified
    KV stream, sequence 0 plus one sequence per root-to-leaf path)."""

    def __init__(self, path: str | os.PathLike[str], *, n_ctx: int = 4096, n_batch: int = 512,
                 n_threads: int | None = None, n_gpu_layers: int = 0, capture: str = "auto",
                 gguf: GGUFFile | None = None, repack: str | None = None, n_seq: int = 1,
                 tree_paths: int = 0, flash_attn: str | None = None):
        self.path = os.fspath(path)
        self.gguf = gguf or read_gguf(self.path)
        if self.gguf.arch == K.EAGLE3:
            raise ModelFileError(f"{os.path.basename(self.path)} is an EAGLE-3 drafter, not a target; "
                                 "pass it with --drafter and give a target model with --target.")
        check_hparams(self.gguf)  # llama.cpp aborts on some impossible values; refuse them first
        if capture not in ("auto", "layer_inp", "callback"):
            raise EdgeEagleError(f"Unknown capture path '{capture}'; use auto, layer_inp or callback.")
        self.capture_path = capture
        if capture == "auto":
            self.capture_path = "layer_inp" if self.gguf.arch in K.LAYER_INPUT_ARCHS else "callback"
        self.n_layer = int(self.gguf.require(K.BLOCK_COUNT))
        self.n_embd = int(self.gguf.require(K.EMBEDDING_LENGTH))
        train_ctx = int(self.gguf.get(K.CONTEXT_LENGTH, n_ctx) or n_ctx)
        self.n_ctx = min(n_ctx, train_ctx) if n_ctx > 0 else train_ctx
        self.n_batch = n_batch
        self.capture = FeatureCapture(self.capture_path, self.n_layer, self.n_embd)
        self._epoch = 0  # counts decodes: a DecodeResult's feature views hold until the next one
        threads = n_threads or n_threads_default()
        self.n_threads, self.n_gpu_layers = threads, n_gpu_layers
        #: flash attention for this context and the drafter's (system.decide_flash_attn)
        self.flash_attn = flash_attn_for(n_gpu_layers, flash_attn)

        loaded = load_model(self.path, n_gpu_layers, self.n_layer, repack)
        self.model, self.repack, self.buffers = loaded.handle, loaded.repack, loaded.buffers
        self.vocab = C.llama_model_get_vocab(self.model)
        self.n_vocab = int(C.llama_vocab_n_tokens(self.vocab))
        if n_seq > 1 and tree_paths:
            raise ValueError("a target runs independent sequences or trees, not both")
        self.n_seq = n_seq
        # a tree verify batch holds at least one row per path; llama.cpp asserts (aborts) when a
        # context has more sequences than its batch can hold rows (a model with a tiny context)
        self.tree_paths = max(0, min(int(tree_paths), MAX_TREE_PATHS, min(n_batch, self.n_ctx) - 1))
        seq_max = n_seq if n_seq > 1 else 1 + self.tree_paths
        self._ctx_fields: dict[str, Any] = dict(n_ctx=self.n_ctx * n_seq, n_batch=n_batch, n_ubatch=n_batch,
                                                no_perf=True, n_seq_max=seq_max, kv_unified=self.tree_paths > 0)
        if self.capture.callback is not None:
            self._ctx_fields["cb_eval"] = self.capture.callback
        self.ctx = None
        self._make_context()
        self._batch = C.llama_batch_init(n_batch, 0, 1 + self.tree_paths)
        self._tok = np.ctypeslib.as_array(self._batch.token, shape=(n_batch,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(n_batch,))
        self._out = np.ctypeslib.as_array(ctypes.cast(self._batch.logits, ctypes.POINTER(ctypes.c_int8)),
                                          shape=(n_batch,))
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(n_batch,))[:] = 1
        self._n_seq_id = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(n_batch,))
        self._seq_rows = 0  # rows of the batch whose seq_id decode_seqs() or decode_tree() changed from 0
        for i in range(n_batch):
            self._batch.seq_id[i][0] = 0
        self.eos = int(C.llama_vocab_eos(self.vocab))
        self.chat_template: str | None = self.gguf.get(K.CHAT_TEMPLATE)

    def _make_context(self) -> None:
        """(Re)make the llama.cpp context with the current threads and flash attention; its KV
        cache starts empty (self.memory is new)."""
        self.ctx = new_context(self.model, os.path.basename(self.path), n_threads=self.n_threads,
                               n_threads_batch=self.n_threads, flash_attn_type=self.flash_attn.llama_type,
                               **self._ctx_fields)
        self.capture.attach(self.ctx)
        self.memory = Memory(self.ctx)
        self._epoch += 1

    def set_flash_attn(self, decision: FlashAttnDecision) -> bool:
        """Compute attention as `decision` says from now on: llama.cpp fixes the setting when it
        makes a context (without flash attention it stores V transposed), so a new setting makes
        the context again. Sequence 0's KV cells move into it, V laid out anew (kv.relayout_v),
        so the prompt cache stays; where they cannot move, the cache starts empty. A drafter bound
        to this context must then be bound again (Drafter.rebind). Returns whether the context
        was made again."""
        if decision.setting == self.flash_attn.setting:
            self.flash_attn = decision
            return False
        self.flash_attn = decision
        tokens = list(self.memory.tokens)
        state = seq_state(self.ctx) if tokens else bytearray()
        old, self.ctx = self.ctx, None
        free_context(old)  # before the new one: the old cells live on in `state` alone
        self._make_context()
        if state and move_cells(state, self.ctx, v_trans=decision.setting == "off"):
            self.memory.tokens = tokens  # else the new context's memory stays empty
        return True

    # --- for native code that decodes this target's batch itself (the drafter's fast cycle) ---

    @property
    def batch_address(self) -> int:
        """The address of this target's llama_batch (n_batch rows), for native code that fills it."""
        return ctypes.addressof(self._batch)

    @property
    def batch_is_plain(self) -> bool:
        """Whether every row of the batch is in sequence 0 alone, as a chain verify needs (a tree
        verify or decode_seqs() leaves other sequence ids behind until the next decode())."""
        return not self._seq_rows

    def outputs_replaced(self) -> None:
        """A decode made outside this object replaced llama.cpp's output buffers: DecodeResults
        read before it must not be read any more (they raise instead)."""
        self._epoch += 1

    # --- capture -----------------------------------------------------------------------

    @property
    def capture_layers(self) -> tuple[int, ...]:
        return self.capture.layers

    def set_capture(self, layer_ids: Sequence[int]) -> None:
        """Capture the inputs of these layers on every later decode (empty: capture nothing)."""
        self.capture.set(layer_ids)

    # --- decoding ----------------------------------------------------------------------

    def decode(self, tokens: Sequence[int], pos0: int, logits: str = "last", seq: int = 0) -> DecodeResult:
        """Decode tokens at positions pos0.. of sequence `seq` in one batch (n <= n_batch).

        logits: "last" for the last row only, "all" for every row.
        """
        n = len(tokens)
        if not 0 < n <= self.n_batch:
            raise ValueError(f"decode takes 1..{self.n_batch} tokens, got {n}")
        if pos0 + n > self.n_ctx:
            raise EdgeEagleError(f"The context window ({self.n_ctx} tokens) is full; start a new chat or "
                                 "raise n_ctx.")
        if seq or self._seq_rows:
            if not 0 <= seq < self.n_seq:
                raise ValueError(f"sequence {seq} outside 0..{self.n_seq - 1}")
            for i in range(max(n, self._seq_rows)):
                self._batch.seq_id[i][0] = seq if i < n else 0
            self._n_seq_id[: self._seq_rows] = 1
            self._seq_rows = n if seq else 0
        self._tok[:n] = tokens
        self._pos[:n] = np.arange(pos0, pos0 + n, dtype=np.int32)
        self._out[:n] = 1 if logits == "all" else 0
        self._out[n - 1] = 1
        res = self._run(n, n if logits == "all" else 1)
        if seq == 0:
            self.memory.extend_at(pos0, tokens)
        return res

    def _run(self, n: int, n_out: int) -> DecodeResult:
        self._batch.n_tokens = n
        self._epoch += 1
        rc = C.llama_decode(self.ctx, self._batch)
        if rc != 0:
            raise EdgeEagleError(f"llama_decode failed with code {rc}; the context may be full, start a new chat.")
        rows = float_view(C.llama_get_logits(self.ctx), n_out, self.n_vocab)
        return DecodeResult(rows, parts=self.capture.parts(n), owner=self)

    def decode_seqs(self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[int]) -> DecodeResult:
        """One token for each of several sequences in one batch, logits for every row.

        seqs must be strictly increasing: llama.cpp splits a multi-stream batch into
        micro-batches of consecutive sequence ids and writes captured layer inputs in
        micro-batch order, which equals batch order only then."""
        n = len(tokens)
        if not 0 < n <= min(self.n_batch, self.n_seq) or len(positions) != n or len(seqs) != n:
            raise ValueError(f"decode_seqs takes 1..{min(self.n_batch, self.n_seq)} rows with a position and a "
                             "sequence each")
        if any(b <= a for a, b in zip(seqs, seqs[1:])) or seqs[0] < 0 or seqs[-1] >= self.n_seq:
            raise ValueError(f"decode_seqs needs increasing sequence ids in 0..{self.n_seq - 1}, got {list(seqs)}")
        if max(positions) >= self.n_ctx:
            raise EdgeEagleError(f"The context window ({self.n_ctx} tokens) is full; raise n_ctx.")
        self._tok[:n] = tokens
        self._pos[:n] = positions
        self._out[:n] = 1
        for i, s in enumerate(seqs):
            self._batch.seq_id[i][0] = int(s)
        self._n_seq_id[:n] = 1
        self._seq_rows = max(self._seq_rows, n)
        if seqs[0] == 0:
            self.memory.tokens.clear()  # sequence 0 took part: no longer known token by token
        return self._run(n, n)

    def decode_tree(self, root: int, tokens: Sequence[int], parents: Sequence[int], pos0: int) -> DecodeResult:
        """Verify a token tree in one batch: row 0 is the last committed token `root` at pos0,
        row i + 1 is node i (parent parents[i], -1: the root) at pos0 + its depth. Each
        root-to-leaf path is a sequence (1..leaves) that shares sequence 0's history, and each
        row carries the set of paths through it, so every row attends to exactly its ancestors.
        Logits and features for every row; keep_path() then commits one path to sequence 0."""
        n = len(tokens) + 1
        if n > self.n_batch:
            raise ValueError(f"a tree of {n - 1} nodes does not fit a batch of {self.n_batch}")
        is_parent = [False] * len(tokens)
        for p in parents:
            if p >= 0:
                is_parent[p] = True
        leaves = [i for i, flag in enumerate(is_parent) if not flag]
        if not leaves or len(leaves) > self.tree_paths:
            raise ValueError(f"a tree needs 1..{self.tree_paths} leaves (tree_paths), got {len(leaves)}")
        depth = Proposal(tuple(tokens), tuple(parents)).depths  # checks parents come before children
        paths: list[list[int]] = [[] for _ in tokens]  # the path sequences through each node
        for j, leaf in enumerate(leaves, start=1):
            i = leaf
            while i >= 0:
                paths[i].append(j)
                i = parents[i]
        if pos0 + max(depth) >= self.n_ctx:
            raise EdgeEagleError(f"The context window ({self.n_ctx} tokens) is full; start a new chat or raise n_ctx.")
        for j in range(1, len(leaves) + 1):
            self.memory.copy_seq(0, j)
        rows = [(int(root), pos0, list(range(1, len(leaves) + 1)))]
        rows += [(int(t), pos0 + d, sorted(s)) for t, d, s in zip(tokens, depth, paths)]
        for i, (tok, pos, seqs) in enumerate(rows):
            self._tok[i], self._pos[i], self._n_seq_id[i] = tok, pos, len(seqs)
            for j, s in enumerate(seqs):
                self._batch.seq_id[i][j] = s
        self._out[:n] = 1
        self._seq_rows = max(self._seq_rows, n)
        self._node_paths, self._n_paths = paths, len(leaves)  # for keep_path()
        return self._run(n, n)

    def keep_path(self, path: Sequence[int], pos0: int, root: int, tokens: Sequence[int]) -> None:
        """After decode_tree(): sequence 0 takes the root and the nodes of `path` (node indices,
        root to descendant, as accepted) at pos0..; every path sequence is dropped, and with
        it the rejected nodes. tokens: the tree's node tokens."""
        # a path sequence through the deepest accepted node holds the whole path (the root is on all)
        seq = self._node_paths[path[-1]][0] if path else 1
        self.memory.copy_seq(seq, 0, pos0, pos0 + len(path) + 1)
        for j in range(1, self._n_paths + 1):
            self.memory.remove_seq(j)
        self.memory.extend_at(pos0, [int(root), *(int(tokens[i]) for i in path)])

    def prefill(self, tokens: Sequence[int], pos0: int = 0, seq: int = 0) -> DecodeResult:
        """Decode a long prompt in n_batch chunks; logits of the last token, features of all."""
        feats = []
        res = None
        for i in range(0, len(tokens), self.n_batch):
            res = self.decode(tokens[i:i + self.n_batch], pos0 + i, "last", seq)
            if res.features is not None:
                feats.append(res.features)  # a new array: the concatenation of the layers
        assert res is not None
        return DecodeResult(res.logits, np.concatenate(feats) if feats else None)

    # --- text --------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate (a "\udc80" escape in JSON) is no text
            raise EdgeEagleError(f"The text has an invalid character ({text[exc.start]!r} at position {exc.start}: "
                                 "a lone UTF-16 surrogate); send valid Unicode text.") from None
        cap = len(data) + 16
        buf = (C.llama_token * cap)()
        n = C.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (C.llama_token * cap)()
            n = C.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = C.llama_token_to_piece(self.vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int]) -> str:
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return "".join(dec.decode(self.token_bytes(t)) for t in tokens) + dec.decode(b"", final=True)

    def set_threads(self, n: int) -> None:
        """Decode with n CPU threads from the next call on (the thread policy's governor)."""
        C.llama_set_n_threads(self.ctx, n, n)
        self.n_threads = n

    def is_eog(self, token: int) -> bool:
        return bool(C.llama_vocab_is_eog(self.vocab, token))

    def close(self) -> None:
        if getattr(self, "ctx", None):
            C.llama_batch_free(self._batch)
            free_context(self.ctx)
            self.ctx = None
        if getattr(self, "model", None):
            free_model(self.model)
            self.model = None

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass
