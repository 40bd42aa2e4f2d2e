"""The EAGLE-3 / EAGLE-3.1 drafter, run by llama.cpp with EAGLE-3.1 finished on the host.

llama.cpp runs the encoder (fc, plus norm_before_fc) and the one-layer decoder; the host runs
EAGLE-3.1's two norms (norms.py). The drafter is composed of one part per job:
- spec.py: what the GGUF says and whether it fits the target;
- pending.py: the target rows waiting for their next token, and what the KV holds;
- batches.py / native.py: llama.cpp batches through ctypes, or the native fast path (chosen once);
- the chain (here) and trees (tree.py).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
from llama_cpp import llama_cpp as C

from .. import _bindings as B
from .._llama import free_context, free_model, load_model, n_threads_default, new_context
from ..drafter import Drafter
from ..gguf_file import GGUFFile, check_hparams, read_gguf
from ..kv import Memory, move_cells, seq_state
from ..policy import TREE_DEPTH
from ..proposal import Proposal
from .batches import Batches
from .native import FusedCycle, NativeBatches
from .norms import Norms
from .pending import PendingRows
from .spec import check_pair, draft_ids
from .tree import TREE_BRANCH, TREE_BRANCH_MAX, TREE_CHILDREN, TreeDrafter

if TYPE_CHECKING:
    from ..cycle import StepCycle
    from ..target import Target

Choose = Callable[[np.ndarray], "tuple[int, np.ndarray | None]"]


class EagleDrafter(Drafter):
    """An eagle3 GGUF in a second llama.cpp context that borrows from the target's."""

    needs_features = True

    def __init__(self, path: str | os.PathLike[str], target: "Target", *, n_gpu_layers: int = 0,
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
        self.norms = Norms(self.gguf, self.spec)
        threads = n_threads or n_threads_default()
        loaded = load_model(self.path, n_gpu_layers, 1, repack)
        self.model, self.repack, self.buffers = loaded.handle, loaded.repack, loaded.buffers
        # one sequence per expanded node of a depth; none when the target cannot verify trees
        self.tree_branch_max = min(TREE_BRANCH_MAX, min(self.n_batch, target.n_ctx) - 1) if target.tree_paths else 0
        self.supports_trees = self.tree_branch_max > 0
        self.n_threads = threads
        self.draft_ids = draft_ids(self.gguf, self.n_vocab)  # where its logits can be finite
        self.pending = PendingRows(3 * self.spec.target_hidden_size)
        self.ctx = None
        self._make_context(target)

    def _make_context(self, target: "Target", reset: bool = True) -> None:
        """The drafter's llama.cpp context, bound to the target's (ctx_other) and computing
        attention as it does, and what works on it; the drafter starts afresh (reset)."""
        self.ctx = new_context(self.model, os.path.basename(self.path), n_ctx=target.n_ctx,
                               n_batch=self.n_batch, n_ubatch=self.n_batch, n_threads=self.n_threads,
                               n_threads_batch=self.n_threads, no_perf=True, ctx_other=target.ctx,
                               n_seq_max=1 + self.tree_branch_max, kv_unified=self.supports_trees,
                               flash_attn_type=target.flash_attn.llama_type)
        B.llama_set_embeddings_nextn(self.ctx, True, True)
        self.memory = Memory(self.ctx)
        self.native = NativeBatches.load(self.ctx, self.memory.handle, self.norms, self.n_embd, self.n_vocab,
                                         self.n_batch, self.draft_ids)
        self.batches: Batches = self.native or Batches(self.ctx, self.norms, self.n_embd, self.n_vocab, self.n_batch)
        self.trees = TreeDrafter(self.memory, self.batches, self.norms.carry, self.tree_branch_max, self.draft_ids)
        if reset:
            self.reset()

    def rebind(self, target: "Target") -> None:
        """The target made its context again (Target.set_flash_attn): make this drafter's again,
        bound to the new one and computing attention as it does. Its KV cells move across, V laid
        out anew (kv.relayout_v), and its rows waiting for tokens stay, so it goes on where it
        was; where the cells cannot move it starts afresh, as after reset()."""
        state = seq_state(self.ctx)
        self._free_context()
        self._make_context(target, reset=False)
        if not move_cells(state, self.ctx, v_trans=target.flash_attn.setting == "off"):
            self.reset()

    # --- state ---------------------------------------------------------------------------

    def reset(self) -> None:
        self.memory.clear()
        self.pending.reset()

    def keep(self, tokens: Sequence[int], n_rows: int) -> int:
        if not self.pending.keep(tokens, n_rows):
            self.reset()
            return 0
        self.memory.remove_from(n_rows)  # later rows and the last proposal's chain rows
        return n_rows

    def trim(self, keep: int) -> None:
        self.pending.trim(keep)

    def ingest(self, features: np.ndarray, pos0: int, tokens: Sequence[int]) -> None:
        self.pending.ingest(features, pos0, tokens)

    # --- llama.cpp batches (tests and tools call these directly) -------------------------

    def encode(self, feats: np.ndarray, pos0: int) -> np.ndarray:
        """fc (and its norms) of target features [n, 3H_t] at positions pos0.. -> g [n, H]."""
        return self.batches.encode(feats, pos0)

    def decode(self, tokens: Sequence[int], g: np.ndarray, pos0: int) -> tuple[np.ndarray, np.ndarray]:
        """Decoder rows (tokens[i], g[i]) at pos0+i; logits [n_vocab] and pre-norm h [H] of the last."""
        return self.batches.decode(tokens, g, pos0)

    def carry(self, h: np.ndarray) -> np.ndarray:
        """The state fed to the next chain step: h (EAGLE-3) or norm(h) (EAGLE-3.1 norm_output)."""
        return self.norms.carry(h)

    # --- proposing -----------------------------------------------------------------------

    def _decode_pending(self, tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Run the pending true rows (their tokens now all known), the drafter's KV first cut back
        to where they start; the logits and pre-norm h at the last committed position, from
        which drafts start."""
        waiting, pos0, clear = self.pending.claim(tokens)
        if clear:
            self.memory.clear()
        else:
            self.memory.remove_from(pos0)  # drop chain rows of the last proposal
        feats = self.pending.buf[: len(waiting) + 1]  # a view, read before the next ingest
        g = self.encode(feats, pos0)
        return self.decode(waiting + [int(tokens[-1])], g, pos0)

    def propose(self, tokens: Sequence[int], k: int, p_min: float = 0.0, choose: Choose | None = None) -> Proposal:
        return self.propose_with_logits(tokens, k, p_min, choose, keep_logits=False)[0]

    def propose_with_logits(self, tokens: Sequence[int], k: int, p_min: float = 0.0, choose: Choose | None = None,
                            keep_logits: bool = True) -> tuple[Proposal, list[np.ndarray]]:
        """A chain of up to k drafts, with the drafter's logits at each step (keep_logits; else
        none are copied). choose(logits) -> (token, q or None) picks each draft (default
        greedy); sampled q's go into the Proposal. A greedy chain without logits runs natively
        when the fast path is on (the same drafts)."""
        if self.native is not None and choose is None and not keep_logits and k > 0:
            return Proposal.chain(self.native.propose(self.pending, tokens, k, p_min), None), []
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

    def propose_tree(self, tokens: Sequence[int], n_nodes: int, depth: int = TREE_DEPTH,
                     branch: int = TREE_BRANCH, children: int = TREE_CHILDREN) -> Proposal:
        """A draft tree of at most n_nodes nodes (tree.TreeDrafter.grow)."""
        branch = min(branch, self.tree_branch_max)  # a tiny context holds fewer sequences
        if n_nodes < 1 or depth < 1 or branch < 1 or children < 1:
            raise ValueError("a tree needs n_nodes, depth, branch and children >= 1 and a context that holds trees")
        logits, h = self._decode_pending(tokens)
        return self.trees.grow(logits, h, len(tokens) - 2, n_nodes, depth, branch, children)

    def native_cycle(self, target: "Target", steps: "StepCycle") -> FusedCycle | None:
        """Whole greedy chain cycles in one native call (native.FusedCycle, with `steps` for the
        other plans), or None when the fast path is off or the target captures through the eval
        callback."""
        if self.native is None or target.capture_path != "layer_inp" or len(self.target_layers) != 3:
            return None
        return self.native.fused_cycle(steps, target, self.pending, self.target_layers)

    def set_threads(self, n: int) -> None:
        C.llama_set_n_threads(self.ctx, n, n)
        self.n_threads = n

    def _free_context(self) -> None:
        if getattr(self, "ctx", None):
            if getattr(self, "batches", None) is not None:
                self.batches.close()
            free_context(self.ctx)
            self.ctx = None

    def close(self) -> None:
        self._free_context()
        if getattr(self, "model", None):
            free_model(self.model)
            self.model = None

    def __del__(self) -> None:  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass
