"""The drafter interface the speculative loop depends on, and two simple drafters.

A drafter sees the committed token sequence (and, if it wants them, the target's captured
features) and proposes up to k next tokens as a Proposal: a chain, or a tree where the drafter
supports trees. The EAGLE drafter lives in eagle/; NoDrafter is plain decoding.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .policy import TREE_DEPTH
from .proposal import EMPTY, Proposal

if TYPE_CHECKING:
    from .cycle import NativeCycle, StepCycle
    from .target import Target


class Drafter(ABC):
    """Proposes draft tokens; the loop verifies them."""

    #: the loop captures target features and calls ingest() only for drafters that want them
    needs_features: bool = False
    #: the target layers whose inputs this drafter consumes
    target_layers: tuple[int, ...] = ()
    #: whether propose_tree() works (and the target can verify trees)
    supports_trees: bool = False
    name: str = "drafter"

    def reset(self) -> None:
        """Forget all state: a new request starts."""

    def rebind(self, target: "Target") -> None:
        """The target made its llama.cpp context again (Target.set_flash_attn): a drafter whose
        own context is bound to it makes its own again. Others only start afresh."""
        self.reset()

    def keep(self, tokens: Sequence[int], n_rows: int) -> int:
        """A new request starts whose sequence begins with `tokens`: keep what was computed for
        the first n_rows positions if it was computed for these very tokens, forget the rest.
        Returns the rows kept (n_rows, or 0: the drafter starts afresh at row n_rows, as after
        a reset). The loop then ingests the features of positions n_rows.. ."""
        self.reset()
        return 0

    def ingest(self, features: np.ndarray, pos0: int, tokens: Sequence[int]) -> None:
        """Take the target's features of positions pos0.. and the tokens at those positions
        (exactly what the target decoded and kept). EAGLE pairs the features at P with the
        token at P+1, so the last row waits for the next ingest() or propose()."""

    def trim(self, keep: int) -> None:
        """Keep at most `keep` not-yet-processed rows: the loop calls this while it decodes
        plainly, so an idle drafter costs nothing per token (its next proposal then sees
        only that window of context)."""

    @abstractmethod
    def propose(self, tokens: Sequence[int], k: int, p_min: float = 0.0, choose=None) -> Proposal:
        """Up to k draft tokens that follow `tokens` (the whole committed sequence); a drafter
        with confidences stops early once its top probability falls below p_min. When the
        loop samples, it passes choose(logits) -> (token, q); a drafter with a distribution
        picks each draft with it and returns the q's in the Proposal, others ignore it."""

    def propose_tree(self, tokens: Sequence[int], n_nodes: int, depth: int = TREE_DEPTH) -> Proposal:
        """A draft tree of at most n_nodes nodes and the given depth (supports_trees only)."""
        raise NotImplementedError(f"{self.name} drafts chains only")

    def native_cycle(self, target: "Target", steps: "StepCycle") -> "NativeCycle | None":
        """A cycle strategy that runs whole greedy chain cycles natively (draft, the target's
        verify, greedy verification, ingest) and the other plans through `steps`, or None: the
        loop then uses `steps` for every cycle (cycle.py). EagleDrafter has one (eagle/native.py)."""
        return None

    def set_threads(self, n: int) -> None:
        """Run with n CPU threads from the next call on (drafters with a llama.cpp context)."""

    def close(self) -> None:
        """Release native resources."""


class NgramDrafter(Drafter):
    """Prompt lookup: find the latest earlier occurrence of the last n tokens and copy
    what followed it (periodically, inside a loop). Tries n = max_ngram down to min_ngram."""

    name = "prompt-lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, extend_max: int = 32):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_ngram, self.min_ngram, self.extend_max = max_ngram, min_ngram, extend_max
        self._seq: list[int] = []
        self._ends: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending before this position are in _ends

    def propose(self, tokens: Sequence[int], k: int, p_min: float = 0.0, choose=None) -> Proposal:
        return Proposal.chain(self.lookup(tokens, k)[1])

    def lookup(self, tokens: Sequence[int], k: int) -> tuple[int, list[int]]:
        """(n, k tokens): what followed the latest earlier occurrence of the last n tokens,
        for the largest n in max_ngram..min_ngram that occurs; (0, []) if none does. Where the
        copy runs into the end of the text (a loop), it goes on as the loop would. A match of
        max_ngram tokens reports how long it really is, up to extend_max (a long one: copying).

        An index of every n-gram's latest end position grows with the sequence, so a lookup
        costs O(1) per new token while the caller only appends (the loop does); any other
        sequence rebuilds it."""
        seq = self._index(tokens)
        n_seq = len(seq)
        for n in range(min(self.max_ngram, n_seq - 1), self.min_ngram - 1, -1):
            end = self._ends.get(tuple(seq[n_seq - n:]))
            if end is None:
                continue
            # what followed, and past the end of the text what the copy itself predicts:
            # a continuation of P = n_seq - start tokens repeats with period P
            start = end + 1
            period = n_seq - start
            hit = start - n
            if n == self.max_ngram:  # how far back the match really goes (copying: far)
                while n < self.extend_max and hit > 0 and seq[hit - 1] == seq[n_seq - n - 1]:
                    hit -= 1
                    n += 1
            return n, [seq[start + j % period] for j in range(k)]
        return 0, []

    def _index(self, tokens: Sequence[int]) -> list[int]:
        """The indexed copy of tokens: n-grams ending at 0..len-2 (every occurrence that has a
        continuation) map to their latest end. A sequence that does not continue the indexed
        one (checked at its first, middle and last indexed token: a stale index could only
        cost acceptance, never correctness) is indexed anew."""
        seq = self._seq
        n_old = len(seq)
        if n_old and (len(tokens) < n_old or any(tokens[i] != seq[i] for i in (0, n_old // 2, n_old - 1))):
            seq, n_old = [], 0
            self._ends, self._indexed = {}, 0
        seq.extend(int(t) for t in tokens[n_old:])
        self._seq = seq
        ends = self._ends
        for j in range(self._indexed, len(seq) - 1):
            for n in range(1, min(self.max_ngram, j + 1) + 1):
                ends[tuple(seq[j - n + 1:j + 1])] = j
        self._indexed = max(self._indexed, len(seq) - 1)
        return seq


class NoDrafter(Drafter):
    """Plain decoding: proposes nothing."""

    name = "none"

    def propose(self, tokens: Sequence[int], k: int, p_min: float = 0.0, choose=None) -> Proposal:
        return EMPTY


NO_DRAFTER = NoDrafter()
