"""Drafters for tests only."""

from __future__ import annotations

from typing import Sequence

from edge_eagle.drafter import Drafter
from edge_eagle.proposal import EMPTY, Proposal


class OracleDrafter(Drafter):
    """Knows the continuation in advance (for tests): proposes the reference tokens that
    follow the committed sequence, optionally corrupting every `corrupt_every`-th draft."""

    name = "oracle"

    def __init__(self, reference: Sequence[int], corrupt_every: int = 0, vocab_size: int = 2):
        self.reference = list(reference)
        self.corrupt_every = corrupt_every
        self.vocab_size = vocab_size
        self._count = 0

    def reset(self) -> None:
        self._count = 0

    def propose(self, tokens: Sequence[int], k: int, p_min: float = 0.0, choose=None) -> Proposal:
        n = len(tokens)
        if list(tokens) != self.reference[:n]:
            return EMPTY
        out = self.reference[n:n + k]
        if self.corrupt_every:
            for i in range(len(out)):
                self._count += 1
                if self._count % self.corrupt_every == 0:
                    out[i] = (out[i] + 1) % self.vocab_size
        return Proposal.chain(out)


class OracleOverlay(Drafter):
    """Wraps an EAGLE drafter (whose KV then does all its real work) and plants the reference
    continuation on a random path of each tree, or a random prefix of each chain, at random
    depths and sibling ranks: every accept pattern happens, with the drafter's caches live."""

    name = "oracle-overlay"
    needs_features = True
    supports_trees = True

    def __init__(self, inner, reference: Sequence[int], seed: int = 0):
        import random

        self.inner, self.reference = inner, list(reference)
        self.target_layers = inner.target_layers
        self.rng = random.Random(seed)

    def reset(self) -> None:
        self.inner.reset()

    def keep(self, tokens: Sequence[int], n_rows: int) -> int:
        return self.inner.keep(tokens, n_rows)

    def ingest(self, features, pos0: int, tokens: Sequence[int]) -> None:
        self.inner.ingest(features, pos0, tokens)

    def trim(self, keep: int) -> None:
        self.inner.trim(keep)

    def _truth(self, tokens: Sequence[int], n: int) -> list[int]:
        at = len(tokens)
        return self.reference[at:at + n] if list(tokens) == self.reference[:at] else []

    def propose(self, tokens: Sequence[int], k: int, p_min: float = 0.0, choose=None) -> Proposal:
        drafts = list(self.inner.propose(tokens, k, p_min, choose).tokens)
        truth = self._truth(tokens, len(drafts))
        j = self.rng.randint(0, len(truth))
        return Proposal.chain(truth[:j] + drafts[j:])

    def propose_tree(self, tokens: Sequence[int], n_nodes: int, **kw) -> Proposal:
        tree = self.inner.propose_tree(tokens, n_nodes, **kw)
        toks, parents = list(tree.tokens), tree.parents
        node = self.rng.randrange(len(toks))
        path = []
        while node >= 0:
            path.insert(0, node)
            node = parents[node]
        truth = self._truth(tokens, len(path))
        for node, tok in zip(path[: self.rng.randint(0, len(truth))], truth):
            for sib in range(len(toks)):  # a sibling already holding the token gives it up
                if sib != node and parents[sib] == parents[node] and toks[sib] == tok:
                    toks[sib] = max(toks) + 1 + sib
            toks[node] = tok
        return Proposal(tuple(toks), parents)
