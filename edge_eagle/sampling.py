"""Turning logits into tokens: the target distribution after temperature, top-k and top-p,
and how the target and a drafter pick from it. Verifying drafts is verify.py.

A sampled request with a seed is *seeded*: the token at sequence position t is the Gumbel-max
sample argmax(log p_t(x) + g_t(x)), with g_t Gumbel noise fixed by (seed, t). That is an exact
sample from p_t, and it depends only on the seed, the position and the target's logits, never on
which drafts were proposed: a draft is accepted iff it equals that sample, so the text is the
same whatever k, tree or proposer runs, and the same as plain decoding with that seed. The
drafter draws its drafts with the same noise (argmax(log q_t + g_t)), so it matches as often
as its distribution allows. Without a seed, drafts are accepted by rejection sampling
(verify.py), which accepts more when q is close to p.

With a grammar (grammar.py), the target distribution at a position is the one above over the
tokens the grammar allows there, the others masked to -inf before temperature, top-k, top-p and
min-p. Each method that judges the target's choice takes `path`, the drafts between the
committed tokens and that position (None: no grammar, as for the drafter's own picks); the
grammar's state along it decides the mask. Greedy and untruncated seeded picks first try the
unconstrained winner and only mask the whole vocabulary when the grammar forbids it (masking
cannot change a winner it allows), as llama.cpp's samplers do. With top_k, the best candidates
are checked one by one until top_k allowed ones are found (the same set masking would keep);
only when the grammar forbids most of them is the whole vocabulary masked. An untruncated
unseeded sample is drawn from the unconstrained distribution and kept when the grammar allows
it, else drawn again within the grammar: exactly the constrained distribution."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    from .grammar import Grammar

Path = Sequence[int] | None


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    min_p: float = 0.0  # drop tokens less probable than min_p times the most probable (llama.cpp's min-p)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, added to its logit), as OpenAI's logit_bias
    # llama.cpp's penalties over the last penalty_last_n tokens of the sequence (prompt included)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    penalty_last_n: int = 64
    grammar: str | None = None  # GBNF text (grammar.py) the output must follow

    @property
    def penalized(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repeat_penalty != 1.0)

    @property
    def plain_greedy(self) -> bool:
        """Greedy on the raw logits: no bias, no penalties, no grammar (what the native cycle runs)."""
        return self.greedy and not self.logit_bias and not self.penalized and not self.grammar

    @property
    def truncated(self) -> bool:
        """Top-k, top-p or min-p drop tokens (after the grammar's mask, which then decides the set)."""
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def seeded(self) -> bool:
        """Sampled with a seed: Gumbel-max sampling at fixed noise per position (the module's doc)."""
        return self.seed is not None and not self.greedy


class Sampler:
    NOISE_CACHE = 64  # positions whose noise is kept (a cycle drafts and verifies a few)

    def __init__(self, params: SamplingParams, grammar: "Grammar | None" = None):
        self.params = params
        self.grammar = grammar  # the state of params.grammar over this generation
        self.rng = np.random.default_rng(params.seed)
        self.seeded = params.seeded
        self._noise: dict[tuple[int, int], np.ndarray] = {}
        self._bias = (np.array([t for t, _ in params.logit_bias], dtype=np.int64),
                      np.array([b for _, b in params.logit_bias], dtype=np.float32)) if params.logit_bias else None

    def adjust(self, logits: np.ndarray, history: Sequence[int] | None = None) -> np.ndarray:
        """The logits with logit_bias added and, given the tokens before this position
        (`history`), llama.cpp's penalties applied: the same array when there is neither."""
        p = self.params
        penalize = p.penalized and history is not None and len(history) > 0
        if self._bias is None and not penalize:
            return logits
        out = np.array(logits, dtype=np.float32)
        if self._bias is not None:
            out[self._bias[0]] += self._bias[1]
        if penalize:
            assert history is not None
            ids, counts = np.unique(np.asarray(history[-p.penalty_last_n:], dtype=np.int64), return_counts=True)
            x = out[ids]
            if p.repeat_penalty != 1.0:
                x = np.where(x > 0, x / p.repeat_penalty, x * p.repeat_penalty)
            out[ids] = x - counts * p.frequency_penalty - p.presence_penalty
        return out

    def _best(self, z: np.ndarray, path: Path) -> int:
        """argmax z over the tokens the grammar allows after `path` (all without a path)."""
        best = int(np.argmax(z))
        g = self.grammar
        if g is None or path is None or g.allows(best, path):
            return best
        return int(np.argmax(g.constrain(z, path)))

    #: top-k under a grammar checks at most this many candidates per kept token, one by one,
    #: before it masks the whole vocabulary instead
    TOP_K_SCAN = 4

    def _top_k_allowed(self, z: np.ndarray, path: Sequence[int]) -> np.ndarray | None:
        """z with -inf everywhere but the top_k best tokens the grammar allows after `path` (and
        any allowed token tied with the k-th): what masking the whole vocabulary and then keeping
        the top_k would leave, found by checking the best candidates one at a time. None when
        the grammar forbids too many of them (the caller masks the whole vocabulary then)."""
        assert self.grammar is not None
        k = self.params.top_k
        finite = np.flatnonzero(z > -np.inf)
        n = min(len(finite), self.TOP_K_SCAN * k)
        if n == 0:
            return None
        head = finite[np.argpartition(-z[finite], n - 1)[:n]] if n < len(finite) else finite
        head = head[np.argsort(-z[head], kind="stable")]
        kept: list[int] = []
        kth = None
        for token in head:
            value = z[token]
            if kth is not None and value < kth:
                break
            if self.grammar.allows(int(token), path):
                kept.append(int(token))
                if len(kept) == k:
                    kth = value
        else:  # the candidates ran out: unless they were every finite token, more allowed ones (or
            if n < len(finite):  # ties with the k-th) may lie beyond them
                return None
        out = np.full(z.shape, -np.inf, dtype=np.float32)
        out[kept] = z[kept]
        return out

    def commit(self, tokens: Sequence[int]) -> None:
        """The tokens the loop emitted: a grammar's state moves past them."""
        if self.grammar is not None:
            self.grammar.commit(tokens)

    def argmax(self, logits: np.ndarray, history: Sequence[int] | None = None, path: Path = None) -> int:
        """The greedy token: the argmax of the adjusted logits (within the grammar after path)."""
        return self._best(self.adjust(logits, history), path)

    def log_weights(self, logits: np.ndarray, history: Sequence[int] | None = None, path: Path = None) -> np.ndarray:
        """log p + a constant, float64: the scaled logits with -inf outside the grammar after
        `path`, top-k and top-p."""
        p = self.params
        z = self.adjust(logits, history)
        if self.grammar is not None and path is not None:
            best = self._top_k_allowed(z, path) if 0 < p.top_k < z.shape[-1] else None
            z = self.grammar.constrain(z, path) if best is None else best
        z = z.astype(np.float64)
        with np.errstate(over="ignore"):  # the max first: a tiny temperature gives -inf, never inf - inf
            z = (z - z.max()) / p.temperature
        if 0 < p.top_k < z.shape[-1]:
            # among the finite logits only: numpy's partition slows down about 15x on a row that a
            # grammar or a logit_bias left mostly -inf (6 ms against 0.4 ms for 49,152 tokens)
            finite = z[z > -np.inf]
            if p.top_k < len(finite):
                kth = np.partition(finite, -p.top_k)[-p.top_k]
                z = np.where(z >= kth, z, -np.inf)
        if p.min_p > 0.0:  # z's max is 0: p(x) / p_max = exp(z)
            z = np.where(z >= np.log(p.min_p), z, -np.inf)
        if p.top_p < 1.0:
            probs = np.exp(z - z.max())
            probs /= probs.sum()
            order = np.argsort(-probs, kind="stable")
            cum = np.cumsum(probs[order])
            drop = order[int(np.searchsorted(cum, p.top_p) + 1):]
            z[drop] = -np.inf
        return z

    def probs(self, logits: np.ndarray, history: Sequence[int] | None = None, path: Path = None) -> np.ndarray:
        """The target distribution after the grammar, temperature, top-k and top-p, as float64."""
        z = self.log_weights(logits, history, path)
        probs = np.exp(z - z.max())
        return probs / probs.sum()

    def noise(self, pos: int, n: int) -> np.ndarray:
        """Gumbel noise over n tokens for sequence position pos, fixed by (seed, pos)."""
        key = (pos, n)
        g = self._noise.get(key)
        if g is None:
            if len(self._noise) >= self.NOISE_CACHE:
                self._noise.pop(next(iter(self._noise)))
            g = self._noise[key] = np.random.default_rng([int(self.params.seed or 0), pos]).gumbel(size=n)
        return g

    def sample_at(self, logits: np.ndarray, pos: int, history: Sequence[int] | None = None,
                  path: Path = None) -> int:
        """The seeded sample at sequence position pos: argmax(log p + g_pos)."""
        g = self.noise(pos, logits.shape[-1])
        if self.grammar is not None and path is not None and not self.params.truncated:
            # untruncated: log p is the scaled logits within the grammar, so mask only if needed
            best = int(np.argmax(self.log_weights(logits, history) + g))
            if self.grammar.allows(best, path):
                return best
        return int(np.argmax(self.log_weights(logits, history, path) + g))

    def sample(self, logits: np.ndarray, pos: int | None = None, history: Sequence[int] | None = None,
               path: Path = None) -> int:
        """The target's token from its logits (pos: the token's sequence position, which a seeded
        request's sample depends on; history: the tokens before it, for the penalties; path: the
        drafts since the committed tokens, for a grammar)."""
        if self.params.greedy:
            return self.argmax(logits, history, path)
        if self.seeded and pos is not None:
            return self.sample_at(logits, pos, history, path)
        if self.grammar is not None and path is not None and not self.params.truncated:
            # untruncated: a draw from p kept when the grammar allows it, else a draw within the
            # grammar, is a draw from p within the grammar (each allowed y: p(y) / p(allowed))
            free = self.probs(logits, history)
            token = int(self.rng.choice(len(free), p=free))
            if self.grammar.allows(token, path):
                return token
        probs = self.probs(logits, history, path)
        return int(self.rng.choice(len(probs), p=probs))

    def draft(self, logits: np.ndarray) -> tuple[int, np.ndarray | None]:
        """How a drafter picks a draft from its logits: greedy (no q), or sampled from q."""
        if self.params.greedy:
            return self.argmax(logits), None
        q = self.probs(logits)
        return int(self.rng.choice(len(q), p=q)), q

    def drafter_at(self, pos: int):
        """For a seeded request, the drafter's pick for the chain starting at sequence position
        pos: each draft argmax(log q + g) with the target's noise for its position (no q: a
        seeded draft is accepted iff it equals the target's seeded sample)."""
        step = [pos]

        def choose(logits: np.ndarray) -> tuple[int, None]:
            d = self.sample_at(logits, step[0])  # the drafter's q in place of p, the same noise
            step[0] += 1
            return d, None

        return choose
