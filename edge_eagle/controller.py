"""Choosing the draft length for each cycle ("auto" k): never slower than plain decoding.

The expected tokens of a cycle drafting k tokens are E(k) = 1 + sum_{i<=k} prod_{j<=i} r_j,
with r_j the running conditional acceptance rate of draft position j; its cost, in units
of one single-token target decode, is C(k) = c(k+1) + k*d, with c(n) the target's batch
cost relative to n = 1 and d the drafter's step cost. The controller picks the k in
0..k_max that maximises E(k)/C(k); k = 0 (plain decoding, E = C = 1) wins unless some k
beats it. Costs are measured at start-up and then tracked online (costs.py owns the
formulas); while it decodes plainly it probes one short draft every `probe_every` cycles so
acceptance stays current. KController is a policy.DraftPolicy.

Per cycle (plan()), the same comparison covers two more proposers:
- suffix lookup (suffix.py): when the committed text's last n tokens occurred before, in this
  request or in earlier ones, a draft tree of what followed costs c(m+1) for m nodes (no drafter
  work). Its first-choice path's acceptance is modelled per match length n (1, 2, 3, 4-7, 8-15,
  16-31, 32: a long match means the text is being copied; at 32, one rate for every depth, see
  POOLED_MATCH) and per source (this request's own
  text, or only earlier requests': a phrase another answer used is weaker evidence; a long match
  into this request's text starts from a prior of 0.8, others from 0.5), counting at most one token
  before this request's answer: every answer starts after the same chat-template tokens, so a match
  reaching back into them says nothing about copying (measured on the suffix index's drafts of
  plain decoding's answers, scripts/bench_suffix.py's policy replay: repeat 1.08x -> 1.12x,
  MT-bench second turns 1.12x -> 1.14x, geometric means). It is modelled apart, too, where the
  match's earlier occurrences disagree on the next token (split: where the text went on in
  several ways, its first choice is a weaker guess; the same replay, geometric means: agent
  sessions 1.437 -> 1.439, repeat 1.165 -> 1.179, MT-bench second turns 1.190 -> 1.220, first
  turns 0.983 -> 0.996, HumanEval 1.095 -> 1.121). A node off that path is worth its
  parent's probability times the path model's rate at its depth times its share of the
  occurrences relative to its first-choice sibling. The m best nodes by that probability form
  the tree whose E/C is best (a chain when history never branched there). A short match (not
  extended backwards, so its model is known before its tree) whose bound on any tree's E/C
  (every node worth its depth's reach) cannot win is not built at all: most cycles of text that
  does not repeat. The model learns on every cycle, for free: the first-choice path of the
  match found before a cycle (SuffixIndex.first_path) is compared with the tokens the cycle
  committed, whichever proposer ran (a shadow draft; a verified lookup is scored the same way,
  through its bonus token), so copying is noticed without paying for probes;
- a drafter tree of N nodes: E_tree(N) is the tracked mean tokens per tree cycle (prior: the
  chain of the same budget), its cost c(N+1) plus the measured tree drafting time.

A request's first draft also runs the prompt's rows through the drafter (its prefill: 0.5 s
after 1,500 prompt tokens on a 2-core EPYC): no probe is started on a request's first cycle
(one plain cycle trims or drops those rows), and when a draft is chosen there, its time
feeds neither the drafter's step cost nor the trust.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from .costs import CostModel, predicted_speedup
from .policy import CHAIN, LOOKUP, PLAIN, PLAIN_PLAN, TREE, DraftPolicy, Plan
from .proposal import Proposal
from .suffix import Match, SuffixDraft, SuffixIndex

COST_CONTEXT_STEP = 64  # costs are taken at the context rounded down to this many tokens
#: the prior rate of a match of 8 or more tokens into this request's own text (copying), before
#: its bin has evidence (0.5 otherwise). Policy replay, scripts/bench_suffix.py's, geometric means
#: over the agent sessions, repeat, MT-bench second and first turns: 1.199, 1.180, 1.156, 0.984
#: with 0.5 against 1.238, 1.201, 1.172, 0.982 with 0.8
LONG_MATCH_PRIOR = 0.8
#: a match this long (extended backwards: 32 tokens) is a copy, whose draft breaks off at any depth
#: with about the same chance: its model keeps one rate for all depths, from every depth's
#: evidence, so a copy's deep positions are not stuck near the prior while only short drafts were
#: taken. Policy replay (scripts/bench_suffix.py's), geometric means, per-depth rates -> one:
#: agent sessions 1.439 -> 1.445, repeat 1.179 -> 1.194, MT-bench second turns 1.220 -> 1.238,
#: first turns 0.996 -> 0.996; not used to choose it: HumanEval 1.121 -> 1.121, other selections
#: of first and second turns 1.004 -> 1.004 and 1.149 -> 1.152 (16 and up: 1.436, 1.194, 1.217)
POOLED_MATCH = 32


@dataclass
class AcceptanceModel:
    """Conditional acceptance rate per draft position: exponentially decayed hit counts
    (memory ~1/alpha observations) smoothed towards `prior` with weight `prior_weight`."""

    k_max: int
    alpha: float = 0.03
    prior: float = 0.5
    prior_weight: float = 1.0
    #: a position never observed borrows the deepest observed one's rate (else: the prior)
    borrow: bool = True
    #: one rate for every position, from all positions' counts (a copy breaks off at any
    #: position with about the same chance)
    pooled: bool = False
    hits: list[float] = field(default_factory=list)
    seen: list[float] = field(default_factory=list)
    #: every position's rate, kept until the next observation (the controller reads them each cycle)
    _rates: list[float] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.hits = [0.0] * self.k_max
        self.seen = [0.0] * self.k_max

    def observe(self, drafted: int, accepted: int) -> None:
        # position i (0-based) is observed iff all before it were accepted
        for i in range(min(drafted, accepted + 1, self.k_max)):
            self.hits[i] = (1 - self.alpha) * self.hits[i] + (1.0 if i < accepted else 0.0)
            self.seen[i] = (1 - self.alpha) * self.seen[i] + 1.0
        self._rates = None

    def _rate(self, i: int) -> float:
        while self.borrow and i > 0 and not self.seen[i]:
            i -= 1
        return (self.hits[i] + self.prior * self.prior_weight) / (self.seen[i] + self.prior_weight)

    def _table(self) -> list[float]:
        rates = self._rates
        if rates is None:
            if self.pooled:
                rate = (sum(self.hits) + self.prior * self.prior_weight) / (sum(self.seen) + self.prior_weight)
                rates = self._rates = [rate] * self.k_max
            else:
                rates = self._rates = [self._rate(i) for i in range(self.k_max)]
        return rates

    def rate(self, i: int) -> float:
        """Position i's rate; a position never drafted yet borrows the deepest observed one's,
        so a drafter that is always right is allowed to draft deeper."""
        return self._table()[i]

    @property
    def rates(self) -> list[float]:
        return list(self._table())

    def expected_tokens(self, k: int) -> float:
        total, reach = 1.0, 1.0
        for r in self._table()[:k]:
            reach *= r
            total += reach
        return total


@dataclass
class KController(DraftPolicy):
    k_max: int = 8
    probe_every: int = 128  # plain cycles between probes; doubles after each rejected probe ...
    probe_max: int = 1024  # ... up to this, and falls back after an accepted one
    idle_window: int = 16  # rows of context the drafter keeps while decoding is plain
    margin: float = 0.03  # speculate only if the model predicts a gain beyond its own noise
    reeval_every: int = 16
    _cached: int | None = None
    _since_eval: int = 0
    costs: CostModel = field(default_factory=CostModel)
    acceptance: AcceptanceModel | None = None
    _plain_run: int = 0
    _probe_gap: int = 0  # current gap between probes (0: probe_every)
    _probing: bool = False
    #: suffix lookup as a proposer (None: off): drafts at most lookup_max deep, trees of at most
    #: lookup_nodes nodes and lookup_paths root-to-leaf paths (1: chains only)
    lookup: SuffixIndex | None = None
    lookup_max: int = 8
    lookup_nodes: int = 12
    lookup_paths: int = 1
    lookup_alpha: float = 0.1  # copying starts and ends abruptly: a short memory
    #: tree node budgets this controller may choose (empty: chains only)
    tree_sizes: tuple[int, ...] = ()
    tree_alpha: float = 0.1
    #: (match-length bin, from the history, split) -> its acceptance model
    _lookup_models: dict[tuple[int, bool, bool], AcceptanceModel] = field(default_factory=dict)
    #: the last plan's lookup in this request: (n, committed length, its match, split)
    _shadow: tuple[int, int, Match, bool] | None = None
    _answer_start: int | None = None  # this request's prompt length (its first plan's tokens)
    #: the next plan is the request's first: a draft then also runs the prompt's rows through the
    #: drafter, so its time says nothing of a draft step's (nor of the cost model's honesty)
    _first: bool = False
    _last_first: bool = False
    _tree_tokens: dict[int, float] = field(default_factory=dict)  # N -> EMA of tokens per tree cycle
    _tree_draft_s: dict[int, float] = field(default_factory=dict)  # N -> EMA of drafting seconds per tree
    #: (N, predicted speedup, cost) per tree budget, re-costed when choose() re-evaluates the chain
    #: (new evidence, a new context step, every reeval_every cycles) or a tree cycle reports
    _trees: list[tuple[int, float, float]] | None = None
    _last: Plan = PLAIN_PLAN
    #: predicted / observed cycle time of recent speculative cycles (median; capped at 1): the
    #: cost model's honesty. Speculative gains are multiplied by it, so drafts whose costs were
    #: believed too low lose to plain decoding within a few cycles
    _trust_seen: deque = field(default_factory=lambda: deque(maxlen=5))
    trust: float = 1.0
    _last_cost: float = 0.0  # the plan's predicted cycle cost, in single-token steps
    #: a cost observed this far beyond its prediction says the calibration is wrong: re-measure
    suspect_factor: float = 1.5
    suspect: bool = False

    def __post_init__(self) -> None:
        if self.acceptance is None:
            self.acceptance = AcceptanceModel(self.k_max)

    def recalibrated(self) -> None:
        """The batch costs were measured again: the old predictions' scores no longer apply."""
        self._trust_seen.clear()
        self.trust, self.suspect = 1.0, False
        self._cached = None

    def begin(self) -> None:
        self._shadow = None  # a lookup made for the last request's tokens says nothing of this one's
        self._answer_start = None
        self._first = True

    def speedup(self, k: int) -> float:
        assert self.acceptance is not None
        return predicted_speedup(self.acceptance.expected_tokens(k), k, self.costs.c(k + 1), self.costs.d())

    def best_k(self) -> int:
        """argmax_k E(k)/C(k); plain decoding unless the best, times the trust, beats it by `margin`."""
        best = max(range(self.k_max + 1), key=self.speedup)
        return best if self.speedup(best) * self.trust >= 1.0 + self.margin else 0

    def choose(self) -> int:
        # re-decide after new acceptance evidence, else every `reeval_every` cycles
        if self._cached is None or self._since_eval >= self.reeval_every:
            self._cached, self._since_eval = self.best_k(), 0
            self._trees = None  # the tree budgets are re-costed on the same schedule
        self._since_eval += 1
        best = self._cached
        if best == 0:
            self._plain_run += 1
            # not on a request's first cycle: the drafter would run the whole prompt's rows first
            # (0.5 s after 1,500 tokens on a 2-core EPYC); a plain cycle trims them or drops them
            if self._plain_run >= self.probe_gap and not self._first:
                self._plain_run = 0
                self._probing = True
                return 1  # a cheap probe keeps the acceptance estimate alive
        else:
            self._plain_run = 0
        return best

    def drafting_soon(self, within: int) -> bool:
        """Whether a draft (a speculative cycle or a probe) may come in the next `within`
        cycles: the loop captures target features (and feeds the drafter their rows) only then."""
        best = self._cached if self._cached is not None else self.best_k()
        return best > 0 or self._plain_run >= self.probe_gap - within

    def features_needed_soon(self) -> bool:
        """The DraftPolicy hook: a draft may come within the drafter's idle window."""
        return self.drafting_soon(self.idle_window)

    @property
    def probe_gap(self) -> int:
        return self._probe_gap or self.probe_every

    def _observe_cost(self, predicted: float, seconds: float) -> None:
        """Score the plan's predicted cycle cost against the observed one (speculative cycles)."""
        one = self.costs.step_s()
        if not one or predicted <= 0 or seconds <= 0:
            return
        ratio = predicted * one / seconds
        self._trust_seen.append(ratio)
        ordered = sorted(self._trust_seen)
        self.trust = min(1.0, ordered[len(ordered) // 2])
        if len(ordered) >= 2 and self.trust * self.suspect_factor < 1.0:
            self.suspect = True

    def update(self, drafted: int, accepted: int, verify_tokens: int, verify_s: float, draft_s: float) -> None:
        assert self.acceptance is not None
        self.costs.observe_verify(verify_tokens, verify_s)
        kind, last = self._last.kind, self._last
        self._last = PLAIN_PLAN
        catch_up = self._last_first  # the drafter also ran the prompt's rows: drafting time unknown
        if drafted and kind != PLAIN and not (catch_up and kind in (CHAIN, TREE)):
            self._observe_cost(self._last_cost, verify_s + draft_s)
        if kind == LOOKUP and drafted:
            return  # plan() scores the whole lookup (through the bonus token) against what was committed
        if kind == TREE and drafted:
            n = last.n
            for table, value in ((self._tree_tokens, 1.0 + accepted), (self._tree_draft_s, draft_s)):
                if catch_up and table is self._tree_draft_s:
                    continue
                old = table.get(n)
                table[n] = value if old is None else old + self.tree_alpha * (value - old)
            self._trees = None
            return
        if not catch_up:
            self.costs.observe_draft(drafted, draft_s)
        if drafted:
            self.acceptance.observe(drafted, accepted)
            self._cached = None
            if self._probing:  # back off while probes keep failing: they cost ~1-2% each round
                self._probe_gap = self.probe_every if accepted else min(self.probe_max, 2 * self.probe_gap)
        self._probing = False

    # --- per-cycle proposer --------------------------------------------------------------------

    def _lookup_model(self, n: int, history: bool = False, split: bool = False) -> AcceptanceModel:
        """The model of matches of length n (in bins 1, 2, 3, 4-7, 8-15, ...) into this request's
        own text, or (history) only into earlier requests': a phrase another answer also used is
        weaker evidence than text this request is copying, and each kind learns apart; and apart
        again where the match's occurrences went on in different ways (split)."""
        n = 1 << (max(1, n).bit_length() - 1) if n > 3 else n
        key = (n, history, split)
        if key not in self._lookup_models:
            # a shadow lookup during plain decoding sees one position only. After a match of 4 or
            # more tokens (copying) deeper positions borrow its rate; after a short one they do
            # not: text that repeats a token or two does not repeat a whole draft. (A higher prior
            # for every long match, history included, measured 0.957x plain on MT-bench against
            # 0.991x live; the history's matches now learn apart and keep 0.5.)
            prior = LONG_MATCH_PRIOR if n >= 8 and not history else 0.5
            self._lookup_models[key] = AcceptanceModel(self.lookup_max, alpha=self.lookup_alpha, prior=prior,
                                                       borrow=n >= 4, pooled=n >= POOLED_MATCH)
        return self._lookup_models[key]

    def lookup_speedup(self, n: int, m: int, history: bool = False, split: bool = False) -> float:
        """Predicted speedup of an m-token lookup draft found by an n-gram match (no drafter cost)."""
        return predicted_speedup(self._lookup_model(n, history, split).expected_tokens(m), m, self.costs.c(m + 1), 0.0)

    def _best_suffix(self, draft: SuffixDraft, history: bool = False,
                     split: bool = False) -> tuple[Proposal, float, int]:
        """The suffix tree's best node set by predicted speedup: (its proposal, the speedup, m)."""
        model = self._lookup_model(draft.n, history, split)
        tokens, parents, shares = draft.proposal.tokens, draft.proposal.parents, draft.shares
        prob: list[float] = []
        top: dict[int, float] = {}  # parent -> its first (largest-share) child's share
        depth: list[int] = []
        for p, share in zip(parents, shares):
            d = 0 if p < 0 else depth[p] + 1
            depth.append(d)
            best = top.setdefault(p, share)
            prob.append((1.0 if p < 0 else prob[p]) * model.rate(d) * share / best)
        order = sorted(range(len(tokens)), key=lambda i: (-prob[i], i))  # parents before children
        c = self.costs.c_table(len(order) + 1)
        best_m, best_s, expected = 1, 0.0, 1.0
        for m, i in enumerate(order, start=1):
            expected += prob[i]
            s = expected / c[m + 1]
            if s > best_s:
                best_m, best_s = m, s
        keep = sorted(order[:best_m])  # depth-first order kept: the first-choice path first
        index = {old: new for new, old in enumerate(keep)}
        sub = Proposal(tuple(tokens[i] for i in keep), tuple(index[parents[i]] if parents[i] >= 0 else -1
                                                              for i in keep))
        return sub, best_s, best_m

    def _lookup_bound(self, n: int, history: bool = False, occurrences: int | None = None,
                      split: bool = False) -> float:
        """An upper bound of _best_suffix's speedup for any tree a match of length n can give: a
        node at depth d is worth at most the path model's reach there (its share of its first
        sibling is at most 1), and a tree of lookup_paths leaves has at most that many nodes a
        depth; nor more leaves than the match has occurrences (each continues one way)."""
        rates = self._lookup_model(n, history, split)._table()
        paths = max(1, min(self.lookup_paths, occurrences or self.lookup_paths))
        nodes = min(self.lookup_nodes, paths * self.lookup_max)
        c = self.costs.c_table(nodes + 1)
        best, expected, reach = 0.0, 1.0, 1.0
        for m in range(1, nodes + 1):
            if (m - 1) % paths == 0:
                reach *= rates[(m - 1) // paths]
            expected += reach
            s = expected / c[m + 1]
            if s > best:
                best = s
        return best

    def tree_speedup(self, n: int) -> float:
        return self._tree_prediction(n)[0]

    def _tree_prediction(self, n: int) -> tuple[float, float]:
        """(predicted speedup, predicted cost in single-token steps) of a tree of n nodes."""
        assert self.acceptance is not None
        expected = self._tree_tokens.get(n, self.acceptance.expected_tokens(min(n, self.k_max)))
        one = self.costs.step_s()
        if n in self._tree_draft_s and one:
            draft = self._tree_draft_s[n] / one
        else:  # before a tree was drafted: one drafter step per depth, about log2 of the budget
            draft = self.costs.d() * max(1, n.bit_length())
        cost = self.costs.c(n + 1) + draft
        return expected / cost, cost

    def plan(self, tokens: Sequence[int]) -> Plan:
        """This cycle's proposer, from the committed tokens: the best predicted of plain decoding,
        a chain (choose(), with its probes), a prompt-lookup draft and the tree budgets, each
        costed at this cycle's context."""
        context = len(tokens) - len(tokens) % COST_CONTEXT_STEP
        if self.costs.context != context:
            self.costs.context = context
            if self.costs.slope_s:
                self._cached = None  # the best k moves with the context's costs
        if self._shadow is not None and len(tokens) > self._shadow[1]:  # score the last cycle's lookup
            n, length, last_match, split = self._shadow                   # against what it committed
            new = list(tokens[length:])
            assert self.lookup is not None  # the lookup's first-choice path, as deep as the cycle committed
            draft = self.lookup.first_path(last_match, min(self.lookup_max, len(new)))
            seen = min(len(draft), len(new))
            hits = 0
            while hits < seen and draft[hits] == new[hits]:
                hits += 1
            if seen:
                self._lookup_model(n, last_match.from_history, split).observe(seen, hits)
        self._shadow = None
        k = self.choose()
        self._last_first, self._first = self._first, False
        trust = self.trust
        best, gain = (Plan.of(k), self.speedup(k) * trust) if k else (PLAIN_PLAN, 1.0)
        cost = self.costs.cost(k) if k else 0.0
        if self._probing:
            gain = 1.0 + self.margin  # a probe runs unless another proposer predicts a real gain
        if self._answer_start is None:
            self._answer_start = len(tokens)
        match = self.lookup.match(tokens) if self.lookup is not None else None
        if match is not None:
            assert self.lookup is not None
            cap = len(tokens) - self._answer_start + 1  # the template before the answer is no copying
            # a short match is not extended, so its model is known before the tree: when no tree
            # from it can win, the tree is not built (the shadow needs only the match)
            n, history, split = min(match.n, cap), match.from_history, self.lookup.split(match)
            if (match.n == self.lookup.max_ngram
                    or self._lookup_bound(n, history, len(match.occ), split) * trust > max(gain, 1.0 + self.margin)):
                found = self.lookup.tree(match, self.lookup_max, self.lookup_nodes, self.lookup_paths)
                n = min(found.n, cap)  # a longest-length match was extended backwards
                if len(found.proposal):
                    proposal, s, m = self._best_suffix(SuffixDraft(n, found.proposal, found.shares), history, split)
                    if s * trust > max(gain, 1.0 + self.margin):
                        best, gain = Plan(LOOKUP, m, proposal), s * trust
                        cost = self.costs.c(m + 1)
            self._shadow = (n, len(tokens), match, split)
        if self._trees is None:
            self._trees = [(n, *self._tree_prediction(n)) for n in self.tree_sizes]
        for n, s, tree_cost in self._trees:
            if s * trust > max(gain, 1.0 + self.margin):
                best, gain, cost = Plan(TREE, n), s * trust, tree_cost
        if best.kind != CHAIN and self._probing:
            self._probing = False
            self._plain_run = 0
        self._last, self._last_cost = best, cost
        return best

