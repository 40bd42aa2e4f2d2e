"""Choosing the draft length for each cycle ("auto" k): never slower than plain decoding.

The expected tokens of a cycle drafting k tokens are E(k) = 1 + sum_{i<=k} prod_{j<=i} r_j,
with r_j the running conditional acceptance rate of draft position j; its cost, in units
of one single-token target decode, is C(k) = c(k+1) + k*d, with c(n) the target's batch
cost relative to n = 1 and d the drafter's step cost. The controller picks the k in
0..k_max that maximises E(k)/C(k); k = 0 (plain decoding, E = C = 1) wins unless some k
beats it. Costs are measured at start-up and then tracked online (costs.py owns the
formulas); while it decodes plainly it probes one short draft every `probe_every` cycles so
acceptance stays current. KController is a policy.DraftPolicy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .costs import CostModel, predicted_speedup


@dataclass
class AcceptanceModel:
    """Conditional acceptance rate per draft position: exponentially decayed hit counts
    (memory ~1/alpha observations) smoothed towards `prior` with weight `prior_weight`."""

    k_max: int
    alpha: float = 0.03
    prior: float = 0.5
    prior_weight: float = 1.0
    hits: list[float] = field(default_factory=list)
    seen: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.hits = [0.0] * self.k_max
        self.seen = [0.0] * self.k_max

    def observe(self, drafted: int, accepted: int) -> None:
        # position i (0-based) is observed iff all before it were accepted
        for i in range(min(drafted, accepted + 1, self.k_max)):
            self.hits[i] = (1 - self.alpha) * self.hits[i] + (1.0 if i < accepted else 0.0)
            self.seen[i] = (1 - self.alpha) * self.seen[i] + 1.0

    def rate(self, i: int) -> float:
        """Position i's rate; a position never drafted yet borrows the deepest observed one's,
        so a drafter that is always right is allowed to draft deeper."""
        while i > 0 and not self.seen[i]:
            i -= 1
        return (self.hits[i] + self.prior * self.prior_weight) / (self.seen[i] + self.prior_weight)

    @property
    def rates(self) -> list[float]:
        return [self.rate(i) for i in range(self.k_max)]

    def expected_tokens(self, k: int) -> float:
        total, reach = 1.0, 1.0
        for i in range(k):
            reach *= self.rate(i)
            total += reach
        return total


@dataclass
class KController:
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

    def __post_init__(self) -> None:
        if self.acceptance is None:
            self.acceptance = AcceptanceModel(self.k_max)

    def speedup(self, k: int) -> float:
        assert self.acceptance is not None
        return predicted_speedup(self.acceptance.expected_tokens(k), k, self.costs.c(k + 1), self.costs.d())

    def best_k(self) -> int:
        """argmax_k E(k)/C(k); plain decoding unless the best beats it by `margin`."""
        best = max(range(self.k_max + 1), key=self.speedup)
        return best if self.speedup(best) >= 1.0 + self.margin else 0

    def choose(self) -> int:
        # re-decide after new acceptance evidence, else every `reeval_every` cycles
        if self._cached is None or self._since_eval >= self.reeval_every:
            self._cached, self._since_eval = self.best_k(), 0
        self._since_eval += 1
        best = self._cached
        if best == 0:
            self._plain_run += 1
            if self._plain_run >= self.probe_gap:
                self._plain_run = 0
                self._probing = True
                return 1  # a cheap probe keeps the acceptance estimate alive
        else:
            self._plain_run = 0
        return best

    def drafting_soon(self, within: int) -> bool:
        """Whether a draft (a speculative cycle or a probe) may come in the next `within`
        cycles: the loop captures target features, which cost a few percent per token, only then."""
        best = self._cached if self._cached is not None else self.best_k()
        return best > 0 or self._plain_run >= self.probe_gap - within

    def features_needed_soon(self) -> bool:
        """The DraftPolicy hook: a draft may come within the drafter's idle window."""
        return self.drafting_soon(self.idle_window)

    @property
    def probe_gap(self) -> int:
        return self._probe_gap or self.probe_every

    def update(self, drafted: int, accepted: int, verify_tokens: int, verify_s: float, draft_s: float) -> None:
        assert self.acceptance is not None
        self.costs.observe_verify(verify_tokens, verify_s)
        self.costs.observe_draft(drafted, draft_s)
        if drafted:
            self.acceptance.observe(drafted, accepted)
            self._cached = None
            if self._probing:  # back off while probes keep failing: they cost ~1-2% each round
                self._probe_gap = self.probe_every if accepted else min(self.probe_max, 2 * self.probe_gap)
        self._probing = False
