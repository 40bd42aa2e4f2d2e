"""Draft trees: EAGLE-2's dynamic tree over an EAGLE drafter's context, each expanded node a
row of the drafter's KV in its own sequence (sharing its ancestors' rows), verified by the
target in one batch (Target.decode_tree)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..kv import Memory
from ..proposal import Proposal
from .batches import Batches

TREE_BRANCH = 4  # default nodes expanded per depth (rows of one drafter batch)
#: children considered per expanded node: its most probable next tokens. They cost only a top-k of
#: the node's logits (no drafter row), and the best nodes overall are kept from all of them.
TREE_CHILDREN = 8
TREE_BRANCH_MAX = 8  # the drafter context holds one sequence per expanded node of a depth

# an expanded node of the current depth: (node index or -1 for the root, its logits, h, sequence)
Frontier = list[tuple[int, np.ndarray, np.ndarray, int]]


def top_logprobs(logits: np.ndarray, k: int, ids: np.ndarray | None = None) -> list[tuple[int, float]]:
    """The k most probable tokens of a logit row and their log-probabilities, best first.
    ids: the only tokens whose logits can be finite (a drafter's draft vocabulary; the rest are
    -inf), searched instead of the whole row: numpy's partition slows down about 15x on a row
    that is mostly -inf (6.7 ms for 40,960 of 49,152, against 0.4 ms)."""
    row = logits if ids is None else logits[ids]
    k = min(k, row.shape[-1])
    top = np.argpartition(row, -k)[-k:]
    top = top[np.argsort(-row[top], kind="stable")]
    m = float(row[top[0]])
    lse = m + float(np.log(np.exp(row - m).sum()))
    tokens = top if ids is None else ids[top]
    return [(int(t), float(r) - lse) for t, r in zip(tokens, row[top])]


def depth_first(nodes: list[int], parent: list[int], score: list[float]) -> list[int]:
    """`nodes` (closed under parents) in depth-first order, each node's children by descending
    score (ties by index), so the path of best children comes first."""
    kids: dict[int, list[int]] = {}
    for i in sorted(nodes, key=lambda i: (-score[i], i)):
        kids.setdefault(parent[i], []).append(i)
    out: list[int] = []
    stack = list(reversed(kids.get(-1, [])))
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(reversed(kids.get(node, [])))
    return out


class TreeDrafter:
    """Grows draft trees from a drafter's last decoded row. Sequences 1..branch_max of the
    drafter's context hold the expanded nodes of one depth; carry() is the state fed from a
    node to its children (EAGLE-3.1's norm(h) per node)."""

    def __init__(self, memory: Memory, batches: Batches, carry: Callable[[np.ndarray], np.ndarray],
                 branch_max: int, ids: np.ndarray | None = None):
        self.memory, self.batches, self.carry, self.branch_max = memory, batches, carry, branch_max
        self.ids = ids  # the draft vocabulary (top_logprobs), or None: every token
        #: the last tree's nodes' draft log-probabilities given their parents, in its order
        self.logprobs: tuple[float, ...] = ()

    def grow(self, logits: np.ndarray, h: np.ndarray, pos: int, n_nodes: int, depth: int, branch: int,
             children: int = TREE_CHILDREN) -> Proposal:
        """A draft tree of at most n_nodes nodes from the root row at `pos` (its logits and h):
        depth by depth, the `branch` most probable frontier nodes (by cumulative draft
        log-probability) are expanded in one drafter batch, each into its `children` most probable
        children; then the n_nodes best nodes overall are kept (an ancestor never scores below its
        descendants, so the kept set is a tree). Expansion stops early once no frontier node can
        enter the best n_nodes. Each node's draft is what a chain along its path would draft.
        Nodes come in depth-first order, siblings by descending score, so the likeliest path is
        the first nodes of the batch: when it is accepted its KV cells lie in position order, as
        plain decoding leaves them. Drafts are deterministic (the verifier treats each as a point
        mass, which keeps sampling lossless)."""
        node_tok: list[int] = []
        node_par: list[int] = []
        node_score: list[float] = []
        node_lp: list[float] = []
        frontier: Frontier = [(-1, logits, h, 0)]
        for d in range(1, depth + 1):
            new: list[int] = []
            for node, lg, _, _ in frontier:
                base = node_score[node] if node >= 0 else 0.0
                for t, lp in top_logprobs(lg, min(children, n_nodes), self.ids):
                    new.append(len(node_tok))
                    node_tok.append(t)
                    node_par.append(node)
                    node_score.append(base + lp)
                    node_lp.append(lp)
            if d == depth:
                break
            scores = np.asarray(node_score)
            floor = -np.inf if len(scores) < n_nodes else float(np.partition(scores, -n_nodes)[-n_nodes])
            expand = sorted((i for i in new if node_score[i] > floor), key=lambda i: -node_score[i])[:branch]
            if not expand:
                break
            frontier = self._expand(expand, node_tok, node_par, frontier, pos + d)
        self.drop_sequences()
        keep = sorted(range(len(node_tok)), key=lambda i: (-node_score[i], i))[:n_nodes]
        kept = set(keep)
        keep = [i for i in keep if node_par[i] < 0 or node_par[i] in kept]  # closure, against ties
        order = depth_first(keep, node_par, node_score)
        index = {old: new for new, old in enumerate(order)}
        self.logprobs = tuple(node_lp[i] for i in order)
        return Proposal(tuple(node_tok[i] for i in order),
                        tuple(index[node_par[i]] if node_par[i] >= 0 else -1 for i in order))

    def _expand(self, expand: list[int], node_tok: list[int], node_par: list[int], frontier: Frontier,
                pos: int) -> Frontier:
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
        free = [s for s in range(1, self.branch_max + 1) if s not in claimed]
        for row, i in enumerate(expand):
            if seqs[row] is None:
                dst = free.pop(0)
                self.memory.copy_seq(parent_of[node_par[i]][1], dst)
                seqs[row] = dst
        filled = [s for s in seqs if s is not None]  # every row has its sequence now
        g = np.stack([self.carry(parent_of[node_par[i]][0]) for i in expand]).astype(np.float32)
        self.batches.decode_rows([node_tok[i] for i in expand], g, [pos] * len(expand), outputs=True, seqs=filled)
        out = []
        for row, (i, seq) in enumerate(zip(expand, filled)):
            lg, h = self.batches.row(row)
            out.append((i, lg.copy(), h.copy(), seq))
        return out

    def drop_sequences(self) -> None:
        for s in range(1, self.branch_max + 1):
            self.memory.remove_seq(s)
