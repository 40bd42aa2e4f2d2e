"""Suffix speculation: an index over the current context and a bounded history of earlier
requests' prompts and outputs, proposing draft *trees* of what followed the context's longest
suffix before (SuffixDecoding, Oliaro et al., 2025, on llama.cpp's tree verification).

The index maps every n-gram (n in NGRAMS, up to 8) of every indexed text, by its hash, to its
most recent occurrences (at most `max_occurrences` each, newest first). A lookup takes the
longest suffix of the context among those lengths that occurred before; each occurrence's match is then
extended backwards (up to `extend_max` tokens: a long match means the text is being copied) and
what followed it is merged into a trie, each continuation weighted by its match length. A
node's score is its weight's share of its parent's, so the first-choice path is what most
(and the longest-matching) occurrences continued with, and branches are where history forked.

Texts: the live one (the current request's tokens, indexed as the loop appends them) and the
history, earlier requests in arrival order. The history lives in memory only and is never
written anywhere. Its cap, `max_tokens` (the live text not counted), is kept by evicting whole
texts, oldest first, with their index entries: each indexed token costs len(NGRAMS) index
entries (an int key, an int occurrence) once when it is indexed and once when it is evicted, so
updates are O(len(NGRAMS)) per token, amortised. `stats()` reports the counts and bytes.

On a shared server, the time a request takes can reveal whether it repeats text from another
request, since repeated text is drafted and verified faster; turn the history off
(`history=False`) where requests must not learn about each other.
"""

from __future__ import annotations

import os
import sys
from array import array
from collections import deque
from dataclasses import dataclass
from typing import Sequence

from .errors import EdgeEagleError
from .proposal import EMPTY, Proposal


@dataclass(frozen=True)
class SuffixDraft:
    """A lookup's result: the match length n (0: none), the draft tree (nodes in depth-first
    order, each node's children by descending score, so the first-choice path comes first),
    and each node's score: its share of its parent's weight (the root's children sum to 1)."""

    n: int
    proposal: Proposal
    shares: tuple[float, ...]

    @property
    def first_path(self) -> list[int]:
        """The first-choice path's tokens (node 0, its first child, ...)."""
        out, node = [], 0
        tokens, parents = self.proposal.tokens, self.proposal.parents
        while node < len(tokens) and (node == 0 and parents[0] == -1 or parents[node] == node - 1):
            out.append(tokens[node])
            node += 1
        return out


NO_DRAFT = SuffixDraft(0, EMPTY, ())


@dataclass(frozen=True)
class Match:
    """The live text's longest earlier suffix: its length n, its occurrences ((text id, end),
    newest first), and the live text (its id, and its length when the match was found)."""

    n: int
    occ: tuple[tuple[int, int], ...]
    size: int
    live_id: int

    @property
    def from_history(self) -> bool:
        """Only earlier requests hold it: its newest occurrence is not in the live text."""
        return self.occ[0][0] != self.live_id


NGRAMS = (1, 2, 3, 4, 6, 8)  # the suffix lengths indexed; a match is then extended token by token
_LONGEST_FIRST = tuple(reversed(NGRAMS))
_SHIFT = 1 << 32  # an occurrence is one int: text id * _SHIFT + end position
NATIVE_OCCURRENCES = range(2, 65)  # the max_occurrences the C index keeps (_suffix.c's MAX_OCC)


def _check_cap(max_tokens: int) -> None:
    if max_tokens < 0:
        raise EdgeEagleError(f"The history's cap must be 0 tokens or more, got {max_tokens}.")


class SuffixIndex:
    def __init__(self, max_occurrences: int = 8, extend_max: int = 32, max_tokens: int = 200_000,
                 history: bool = True):
        _check_cap(max_tokens)
        self.max_ngram = NGRAMS[-1]
        self.max_occurrences, self.extend_max = max_occurrences, extend_max
        self.max_tokens, self.history = max_tokens, history
        self._texts: dict[int, array] = {}
        self._order: deque[int] = deque()  # history text ids, oldest first
        self._history_tokens = 0
        # hash of an n-gram -> its newest occurrence, or a list of them (newest first); hashes
        # may collide, so a lookup compares the tokens themselves
        self._index: dict[int, int | list[int]] = {}
        self._live_id = 1
        self._texts[self._live_id] = array("i")
        self._live_indexed = 0  # live n-grams ending before this position are indexed

    # --- indexing ------------------------------------------------------------------------------

    @staticmethod
    def _keys(text: array, start: int, end: int):
        """(end position, hash) of each indexed n-gram of text ending at start..end-1."""
        top = NGRAMS[-1]
        for j in range(start, end):
            window = tuple(text[max(0, j - top + 1):j + 1])
            for n in NGRAMS:
                if n > j + 1:
                    break
                yield j, hash(window[-n:])

    def _add(self, text_id: int, text: array, start: int, end: int) -> None:
        """Index the n-grams of text ending at start..end-1: _keys' keys, inlined, since the live
        text adds one token a cycle and this runs on every cycle (through _keys, planning on the
        agent sessions took about 15% longer, scripts/bench_suffix.py's plan_us_per_cycle)."""
        index, cap = self._index, self.max_occurrences
        base = text_id * _SHIFT
        top = NGRAMS[-1]
        for j in range(start, end):
            window = tuple(text[max(0, j - top + 1):j + 1])
            size = len(window)
            packed = base + j
            for n in NGRAMS:
                if n > size:
                    break
                key = hash(window[-n:])
                old = index.get(key)
                if old is None:
                    index[key] = packed
                elif isinstance(old, int):
                    index[key] = [packed, old]
                else:
                    old.insert(0, packed)
                    if len(old) > cap:
                        old.pop()

    def _remove(self, text_id: int, text: array) -> None:
        index = self._index
        lo, hi = text_id * _SHIFT, (text_id + 1) * _SHIFT
        for _, key in self._keys(text, 0, len(text)):
            old = index.get(key)
            if old is None:
                continue
            if isinstance(old, int):
                if lo <= old < hi:
                    del index[key]
                continue
            kept = [o for o in old if not lo <= o < hi]
            if not kept:
                del index[key]
            elif len(kept) == 1:
                index[key] = kept[0]
            elif len(kept) != len(old):
                index[key] = kept

    def observe(self, tokens: Sequence[int]) -> None:
        """The live text is now `tokens`: a continuation of it is indexed incrementally (n-grams
        with a continuation, so the context's own suffix never matches itself); any other text
        starts a new live text, the old one going to the history."""
        live = self._texts[self._live_id]
        n_old = len(live)
        if n_old and (len(tokens) < n_old or tokens[0] != live[0] or tokens[n_old // 2] != live[n_old // 2]
                      or tokens[n_old - 1] != live[n_old - 1]):
            self.finish()
            live, n_old = self._texts[self._live_id], 0
        live.extend(tokens[n_old:])
        end = len(live) - 1
        if end > self._live_indexed:
            self._add(self._live_id, live, self._live_indexed, end)
            self._live_indexed = end

    def finish(self, tokens: Sequence[int] | None = None, keep: bool = True) -> None:
        """The request is over (its whole text, when given): the live text joins the history
        (when it is on and `keep`; its last token is indexed then), and the history is cut back
        to its cap, oldest texts first."""
        if tokens is not None:
            self.observe(tokens)
        live_id, live = self._live_id, self._texts[self._live_id]
        if live and self.history and keep:
            self._add(live_id, live, self._live_indexed, len(live))
            self._order.append(live_id)
            self._history_tokens += len(live)
        else:
            self._remove(live_id, live)
            del self._texts[live_id]
        self._live_id += 1
        self._texts[self._live_id] = array("i")
        self._live_indexed = 0
        while self._history_tokens > self.max_tokens and self._order:
            old = self._order.popleft()
            text = self._texts.pop(old)
            self._history_tokens -= len(text)
            self._remove(old, text)

    def reset(self) -> None:
        """Forget the history and the live text."""
        self._texts = {self._live_id: array("i")}
        self._order.clear()
        self._index.clear()
        self._history_tokens = 0
        self._live_indexed = 0

    def _occurrences(self, key: tuple[int, ...]) -> list[tuple[int, int]]:
        """(text id, end) of each indexed occurrence of `key`, newest first (hash collisions out)."""
        found = self._index.get(hash(key))
        if found is None:
            return []
        n, out = len(key), []
        for packed in ((found,) if isinstance(found, int) else found):
            text_id, end = divmod(packed, _SHIFT)
            text = self._texts.get(text_id)
            if text is not None and end >= n - 1 and tuple(text[end - n + 1:end + 1]) == key:
                out.append((text_id, end))
        return out

    # --- proposals ----------------------------------------------------------------------------

    def match(self, tokens: Sequence[int]) -> Match | None:
        """The live text becomes `tokens` (observe()); then the longest of its suffixes (among
        NGRAMS' lengths) that occurred before, with its occurrences, or None."""
        self.observe(tokens)
        live = self._texts[self._live_id]
        size = len(live)
        tail = tuple(live[max(0, size - self.max_ngram):])
        for n in _LONGEST_FIRST:
            if n <= size:
                occ = self._occurrences(tail[-n:])
                if occ:
                    return Match(n, tuple(occ), size, self._live_id)
        return None

    def _continuations(self, match: Match, depth: int):
        """(match length, what followed) per occurrence of `match`, newest first: each match
        extended backwards when it has the longest indexed length, each continuation up to `depth`
        tokens. The live text is read as it was at the match (its first match.size tokens: it
        only grows); a live continuation that runs into that end repeats its period (a loop)."""
        live, size, n = self._texts.get(match.live_id), match.size, match.n
        if live is None:  # that request's text was dropped (history off)
            return
        for text_id, end in match.occ:
            text = self._texts.get(text_id)
            if text is None:
                continue
            is_live = text_id == match.live_id
            m = n
            if n == self.max_ngram:  # how far back the match goes
                while (m < self.extend_max and end - m >= 0 and size - 1 - m >= 0
                       and text[end - m] == live[size - 1 - m]):
                    m += 1
            stop = size if is_live else len(text)
            follow = []
            for j in range(depth):
                pos = end + 1 + j
                if pos >= stop:
                    if not is_live:
                        break
                    period = size - (end + 1)
                    if period <= 0:
                        break
                    follow.append(text[end + 1 + j % period])
                else:
                    follow.append(text[pos])
            yield m, follow

    def split(self, match: Match) -> bool:
        """Whether `match`'s occurrences disagree on the next token (one occurrence agrees with
        itself). Where earlier text went on in several ways, the first choice is a weaker guess
        (policy replay of scripts/bench_suffix.py; see controller.py)."""
        live, size = self._texts.get(match.live_id), match.size
        first = -1
        for text_id, end in match.occ:
            text = self._texts.get(text_id)
            if text is None or live is None:
                continue
            if end + 1 >= (size if text_id == match.live_id else len(text)):
                continue  # nothing followed it yet
            token = text[end + 1]
            if first < 0:
                first = token
            elif token != first:
                return True
        return False

    def first_path(self, match: Match, depth: int) -> list[int]:
        """The first-choice path of `match`'s tree up to `depth` tokens, without the tree: at each
        depth the continuation with the most match-length weight (ties: the newest), among the
        occurrences that continued with the path so far."""
        runs = list(self._continuations(match, depth))
        out: list[int] = []
        for j in range(depth):
            weight: dict[int, float] = {}
            for m, follow in runs:
                if j < len(follow):
                    weight[follow[j]] = weight.get(follow[j], 0.0) + m
            if not weight:
                break
            tok = max(weight, key=weight.__getitem__)  # the first of the largest: the newest
            out.append(tok)
            runs = [(m, f) for m, f in runs if j < len(f) and f[j] == tok]
        return out

    def lookup(self, tokens: Sequence[int], depth: int, max_nodes: int, max_paths: int = 1) -> SuffixDraft:
        """A draft tree of what followed the context's longest earlier suffix: up to `depth`
        deep, `max_nodes` nodes and `max_paths` leaves (1: a chain), best nodes by score."""
        found = self.match(tokens)
        return NO_DRAFT if found is None else self.tree(found, depth, max_nodes, max_paths)

    def tree(self, match: Match, depth: int, max_nodes: int, max_paths: int = 1) -> SuffixDraft:
        """lookup()'s tree for a match() of the current live text."""
        # the trie: node -> {token: child}; weights per node; each occurrence weighted by its match
        children: list[dict[int, int]] = [{}]
        weight = [0.0]
        node_tok = [-1]
        longest = match.n
        for m, follow in self._continuations(match, depth):
            longest = max(longest, m)
            w = float(m)
            node = 0
            weight[0] += w
            for tok in follow:
                child = children[node].get(tok)
                if child is None:
                    child = children[node][tok] = len(node_tok)
                    children.append({})
                    weight.append(0.0)
                    node_tok.append(tok)
                weight[child] += w
                node = child
        return _select(longest, children, weight, node_tok, max_nodes, max_paths)

    # --- figures ------------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Indexed tokens (history and live), texts, index keys and entries, and an estimate of
        the bytes the index and texts hold (Python objects, measured with sys.getsizeof)."""
        lists = [o for o in self._index.values() if not isinstance(o, int)]
        entries = len(self._index) - len(lists) + sum(len(o) for o in lists)
        # keys and single occurrences are ints of 32 bytes; lists hold 8-byte pointers to ints
        value_bytes = sum(sys.getsizeof(o) for o in lists) + 32 * entries
        text_bytes = sum(sys.getsizeof(t) for t in self._texts.values())
        return {"history_tokens": self._history_tokens, "live_tokens": len(self._texts[self._live_id]),
                "texts": len(self._order), "keys": len(self._index), "entries": entries,
                "approx_bytes": sys.getsizeof(self._index) + 32 * len(self._index) + value_bytes + text_bytes}


def _select(n: int, children: list[dict[int, int]], weight: list[float], node_tok: list[int],
            max_nodes: int, max_paths: int) -> SuffixDraft:
    """The best nodes by path probability (product of shares), a closed tree within the
    budgets, laid out depth-first with each node's children by descending share."""
    if not children[0] or max_nodes <= 0:
        return SuffixDraft(n, EMPTY, ())
    prob = {0: 1.0}
    share: dict[int, float] = {}
    frontier = [0]
    candidates = []
    while frontier:
        node = frontier.pop()
        for child in children[node].values():
            share[child] = weight[child] / weight[node]
            prob[child] = prob[node] * share[child]
            candidates.append(child)
            frontier.append(child)
    candidates.sort(key=lambda c: -prob[c])
    chosen: set[int] = set()
    leaves = 0
    parent_of = {c: p for p in range(len(children)) for c in children[p].values()}
    for c in candidates:
        if len(chosen) >= max_nodes:
            break
        p = parent_of[c]
        if p != 0 and p not in chosen:
            continue
        # a child of a chosen leaf keeps the leaf count; any other new node adds a leaf
        adds_leaf = p == 0 or any(x in chosen for x in children[p].values())
        if adds_leaf and leaves >= max_paths:
            continue
        chosen.add(c)
        leaves += adds_leaf
    tokens: list[int] = []
    parents: list[int] = []
    shares: list[float] = []

    def visit(node: int, parent_index: int) -> None:
        for child in sorted((c for c in children[node].values() if c in chosen), key=lambda c: -weight[c]):
            tokens.append(node_tok[child])
            parents.append(parent_index)
            shares.append(share[child])
            visit(child, len(tokens) - 1)

    visit(0, -1)
    return SuffixDraft(n, Proposal(tuple(tokens), tuple(parents)), tuple(shares))


class NativeSuffixIndex(SuffixIndex):
    """The same index with its per-cycle work in C (edge_eagle/_suffix.c): indexing, the longest
    earlier suffix, and what followed it. The draft tree's selection stays SuffixIndex's. Its
    lookups equal SuffixIndex's (tests/test_suffix.py compares them on random texts), save where
    two n-grams' hashes collide, which the two indexes hash differently."""

    def __init__(self, max_occurrences: int = 8, extend_max: int = 32, max_tokens: int = 200_000,
                 history: bool = True):
        _check_cap(max_tokens)
        if max_occurrences not in NATIVE_OCCURRENCES:
            raise EdgeEagleError(f"The native suffix index keeps 2 to 64 occurrences an n-gram, got {max_occurrences}; "
                                 "use SuffixIndex for other values.")
        core = _core_module()
        if core is None:
            raise EdgeEagleError("The native suffix index is not built: reinstall edge-eagle with a C compiler, "
                                 "or use SuffixIndex.")
        self.max_ngram = NGRAMS[-1]
        self.max_occurrences, self.extend_max, self.max_tokens = max_occurrences, extend_max, max_tokens
        self._core = core.Index(NGRAMS, max_occurrences, extend_max, max_tokens, history, 1)

    @property
    def history(self) -> bool:
        return bool(self._core.history)

    @history.setter
    def history(self, on: bool) -> None:
        self._core.history = on

    def observe(self, tokens: Sequence[int]) -> None:
        self._core.observe(tokens)

    def finish(self, tokens: Sequence[int] | None = None, keep: bool = True) -> None:
        self._core.finish(tokens, keep)

    def reset(self) -> None:
        self._core.reset()

    def match(self, tokens: Sequence[int]) -> Match | None:
        found = self._core.match(tokens)
        return None if found is None else Match(*found)

    def _continuations(self, match: Match, depth: int):
        return self._core.continuations(match.n, match.occ, match.size, match.live_id, depth)

    def split(self, match: Match) -> bool:
        return self._core.split(match.occ, match.size, match.live_id)  # a bool

    def first_path(self, match: Match, depth: int) -> list[int]:
        return self._core.first_path(match.n, match.occ, match.size, match.live_id, depth)  # a new list

    def stats(self) -> dict[str, int]:
        """As SuffixIndex.stats(); approx_bytes is what the C index allocated (its table at up to
        70% load, the occurrence chunks, and the texts)."""
        return self._core.stats()  # a new dict


def _core_module():
    """edge_eagle._suffixcore, or None where it was not built (setup.py builds it when it can)."""
    try:
        from . import _suffixcore
    except ImportError:
        return None
    return _suffixcore


def native_available() -> bool:
    """Whether the native suffix index is built and not turned off (EDGE_EAGLE_NATIVE_SUFFIX=0)."""
    return os.environ.get("EDGE_EAGLE_NATIVE_SUFFIX", "1") != "0" and _core_module() is not None


def new_index(max_occurrences: int = 8, extend_max: int = 32, max_tokens: int = 200_000,
              history: bool = True) -> SuffixIndex:
    """A suffix index: the native one where it is available (native_available()), else the Python
    one; both propose the same drafts."""
    if native_available() and max_occurrences in NATIVE_OCCURRENCES:
        return NativeSuffixIndex(max_occurrences, extend_max, max_tokens, history)
    return SuffixIndex(max_occurrences, extend_max, max_tokens, history)
