"""The drafter's batches, greedy chains and whole greedy cycles in C (edge_eagle/_fastpath.c,
loaded by edge_eagle/_fast.py): the same batches and the same drafts as batches.Batches and
the Python chain, for less host time per cycle.

The drafter's buffers are described to the library once, in a Session (refreshed when a buffer
grows); each call then passes the session's address and a few ints.
"""

from __future__ import annotations

import ctypes
from time import perf_counter
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .. import _fast
from ..cycle import CycleResult, NativeCycle, StepCycle, new_result
from ..errors import LlamaCallError
from ..policy import CHAIN, PLAIN, Plan
from .batches import ALL_OUTPUTS_MAX, Batches
from .norms import Norms
from .pending import PendingRows

if TYPE_CHECKING:
    from ..target import Target


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


class NativeBatches(Batches):
    """Batches through the native library, plus its greedy chain (propose) and cycle."""

    def __init__(self, lib: _fast.FastPath, ctx: Any, memory_handle: Any, norms: Norms, n_embd: int, n_vocab: int,
                 n_batch: int, ids: np.ndarray | None):
        super().__init__(ctx, norms, n_embd, n_vocab, n_batch)
        self.lib, self.memory_handle = lib, memory_handle
        # the draft vocabulary in ascending target ids (its logits are -inf elsewhere; None: scan all)
        self.ids = None if ids is None else np.ascontiguousarray(ids, dtype=np.int32)
        self.out_norm = None if norms.out_norm_w is None else np.ascontiguousarray(norms.out_norm_w)
        self.fc_norm = None if norms.fc_norm_w is None else np.ascontiguousarray(norms.fc_norm_w.reshape(-1))
        self.gbuf = np.empty(n_embd, np.float32)
        self.drafts = np.empty(64, np.int32)
        self.rows = np.empty(0, np.int32)  # pending rows' tokens, g and fc_norm scratch (grown as needed)
        self.gs = np.empty((0, n_embd), np.float32)
        self.scratch = np.empty((0, 0), np.float32)
        self.feats: np.ndarray | None = None  # the pending buffer that the session points into
        self.session = _fast.Session()
        self.address = ctypes.addressof(self.session)
        self.kmax = self.nmax = 0  # the most drafts and pending rows the session's buffers hold

    @classmethod
    def load(cls, ctx: Any, memory_handle: Any, norms: Norms, n_embd: int, n_vocab: int, n_batch: int,
             ids: np.ndarray | None) -> "NativeBatches | None":
        """The native batches, or None when the fast path is off or not built. ids: the draft
        vocabulary (spec.draft_ids)."""
        lib = _fast.load()
        if lib is None:
            return None
        return cls(lib, ctx, memory_handle, norms, n_embd, n_vocab, n_batch, ids)

    def encode(self, feats: np.ndarray, pos0: int) -> np.ndarray:
        feats = np.ascontiguousarray(feats, dtype=np.float32)
        n, width = feats.shape
        out = np.empty((n, self.n_embd), np.float32)
        scratch = np.empty_like(feats) if self.fc_norm is not None else None
        rc = self.lib.encode(self.lib.api_p, self.ctx, self.batch, feats.ctypes.data, n, width, pos0,
                             _ptr(self.fc_norm), self.norms.eps, _ptr(scratch), self.n_batch, out.ctypes.data,
                             self.n_embd)
        if rc != 0:
            raise LlamaCallError("drafter encoder", rc)
        return out

    def decode_rows(self, tokens: Sequence[int], g: np.ndarray, positions: Sequence[int], outputs: bool,
                    seqs: Sequence[int] | None = None) -> None:
        toks = np.asarray(tokens, dtype=np.int32)
        pos = np.asarray(positions, dtype=np.int32)
        sq = None if seqs is None else np.asarray(seqs, dtype=np.int32)
        g = np.ascontiguousarray(g, dtype=np.float32)
        rc = self.lib.decode_rows(self.lib.api_p, self.ctx, self.batch, toks.ctypes.data, g.ctypes.data,
                                  pos.ctypes.data, _ptr(sq), len(toks), self.n_embd, int(outputs))
        if rc != 0:
            raise LlamaCallError("drafter decode", rc)

    # --- whole chains and cycles ---------------------------------------------------------

    def propose(self, pending: PendingRows, tokens: Sequence[int], k: int, p_min: float) -> list[int]:
        """The pending rows' encoder and decoder batches, then a greedy chain of up to k drafts
        (what the Python chain drafts), in one call."""
        address = self.ready(pending, k)
        waiting, pos0, clear = pending.claim(tokens)
        got = self.lib.propose(address, waiting, tokens[-1], pos0, k, p_min, clear)
        if isinstance(got, int):
            raise _fast.call_error(got)
        return got

    def ready(self, pending: PendingRows, k: int) -> int:
        """The session's address, its buffers fit for the pending rows and k drafts."""
        if self.feats is not pending.buf or k > self.kmax or pending.rows > self.nmax:
            self._point_session(pending, pending.rows, k)
        return self.address

    def _point_session(self, pending: PendingRows, n: int, k: int) -> None:
        """Point the session at buffers for n pending rows and k drafts (grown as needed; the
        pending rows' features are kept; a cycle writes the accepted rows' at rows 0..k), and at
        this drafter's constant inputs."""
        pending.room(k + 1)
        if k > len(self.drafts):
            self.drafts = np.empty(max(k, 2 * len(self.drafts)), np.int32)
        n = max(n, k + 1)
        if n > len(self.rows):
            self.rows = np.empty(max(n, 2 * len(self.rows)), np.int32)
            self.gs = np.empty((len(self.rows), self.n_embd), np.float32)
            self.scratch = np.empty((len(self.rows), pending.buf.shape[1]), np.float32)
        self.feats = pending.buf  # ingest may grow it into a new array: then this runs again
        s = self.session
        for name, value in (
                ("api", ctypes.addressof(self.lib.api)), ("ctx", self.ctx), ("batch", self.batch),
                ("mem", self.memory_handle), ("feats", pending.buf.ctypes.data), ("feats_rows", len(pending.buf)),
                ("width", pending.buf.shape[1]), ("fc_norm_w", _ptr(self.fc_norm)), ("eps", self.norms.eps),
                ("scratch", self.scratch.ctypes.data), ("n_batch", self.n_batch),
                ("g", self.gs.ctypes.data), ("tokens", self.rows.ctypes.data),
                ("rows", len(self.rows)), ("all_outputs_max", ALL_OUTPUTS_MAX), ("ids", _ptr(self.ids)),
                ("n_ids", 0 if self.ids is None else len(self.ids)), ("n_vocab", self.n_vocab),
                ("n_embd", self.n_embd), ("out_norm_w", _ptr(self.out_norm)), ("gbuf", self.gbuf.ctypes.data),
                ("drafts", self.drafts.ctypes.data), ("drafts_cap", len(self.drafts))):
            setattr(s, name, value)
        # what the session's buffers hold: drafts (and accepted rows' features, rows 0..k), pending rows
        self.kmax, self.nmax = min(len(self.drafts), len(pending.buf) - 1), len(self.rows)

    def fused_cycle(self, steps: StepCycle, target: "Target", pending: PendingRows,
                    target_layers: Sequence[int]) -> "FusedCycle":
        self.session.target = _fast.Target(target.ctx, target.batch_address, target.memory.handle, target.n_vocab,
                                           target.n_embd, 3, (ctypes.c_uint32 * 3)(*target_layers))
        return FusedCycle(steps, self, target, pending)


class FusedCycle(NativeCycle):
    """A whole greedy chain cycle in one native call: the drafter's pending rows and chain, the
    target's verify batch, greedy verification, the target's KV cut and the accepted rows'
    features, which wait as the drafter's next pending rows. The same tokens, counts and state
    as propose(), Target.decode(), verify() and ingest() one after another (StepCycle)."""

    def __init__(self, steps: StepCycle, batches: NativeBatches, target: "Target", pending: PendingRows):
        super().__init__(steps)
        self.batches, self.target, self.pending = batches, target, pending
        self.native, self.n_batch = batches.lib.cycle, target.n_batch

    def run(self, plan: Plan, seq: Sequence[int], n_past: int, room: int, capturing: bool,
            trim_to: int | None) -> CycleResult:
        target, pending, batches = self.target, self.pending, self.batches
        k = plan.n if plan.n < room else room
        # a tree verify leaves sequence ids in the target's batch that a chain verify must not inherit
        if not (capturing and plan.kind == CHAIN and 0 < k < self.n_batch and target.batch_is_plain):
            return self.steps.run(plan, seq, n_past, room, capturing, trim_to)
        t0 = perf_counter()
        # every statement here runs right after llama.cpp's kernels evicted the caches: as few as may be
        if batches.feats is not pending.buf or k > batches.kmax or pending.rows > batches.nmax:
            batches.ready(pending, k)
        waiting, pos0, clear = pending.claim(seq)
        got = self.native(batches.address, waiting, seq[-1], pos0, k, self.p_min, clear)
        target.outputs_replaced()
        if isinstance(got, int):
            raise _fast.call_error(got)
        drafted, accepted, bonus, draft_s, verify_s, _ = got
        n_past = pos0 + len(waiting) + 1
        target.memory.extend_at(n_past, [seq[-1], *accepted])  # as Target.decode and remove_from leave it
        # the accepted rows wait for their next tokens
        pending.tokens, pending.pos0, pending.rows = accepted, n_past, len(accepted) + 1
        return new_result((CHAIN if drafted else PLAIN, drafted, accepted, bonus, drafted, [], draft_s, verify_s,
                           perf_counter() - t0 - draft_s - verify_s, 0.0))
